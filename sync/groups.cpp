#include "sync/groups.h"

#include <torch/csrc/distributed/c10d/PrefixStore.hpp>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "common/check.h"
#include "sync/gloo_communicator.h"
#include "sync/nccl_communicator.h"

namespace crl::sync {

const char* role_name(Role r) { return r == Role::kInfer ? "infer" : "train"; }

std::string Topology::describe(int world_rank) const {
  return fmt::format("rank {} (node {}, {} {})", world_rank, node_of(world_rank),
                     role_name(role_of(world_rank)), role_index(world_rank));
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

Groups make_groups(std::unique_ptr<Communicator> world, const Topology& topo) {
  if (world->size() != topo.world_size()) {
    CRL_INVALID("world has ", world->size(), " ranks but the topology needs ", topo.world_size(),
                " (", topo.nnodes, " nodes x (", topo.infer_per_node, " infer + ",
                topo.train_per_node, " train))");
  }
  Groups g;
  g.topo = topo;
  g.world_rank = world->info().world_ranks[world->rank()];
  g.role = topo.role_of(g.world_rank);
  g.node = topo.node_of(g.world_rank);
  int local = topo.local_of(g.world_rank);
  bool train = g.role == Role::kTrain;
  // Every rank takes part in every split, in this order.
  auto train_group = world->split(train ? 0 : -1, g.world_rank, "train");
  auto infer_group = world->split(train ? -1 : 0, g.world_rank, "infer");
  // Train ranks first in the node's sync group: sync rank t is train rank t.
  int sync_key = train ? local - topo.infer_per_node : topo.train_per_node + local;
  g.sync = world->split(g.node, sync_key, fmt::format("sync.node{}", g.node));
  for (int t = 0; t < topo.train_per_node; ++t) {
    bool member = !train || topo.role_index(g.world_rank) == t;
    int key = train ? 0 : 1 + local;
    auto c = g.sync->split(member ? 0 : -1, key, fmt::format("sync.node{}.root{}", g.node, t));
    g.sync_roots.push_back(std::move(c));
  }
  g.train = std::move(train_group);
  g.infer = std::move(infer_group);
  g.world = std::move(world);
  return g;
}

}  // namespace crl::sync
