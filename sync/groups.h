// Rendezvous and the job's groups: world, train, infer and the node-local sync groups
// (docs/design.md §2).
//
// Rank layout: world rank = node * (I + T) + local rank; local ranks [0, I) are infer ranks and
// [I, I + T) train ranks, so training and generation share every node.
//
//   world      every rank
//   train      every train rank (gradient all-reduce)
//   infer      every infer rank (engine collectives, prompt sharding)
//   sync       one per node: the node's T train + I infer ranks (rollout transport)
//   sync_root  one per node and train rank t: {train t, the infer ranks it feeds}, the train rank
//              is group rank 0. Two layouts (Topology::paired, chosen by sync/placement.h):
//                fan-out  train t feeds every infer rank of its node and sends its share of the
//                         buckets (fan_out_senders: about 1/T of the bytes each), so the node's
//                         train ranks send in parallel;
//                paired   (I == T) train t feeds infer rank t alone and sends it every bucket: an
//                         engine and a trainer sharing a GPU are one pair, its weights never
//                         leave that GPU, and no pair waits on another.
//              Either way no weight byte crosses nodes.
//   lanes      (Topology::lanes N > 1: the engines are tensor-parallel groups of N ranks, threads
//   of
//              the infer rank's process) each sync_root group made N times over, lane r feeding
//              rank r of every engine's group its slices (sync/weight_sync.h), so each engine rank
//              receives its share of the model and no rank the whole.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "sync/communicator.h"
#include "sync/dist_env.h"
#include "sync/store.h"

namespace crl::sync {

enum class Role { kInfer, kTrain };
const char* role_name(Role r);

struct Topology {
  int nnodes = 1;
  int infer_per_node = 1;
  int train_per_node = 1;
  // The weight-sync layout above: paired (needs infer_per_node == train_per_node) or fan-out.
  bool paired = false;
  // Communicators per sync_root group (the lanes above); 1 without tensor-parallel lanes.
  int lanes = 1;

  int ranks_per_node() const { return infer_per_node + train_per_node; }
  int world_size() const { return nnodes * ranks_per_node(); }
  int node_of(int world_rank) const { return world_rank / ranks_per_node(); }
  int local_of(int world_rank) const { return world_rank % ranks_per_node(); }
  Role role_of(int world_rank) const {
    return local_of(world_rank) < infer_per_node ? Role::kInfer : Role::kTrain;
  }
  // Index among the node's train (or infer) ranks.
  int role_index(int world_rank) const {
    int l = local_of(world_rank);
    return l < infer_per_node ? l : l - infer_per_node;
  }
  // "rank 5 (node 1, train 0)".
  std::string describe(int world_rank) const;

  // Weight-sync routing, by index among the node's train (t) and infer (i) ranks.
  std::vector<int> receivers_of(int t) const;  // the infer ranks train rank t feeds
  std::vector<int> senders_of(int i) const;    // the train ranks that feed infer rank i
  // `senders`: fan_out_senders of the layout's buckets (fan-out; unused when paired).
  bool sends(int t, int64_t bucket, const std::vector<int>& senders) const;
  // The train rank infer rank i gets `bucket` from.
  int sender_of(int64_t bucket, int i, const std::vector<int>& senders) const;
  // "fan-out" or "paired"; check_layout() throws std::invalid_argument when paired and I != T.
  const char* layout_name() const { return paired ? "paired" : "fan-out"; }
  void check_layout() const;
};

// The fan-out layout's sender of each bucket (by index) among a node's `train_ranks`: the largest
// bucket first (ties: the lower index), each to the rank with the fewest bytes so far (ties: the
// lower rank). Every rank's share is within one bucket of the others', and every rank computes the
// same from the same layout. (Round robin, b mod T, gave one rank a layer's small attention
// buckets and the others its MLP matrices: 7.5 against 18.3 GiB of Qwen2.5-32B at T = 4.)
std::vector<int> fan_out_senders(const std::vector<int64_t>& bucket_bytes, int train_ranks);

// The rendezvous: connects to the store, announces this rank and waits until every rank has
// (deadline `timeout`: the error names the ranks that never joined), then builds the world
// communicator with `backend` ("gloo", or "nccl" where built).
struct World {
  StorePtr store;
  RankEnv env;
  std::unique_ptr<Communicator> comm;
};
World join_world(const RankEnv& env, std::chrono::milliseconds timeout,
                 const std::string& backend = "gloo");

struct Groups {
  Topology topo;
  int world_rank = 0;
  Role role = Role::kInfer;
  int node = 0;
  std::unique_ptr<Communicator> world;
  std::unique_ptr<Communicator> train;  // null on infer ranks
  std::unique_ptr<Communicator> infer;  // null on train ranks
  std::unique_ptr<Communicator> sync;
  // Index t: the node's sync_root group of train rank t; on a train rank only its own is set.
  std::vector<std::unique_ptr<Communicator>> sync_roots;
  // Index [lane - 1][t]: lane `lane`'s copy of sync_roots[t] (topo.lanes > 1), set as sync_roots.
  std::vector<std::vector<std::unique_ptr<Communicator>>> lane_roots;

  // sync_roots[t] for lane 0, else lane_roots[lane - 1][t]; null where this rank is no member.
  Communicator* sync_root(int t, int lane = 0) const;
};

// The backend of the groups that may carry CUDA tensors (the train and sync_root groups; see
// sync/placement.h for how the RL job picks them). "" or the world's backend: split from the world
// (Gloo in the RL job). Another backend ("nccl"): the group gets a communicator of its own, made
// from its membership as the topology defines it -- one cannot split a Gloo world into NCCL, and an
// NCCL world cannot exist when two ranks share a GPU.
struct GroupBackends {
  std::string train;
  std::vector<std::string> sync_roots;  // index t: the sync_root group of train rank t (any node)

  const std::string& sync_root(int t) const;
};

// Makes a group's own communicator; every member calls it with the same `prefix` (unique per
// group) and its own `info`. make_groups' default makes "nccl" groups with make_nccl_communicator
// (on the calling thread's current CUDA device); tests make Gloo ones to check membership and
// order.
using CommFactory = std::function<std::unique_ptr<Communicator>(
    const std::string& backend, const std::string& prefix, GroupInfo info)>;

// The membership of the train group (every train rank, by world rank) and of the sync_root group of
// train rank t on `node` (the train rank first, then the node's infer ranks): what split() makes.
GroupInfo train_group_info(const Topology& topo, int world_rank, std::chrono::milliseconds timeout);
GroupInfo sync_root_group_info(const Topology& topo, int node, int t, int world_rank,
                               std::chrono::milliseconds timeout);

// Splits `world` into the groups above. Collective over the world. Groups whose backend (in
// `backends`) is not the world's are made afterwards by `make_own` (default: NCCL over `store`):
// the train group first, then the sync_root groups in train-rank order, each by its members only.
// Lanes are split from the world's backend only: std::invalid_argument when topo.lanes > 1 and a
// sync_root group has a backend of its own.
Groups make_groups(std::unique_ptr<Communicator> world, const Topology& topo,
                   const GroupBackends& backends = {}, const StorePtr& store = StorePtr(),
                   const CommFactory& make_own = nullptr);

}  // namespace crl::sync
