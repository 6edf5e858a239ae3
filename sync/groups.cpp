#include "sync/groups.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <numeric>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>

#include "common/check.h"
#include "sync/gloo_communicator.h"
#include "sync/nccl_communicator.h"

namespace crl::sync {

const char* role_name(Role r) { return r == Role::kInfer ? "infer" : "train"; }

std::string Topology::describe(int world_rank) const {
  return fmt::format("rank {} (node {}, {} {})", world_rank, node_of(world_rank),
                     role_name(role_of(world_rank)), role_index(world_rank));
}

std::vector<int> Topology::receivers_of(int t) const {
  if (paired) return {t};
  std::vector<int> out;
  for (int i = 0; i < infer_per_node; ++i) out.push_back(i);
  return out;
}

std::vector<int> Topology::senders_of(int i) const {
  if (paired) return {i};
  std::vector<int> out;
  for (int t = 0; t < train_per_node; ++t) out.push_back(t);
  return out;
}

bool Topology::sends(int t, int64_t bucket, const std::vector<int>& senders) const {
  return paired || senders.at(bucket) == t;
}

int Topology::sender_of(int64_t bucket, int i, const std::vector<int>& senders) const {
  return paired ? i : senders.at(bucket);
}

std::vector<int> fan_out_senders(const std::vector<int64_t>& bucket_bytes, int train_ranks) {
  CRL_CHECK(train_ranks >= 1, "fan_out_senders: ", train_ranks, " train ranks");
  std::vector<int64_t> order(bucket_bytes.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(),
                   [&](int64_t a, int64_t b) { return bucket_bytes[a] > bucket_bytes[b]; });
  std::vector<int64_t> load(train_ranks, 0);
  std::vector<int> out(bucket_bytes.size(), 0);
  for (int64_t b : order) {
    const int t = static_cast<int>(std::min_element(load.begin(), load.end()) - load.begin());
    out[b] = t;
    load[t] += bucket_bytes[b];
  }
  return out;
}

void Topology::check_layout() const {
  if (paired && infer_per_node != train_per_node) {
    CRL_INVALID(
        "the paired weight-sync layout (--colocate) pairs each engine with one trainer: it "
        "needs --gpus-infer == --gpus-train, got ",
        infer_per_node, " + ", train_per_node);
  }
}

World join_world(const RankEnv& env, std::chrono::milliseconds timeout,
                 const std::string& backend) {
  World w;
  w.env = env;
  w.store = connect_store(env.master_addr, env.master_port, timeout);
  if (!env.store_prefix.empty()) {
    w.store = c10::make_intrusive<c10d::PrefixStore>(env.store_prefix, w.store);
  }
  auto deadline = Clock::now() + timeout;
  store_set(w.store, fmt::format("rdzv/joined/{}", env.rank), "1");
  std::vector<std::string> keys;
  for (int r = 0; r < env.world_size; ++r) keys.push_back(fmt::format("rdzv/joined/{}", r));
  auto missing = wait_keys(w.store, keys, deadline);
  if (!missing.empty()) {
    std::vector<int> late;
    for (const auto& k : missing) late.push_back(std::stoi(k.substr(k.rfind('/') + 1)));
    throw CollectiveError(fmt::format(
        "rendezvous timed out: op=join group=world rank={}/{} waited {} ms for world ranks {} "
        "that never joined (store {}:{}) bytes=0",
        env.rank, env.world_size, timeout.count(), late, env.master_addr, env.master_port));
  }
  GroupInfo info;
  info.name = "world";
  info.rank = env.rank;
  info.timeout = timeout;
  for (int r = 0; r < env.world_size; ++r) info.world_ranks.push_back(r);
  if (backend == "gloo") {
    // One node talks over loopback; several need this host's routable address (or
    // GLOO_SOCKET_IFNAME).
    w.comm = make_gloo_communicator(w.store, "world", std::move(info),
                                    env.nnodes == 1 ? "127.0.0.1" : "");
  } else if (backend == "nccl") {
    w.comm = make_nccl_communicator(w.store, "world", std::move(info));
  } else {
    CRL_INVALID("unknown communication backend '", backend, "' (gloo or nccl)");
  }
  return w;
}

Communicator* Groups::sync_root(int t, int lane) const {
  if (lane == 0) return sync_roots.at(t).get();
  return lane_roots.at(lane - 1).at(t).get();
}

const std::string& GroupBackends::sync_root(int t) const {
  static const std::string kWorld;
  return t >= 0 && t < static_cast<int>(sync_roots.size()) ? sync_roots[t] : kWorld;
}

GroupInfo train_group_info(const Topology& topo, int world_rank,
                           std::chrono::milliseconds timeout) {
  GroupInfo info;
  info.name = "train";
  info.timeout = timeout;
  for (int r = 0; r < topo.world_size(); ++r) {
    if (topo.role_of(r) != Role::kTrain) continue;
    if (r == world_rank) info.rank = info.size();
    info.world_ranks.push_back(r);
  }
  return info;
}

GroupInfo sync_root_group_info(const Topology& topo, int node, int t, int world_rank,
                               std::chrono::milliseconds timeout) {
  GroupInfo info;
  info.name = fmt::format("sync.node{}.root{}", node, t);
  info.timeout = timeout;
  const int base = node * topo.ranks_per_node();
  info.world_ranks.push_back(base + topo.infer_per_node + t);
  for (int i : topo.receivers_of(t)) info.world_ranks.push_back(base + i);
  for (int i = 0; i < info.size(); ++i) {
    if (info.world_ranks[i] == world_rank) info.rank = i;
  }
  return info;
}

Groups make_groups(std::unique_ptr<Communicator> world, const Topology& topo,
                   const GroupBackends& backends, const StorePtr& store,
                   const CommFactory& make_own) {
  topo.check_layout();
  if (world->size() != topo.world_size()) {
    CRL_INVALID("world has ", world->size(), " ranks but the topology needs ", topo.world_size(),
                " (", topo.nnodes, " nodes x (", topo.infer_per_node, " infer + ",
                topo.train_per_node, " train))");
  }
  // A group is split from the world unless it asks for another backend than the world's.
  auto own = [&](const std::string& backend) {
    return !backend.empty() && backend != world->backend();
  };
  Groups g;
  g.topo = topo;
  g.world_rank = world->info().world_ranks[world->rank()];
  g.role = topo.role_of(g.world_rank);
  g.node = topo.node_of(g.world_rank);
  int local = topo.local_of(g.world_rank);
  bool train = g.role == Role::kTrain;
  const int t_self = train ? topo.role_index(g.world_rank) : -1;
  // Whether this rank is in the sync_root group of train rank t.
  auto is_member = [&](int t) {
    if (train) return t_self == t;
    const std::vector<int> fed = topo.receivers_of(t);
    return std::find(fed.begin(), fed.end(), local) != fed.end();
  };
  // Every rank takes part in every split, in this order (every rank computes the same backends).
  std::unique_ptr<Communicator> train_group;
  if (!own(backends.train)) train_group = world->split(train ? 0 : -1, g.world_rank, "train");
  auto infer_group = world->split(train ? -1 : 0, g.world_rank, "infer");
  // Train ranks first in the node's sync group: sync rank t is train rank t.
  int sync_key = train ? local - topo.infer_per_node : topo.train_per_node + local;
  g.sync = world->split(g.node, sync_key, fmt::format("sync.node{}", g.node));
  g.sync_roots.resize(topo.train_per_node);
  for (int t = 0; t < topo.train_per_node; ++t) {
    if (own(backends.sync_root(t))) continue;
    bool member = is_member(t);
    int key = train ? 0 : 1 + local;
    g.sync_roots[t] =
        g.sync->split(member ? 0 : -1, key, fmt::format("sync.node{}.root{}", g.node, t));
  }
  if (topo.lanes < 1) CRL_INVALID("sync lanes must be >= 1, got ", topo.lanes);
  g.lane_roots.resize(topo.lanes - 1);
  for (int lane = 1; lane < topo.lanes; ++lane) {
    for (int t = 0; t < topo.train_per_node; ++t) {
      if (own(backends.sync_root(t))) {
        CRL_INVALID("tensor-parallel sync lanes are split from the world's ", world->backend(),
                    " group; the sync_root group of train rank ", t, " is ", backends.sync_root(t));
      }
      g.lane_roots[lane - 1].push_back(
          g.sync->split(is_member(t) ? 0 : -1, train ? 0 : 1 + local,
                        fmt::format("sync.node{}.root{}.lane{}", g.node, t, lane)));
    }
  }
  // Then the groups of their own, each created by its members only: the train group (every train
  // rank), then root t (train rank t after the train group, the infer ranks in order of t), so no
  // member waits on one that waits on it.
  auto make = [&](const std::string& backend, GroupInfo info) {
    std::string prefix = "own/" + info.name;
    if (make_own) return make_own(backend, prefix, std::move(info));
    if (backend != "nccl") CRL_INVALID("group ", info.name, ": unknown backend '", backend, "'");
    CRL_CHECK(store, "make_groups: group ", info.name,
              " needs the store to create its communicator");
    return make_nccl_communicator(store, prefix, std::move(info));
  };
  const auto timeout = world->timeout();
  if (own(backends.train) && train) {
    train_group = make(backends.train, train_group_info(topo, g.world_rank, timeout));
  }
  for (int t = 0; t < topo.train_per_node; ++t) {
    if (!own(backends.sync_root(t)) || !is_member(t)) continue;
    g.sync_roots[t] =
        make(backends.sync_root(t), sync_root_group_info(topo, g.node, t, g.world_rank, timeout));
  }
  g.train = std::move(train_group);
  g.infer = std::move(infer_group);
  g.world = std::move(world);
  return g;
}

}  // namespace crl::sync
