// Placement: which device each rank of the job runs on and which backend each of its groups uses
// (docs/design.md §2). A pure function of the request and the topology, the same on every rank, so
// every rank agrees on every group's backend without talking; unit-tested without a GPU.
//
// Devices. On CPU every rank is "cpu". On CUDA local rank l (infer ranks [0, I), then train ranks
// [I, I + T)) runs on GPU device_map[l], or on l mod device_count without a map: "cuda:N". Its
// engine (infer rank) or trainer (train rank) lives there.
//
// Backends. The world, infer and sync groups (control, prompt sharding, the rollout transport's
// packed micro-batches: CPU tensors) are always Gloo. The train group (gradient all-reduce) and
// each sync_root group (weight bucket broadcasts) carry CUDA tensors; on CUDA, within a node, a
// group's members are either
//   - on distinct GPUs: NCCL (with --comm-backend auto or nccl), or
//   - all on one GPU: Gloo (NCCL cannot hold two ranks of one communicator on one device); a
//     sync_root group's weights then go through CUDA IPC (WeightSync compares its members' GPUs),
//     the train group's collectives through c10d's Gloo, which stages CUDA tensors through host
//     memory.
// Anything in between (some members share a GPU, others do not) is an error naming the group, its
// ranks and their GPUs.
//
// Colocation (--colocate auto|on|off) picks the weight-sync layout (sync/groups.h): paired, each
// engine fed by the trainer beside it, or fan-out, each trainer feeding every engine of its node.
// auto pairs them where each GPU holds one engine and one trainer (I == T, infer rank t and train
// rank t on one GPU, the pairs on distinct GPUs: `--gpus-infer N --gpus-train N` on N GPUs), and
// fans out everywhere else, the CPU included; on pairs them (I == T) wherever they run; off fans
// out (and so refuses N + N on N GPUs: every fan-out group would mix shared and distinct GPUs).
// Ranks on different nodes never share a GPU. --comm-backend gloo makes every group Gloo;
// --comm-backend nccl makes a group NCCL-or-error.
#pragma once

#include <string>
#include <vector>

#include "sync/groups.h"

namespace crl::sync {

enum class DeviceKind { kCpu, kCuda };
// "cpu" or "cuda" (--device); anything else is std::invalid_argument naming the flag.
DeviceKind parse_device_kind(const std::string& s);
const char* device_kind_name(DeviceKind k);

// "0,0,1,1" -> {0, 0, 1, 1} (--device-map): comma-separated non-negative GPU indices; an empty or
// malformed entry is std::invalid_argument naming the flag. "" -> {} (no map).
std::vector<int> parse_device_map(const std::string& s);

struct PlacementRequest {
  // --device.
  DeviceKind kind = DeviceKind::kCpu;
  // --device-map: the GPU index of each local rank, infer ranks first, then train ranks (I + T
  // entries); empty: local rank mod device_count. CUDA only.
  std::vector<int> device_map;
  // CUDA devices visible on each node (kCuda needs >= 1).
  int device_count = 0;
  // --comm-backend: auto, gloo or nccl.
  std::string comm_backend = "auto";
  // --colocate: auto, on or off.
  std::string colocate = "auto";
  // --infer-tp: the ranks of each engine's tensor-parallel group (threads of the infer rank's
  // process). On CUDA infer rank i's engine spans GPUs [i·N, (i+1)·N) (its group's leader on the
  // first) and train rank t runs on GPU I·N + t: no GPU holds two of them, and no --device-map.
  int infer_tp = 1;
};

// One rank's share of a placement.
struct RankPlacement {
  int world_rank = 0;
  Role role = Role::kInfer;
  int gpu = -1;               // CUDA device index; -1 on CPU
  std::string device;         // "cpu" or "cuda:N": the engine's (infer) or the trainer's (train)
  std::string train_backend;  // "gloo" or "nccl" on train ranks; "" on infer ranks
  // Index t: the backend of the node's sync_root group of train rank t when this rank is a member
  // (infer rank i: every t fan-out, t == i paired; train rank t: its own), "" otherwise.
  std::vector<std::string> sync_root_backends;
};

struct Placement {
  Topology topo;
  DeviceKind kind = DeviceKind::kCpu;
  int device_count = 0;           // as requested (CUDA)
  bool from_map = false;          // --device-map given
  std::vector<int> gpu_of_local;  // by local rank; empty on CPU (infer: its engine's first GPU)
  int infer_tp = 1;               // ranks of each engine's tensor-parallel group
  // "gloo" or "nccl": the train group, and the sync_root group of train rank t on every node
  // (every node has the same layout).
  std::string train_backend = "gloo";
  std::vector<std::string> sync_root_backends;

  // This rank's device and groups.
  RankPlacement rank(int world_rank) const;
  // The backends as make_groups takes them.
  GroupBackends group_backends() const;
  bool any_nccl() const;
  // The table world rank 0 prints at start: one row per rank of node 0 (every node is laid out
  // the same), with its role, device and the backend of its train and sync_root groups.
  std::string table() const;
};

// Whether --colocate (auto, on or off) pairs the engines with the trainers, given the GPU of each
// local rank (empty on the CPU). Throws std::invalid_argument for another value, or on with I != T.
bool colocate_pairs(const std::string& colocate, const Topology& topo,
                    const std::vector<int>& gpu_of_local);

// Throws std::invalid_argument naming the flag (--device, --device-map, --comm-backend, --colocate)
// and, for a
// group that can be neither NCCL nor Gloo-on-one-GPU, its ranks and their GPUs.
Placement plan_placement(const Topology& topo, const PlacementRequest& request);

}  // namespace crl::sync
