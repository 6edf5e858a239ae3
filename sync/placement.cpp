#include "sync/placement.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <set>
#include <stdexcept>

#include "common/check.h"

namespace crl::sync {
namespace {

std::string cuda_name(int gpu) { return fmt::format("cuda:{}", gpu); }

// Where the GPUs came from, for errors: the flag the user would change.
std::string gpu_source(const Placement& p) {
  if (p.from_map) return fmt::format("--device-map {}", fmt::join(p.gpu_of_local, ","));
  return fmt::format("--device cuda (GPU = local rank mod {})", p.device_count);
}

// The backend of a group whose members on one node are the local ranks `locals` (members on other
// nodes sit on other GPUs). Throws when some of them share a GPU and others do not.
std::string group_backend(const Placement& p, const std::string& what, const std::string& name,
                          const std::vector<int>& locals, const std::string& comm_backend) {
  std::set<int> gpus;
  for (int l : locals) gpus.insert(p.gpu_of_local[l]);
  const bool distinct = gpus.size() == locals.size();
  const bool one_gpu = gpus.size() == 1;
  auto members = [&] {
    std::vector<std::string> m;
    for (int l : locals)
      m.push_back(fmt::format("{} on {}", p.topo.describe(l), cuda_name(p.gpu_of_local[l])));
    return fmt::format("{}", fmt::join(m, ", "));
  };
  if (!distinct && !one_gpu) {
    CRL_INVALID(gpu_source(p), ": ", what, " (", name, ") has ", members(),
                ": some members share a GPU and others do not. NCCL needs every member on its own "
                "GPU and the one-GPU path (Gloo, weights through CUDA IPC) needs them all on one; "
                "give the group distinct GPUs or a single one (--device-map)",
                p.topo.paired ? ""
                              : "; an engine and a trainer on each GPU need --colocate auto or on "
                                "(each engine then gets its weights from the trainer beside it)");
  }
  if (comm_backend == "gloo") return "gloo";
  if (distinct) return "nccl";
  if (comm_backend == "nccl") {
    CRL_INVALID("--comm-backend nccl: ", what, " (", name, ") has ", members(),
                ": NCCL cannot hold two ranks of one communicator on one GPU; use --comm-backend "
                "auto (Gloo there, weights through CUDA IPC) or give them distinct GPUs "
                "(--device-map)");
  }
  return "gloo";
}

}  // namespace

DeviceKind parse_device_kind(const std::string& s) {
  if (s == "cpu") return DeviceKind::kCpu;
  if (s == "cuda") return DeviceKind::kCuda;
  CRL_INVALID("--device must be cpu or cuda, got '", s,
              "' (a rank's GPU comes from --device-map or its local rank)");
}

const char* device_kind_name(DeviceKind k) { return k == DeviceKind::kCuda ? "cuda" : "cpu"; }

std::vector<int> parse_device_map(const std::string& s) {
  std::vector<int> out;
  if (s.empty()) return out;
  size_t start = 0;
  while (true) {
    size_t comma = s.find(',', start);
    std::string item =
        s.substr(start, comma == std::string::npos ? std::string::npos : comma - start);
    size_t used = 0;
    int v = -1;
    try {
      v = std::stoi(item, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (item.empty() || used != item.size() || v < 0) {
      CRL_INVALID("--device-map '", s, "': entry ", out.size(), " ('", item,
                  "') is not a GPU index (comma-separated integers >= 0, one per local rank, "
                  "infer ranks first, e.g. 0,0 or 0,1,2,3)");
    }
    out.push_back(v);
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  return out;
}

bool colocate_pairs(const std::string& colocate, const Topology& topo,
                    const std::vector<int>& gpu_of_local) {
  if (colocate != "auto" && colocate != "on" && colocate != "off") {
    CRL_INVALID("--colocate must be auto, on or off, got '", colocate, "'");
  }
  const int I = topo.infer_per_node, T = topo.train_per_node;
  if (colocate == "on" && I != T) {
    CRL_INVALID(
        "--colocate on pairs each engine with one trainer: it needs --gpus-infer == "
        "--gpus-train, got ",
        I, " + ", T);
  }
  if (colocate != "auto") return colocate == "on";
  if (I != T || gpu_of_local.empty()) return false;
  std::set<int> pair_gpus;
  for (int t = 0; t < T; ++t) {
    if (gpu_of_local.at(t) != gpu_of_local.at(I + t)) return false;
    pair_gpus.insert(gpu_of_local[t]);
  }
  return static_cast<int>(pair_gpus.size()) == T;
}

Placement plan_placement(const Topology& topo, const PlacementRequest& req) {
  const std::string& cb = req.comm_backend;
  if (cb != "auto" && cb != "gloo" && cb != "nccl") {
    CRL_INVALID("--comm-backend must be auto, gloo or nccl, got '", cb, "'");
  }
  Placement p;
  p.topo = topo;
  p.topo.paired = colocate_pairs(req.colocate, topo, {});
  p.kind = req.kind;
  p.device_count = req.device_count;
  p.from_map = !req.device_map.empty();
  p.infer_tp = req.infer_tp;
  const int per_node = topo.ranks_per_node();
  const int T = topo.train_per_node;
  if (req.kind == DeviceKind::kCpu) {
    if (p.from_map) {
      CRL_INVALID("--device-map needs --device cuda (on --device cpu every rank runs on the CPU)");
    }
    if (cb == "nccl") CRL_INVALID("--comm-backend nccl needs --device cuda");
    p.train_backend = "gloo";
    p.sync_root_backends.assign(T, "gloo");
    // Tensor-parallel engines take their slices over lanes of their own (Gloo). On GPUs they
    // still take the whole buckets on the leader (a lane per GPU over NCCL is not built).
    p.topo.lanes = req.infer_tp;
    return p;
  }
  if (req.device_count < 1) {
    CRL_INVALID(
        "--device cuda: no CUDA device is usable here (a libtorch built without CUDA, no "
        "GPU, or CUDA_VISIBLE_DEVICES hides them); use --device cpu");
  }
  const int N = req.infer_tp;
  if (N > 1) {
    if (p.from_map) {
      CRL_INVALID("--device-map with --infer-tp ", N,
                  ": tensor-parallel engines take their GPUs in order (engine i on GPUs i*", N,
                  ".., then the trainers); drop --device-map");
    }
    const int need = topo.infer_per_node * N + T;
    if (need > req.device_count) {
      CRL_INVALID("--gpus-infer ", topo.infer_per_node, " engines x --infer-tp ", N,
                  " GPUs each + --gpus-train ", T, " = ", need, " GPUs, but this node has ",
                  req.device_count, " (a tensor-parallel engine shares no GPU)");
    }
    for (int i = 0; i < topo.infer_per_node; ++i) p.gpu_of_local.push_back(i * N);
    for (int t = 0; t < T; ++t) p.gpu_of_local.push_back(topo.infer_per_node * N + t);
  }
  if (p.from_map) {
    if (static_cast<int>(req.device_map.size()) != per_node) {
      CRL_INVALID("--device-map has ", req.device_map.size(), " entries but --gpus-infer ",
                  topo.infer_per_node, " + --gpus-train ", T, " = ", per_node,
                  " local ranks need one each (the GPU of each local rank, infer ranks first)");
    }
    for (int l = 0; l < per_node; ++l) {
      int gpu = req.device_map[l];
      if (gpu < 0 || gpu >= req.device_count) {
        CRL_INVALID("--device-map entry ", l, " (local rank ", l, ", ", role_name(topo.role_of(l)),
                    " ", topo.role_index(l), ") is GPU ", gpu, " but this node has ",
                    req.device_count, " CUDA device(s) (0..", req.device_count - 1, ")");
      }
    }
    p.gpu_of_local = req.device_map;
  } else if (N == 1) {
    for (int l = 0; l < per_node; ++l) p.gpu_of_local.push_back(l % req.device_count);
  }
  p.topo.paired = colocate_pairs(req.colocate, topo, p.gpu_of_local);
  // The train group: on each node its T train ranks (ranks on other nodes never share a GPU).
  std::vector<int> train_locals;
  for (int t = 0; t < T; ++t) train_locals.push_back(topo.infer_per_node + t);
  p.train_backend = group_backend(p, "the train group", "train", train_locals, cb);
  for (int t = 0; t < T; ++t) {
    std::vector<int> locals{topo.infer_per_node + t};
    for (int i : p.topo.receivers_of(t)) locals.push_back(i);
    p.sync_root_backends.push_back(
        group_backend(p, fmt::format("the sync_root group of train rank {}", t),
                      fmt::format("sync.node0.root{}", t), locals, cb));
  }
  return p;
}

RankPlacement Placement::rank(int world_rank) const {
  CRL_CHECK(world_rank >= 0 && world_rank < topo.world_size(), "rank ", world_rank,
            " outside a world of ", topo.world_size());
  RankPlacement r;
  r.world_rank = world_rank;
  r.role = topo.role_of(world_rank);
  const int local = topo.local_of(world_rank);
  if (kind == DeviceKind::kCuda) {
    r.gpu = gpu_of_local.at(local);
    r.device = cuda_name(r.gpu);
  } else {
    r.device = "cpu";
  }
  const int T = topo.train_per_node;
  r.sync_root_backends.assign(T, "");
  if (r.role == Role::kTrain) {
    const int t = topo.role_index(world_rank);
    r.train_backend = train_backend;
    r.sync_root_backends[t] = sync_root_backends.at(t);
  } else {
    for (int t : topo.senders_of(topo.role_index(world_rank))) {
      r.sync_root_backends[t] = sync_root_backends.at(t);
    }
  }
  return r;
}

GroupBackends Placement::group_backends() const { return {train_backend, sync_root_backends}; }

bool Placement::any_nccl() const {
  return train_backend == "nccl" || std::find(sync_root_backends.begin(), sync_root_backends.end(),
                                              "nccl") != sync_root_backends.end();
}

std::string Placement::table() const {
  std::string out =
      fmt::format("placement: {} node(s) x ({} infer + {} train ranks), --device {}", topo.nnodes,
                  topo.infer_per_node, topo.train_per_node, device_kind_name(kind));
  if (kind == DeviceKind::kCuda) {
    out += from_map ? fmt::format(" --device-map {}", fmt::join(gpu_of_local, ","))
           : infer_tp > 1
               ? fmt::format(" ({} GPU(s) per node, engine i on GPUs i*{}.., the trainers after)",
                             device_count, infer_tp)
               : fmt::format(" ({} GPU(s) per node, GPU = local rank mod {})", device_count,
                             device_count);
  }
  out += "\n| rank | role | device | train group | sync_root groups |\n|---|---|---|---|---|\n";
  auto backend_label = [&](const std::string& b, bool shared) {
    return shared ? b + " (one GPU)" : b;
  };
  for (int r = 0; r < topo.ranks_per_node(); ++r) {
    RankPlacement rp = rank(r);
    std::vector<std::string> roots;
    for (int t = 0; t < topo.train_per_node; ++t) {
      if (rp.sync_root_backends[t].empty()) continue;
      bool shared =
          kind == DeviceKind::kCuda && rp.sync_root_backends[t] != "nccl" &&
          gpu_of_local[topo.infer_per_node + t] == gpu_of_local[topo.receivers_of(t).front()];
      roots.push_back(fmt::format("root{} {}", t, backend_label(rp.sync_root_backends[t], shared)));
    }
    std::string device = rp.device;
    if (rp.role == Role::kInfer && infer_tp > 1) {
      device = kind == DeviceKind::kCuda ? fmt::format("cuda:{}-{}", rp.gpu, rp.gpu + infer_tp - 1)
                                         : fmt::format("cpu x {}", infer_tp);
    }
    out += fmt::format("| {} | {} {} | {} | {} | {} |\n", r, role_name(rp.role), topo.role_index(r),
                       device, rp.train_backend.empty() ? "-" : rp.train_backend,
                       fmt::join(roots, ", "));
  }
  if (topo.nnodes > 1) {
    out += fmt::format("nodes 1..{}: the same devices by local rank\n", topo.nnodes - 1);
  }
  out += topo.paired ? "weight sync: paired (engine i gets every bucket from train rank i)\n"
                     : "weight sync: fan-out (each train rank sends its share of the buckets, "
                       "about 1/T of the bytes, to every engine of its node)\n";
  if (infer_tp > 1 && topo.lanes == infer_tp) {
    out += fmt::format(
        "engines: tensor-parallel over {} ranks each (threads of the infer rank's process; one "
        "scheduler; each rank receives only its slices, over a sync lane of its own)\n",
        infer_tp);
  } else if (infer_tp > 1) {
    out += fmt::format(
        "engines: tensor-parallel over {} ranks each (threads of the infer rank's process; one "
        "scheduler; each update's buckets land on the leader and every rank copies its slices)\n",
        infer_tp);
  }
  out += "world, infer and sync groups (control, prompts, rollouts): gloo\n";
  return out;
}

}  // namespace crl::sync
