// Placement (sync/placement.h): devices and group backends from --device, --device-map, the GPU
// count and the topology, with no GPU; and make_groups' groups of their own (the NCCL path) built
// from the topology with the members split() would give them (Gloo standing in for NCCL on CPU).
#include "sync/placement.h"

#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "sync/gloo_communicator.h"
#include "sync/groups.h"
#include "tests/test_utils.h"

namespace crl::sync {
namespace {

using std::chrono::milliseconds;

PlacementRequest cuda(int count, const std::string& map = "", const std::string& backend = "auto",
                      const std::string& colocate = "auto") {
  PlacementRequest r;
  r.kind = DeviceKind::kCuda;
  r.device_count = count;
  r.device_map = parse_device_map(map);
  r.comm_backend = backend;
  r.colocate = colocate;
  return r;
}

std::vector<std::string> devices_of(const Placement& p) {
  std::vector<std::string> out;
  for (int r = 0; r < p.topo.world_size(); ++r) out.push_back(p.rank(r).device);
  return out;
}

TEST(PlacementTest, CpuPutsEveryRankOnTheCpuAndEveryGroupOnGloo) {
  Placement p = plan_placement(Topology{1, 2, 2}, PlacementRequest{});
  EXPECT_EQ(devices_of(p), (std::vector<std::string>{"cpu", "cpu", "cpu", "cpu"}));
  EXPECT_EQ(p.train_backend, "gloo");
  EXPECT_EQ(p.sync_root_backends, (std::vector<std::string>{"gloo", "gloo"}));
  EXPECT_FALSE(p.any_nccl());
  EXPECT_EQ(p.rank(0).gpu, -1);
  EXPECT_EQ(p.rank(0).train_backend, "");
  EXPECT_NE(p.table().find("| 0 | infer 0 | cpu | - | root0 gloo, root1 gloo |"), std::string::npos)
      << p.table();
  EXPECT_NE(p.table().find("| 3 | train 1 | cpu | gloo | root1 gloo |"), std::string::npos)
      << p.table();
}

// --gpus-infer 1 --gpus-train 1 on one GPU: both ranks on cuda:0; the sync_root group's two
// members share it (Gloo: the weights go through CUDA IPC), the one-rank train group is NCCL.
TEST(PlacementTest, OnePlusOneOnOneGpuSharesItAndKeepsTheSyncRootOnGloo) {
  Placement p = plan_placement(Topology{1, 1, 1}, cuda(1));
  EXPECT_EQ(devices_of(p), (std::vector<std::string>{"cuda:0", "cuda:0"}));
  EXPECT_EQ(p.sync_root_backends, (std::vector<std::string>{"gloo"}));
  EXPECT_EQ(p.train_backend, "nccl");
  RankPlacement infer = p.rank(0), train = p.rank(1);
  EXPECT_EQ(infer.role, Role::kInfer);
  EXPECT_EQ(infer.train_backend, "");
  EXPECT_EQ(infer.sync_root_backends, (std::vector<std::string>{"gloo"}));
  EXPECT_EQ(train.train_backend, "nccl");
  EXPECT_EQ(train.sync_root_backends, (std::vector<std::string>{"gloo"}));
  EXPECT_NE(p.table().find("| 1 | train 0 | cuda:0 | nccl | root0 gloo (one GPU) |"),
            std::string::npos)
      << p.table();
}

TEST(PlacementTest, FourPlusFourOnEightGpusGivesEachRankItsGpuAndNcclGroups) {
  Placement p = plan_placement(Topology{1, 4, 4}, cuda(8));
  for (int r = 0; r < 8; ++r) {
    EXPECT_EQ(p.rank(r).device, "cuda:" + std::to_string(r));
    EXPECT_EQ(p.rank(r).gpu, r);
  }
  EXPECT_EQ(p.train_backend, "nccl");
  EXPECT_EQ(p.sync_root_backends, std::vector<std::string>(4, "nccl"));
  EXPECT_EQ(p.rank(2).sync_root_backends, std::vector<std::string>(4, "nccl"));  // an infer rank
  EXPECT_EQ(p.rank(5).sync_root_backends, (std::vector<std::string>{"", "nccl", "", ""}));
  EXPECT_EQ(p.rank(5).train_backend, "nccl");
  GroupBackends b = p.group_backends();
  EXPECT_EQ(b.train, "nccl");
  EXPECT_EQ(b.sync_root(3), "nccl");
  EXPECT_EQ(b.sync_root(4), "");  // no such group: split
}

// 4 + 4 on 4 GPUs wraps: train rank t lands on infer rank t's GPU. Fanned out (--colocate off),
// each sync_root group {train t, infer 0..3} has two members on one GPU and the others apart:
// neither NCCL nor one GPU. (--colocate auto pairs them: ColocatedPairs... below.)
TEST(PlacementTest, DefaultWrapsLocalRanksOverTheDevicesAndRefusesMixedSharing) {
  ASSERT_THROWS_WITH(plan_placement(Topology{1, 4, 4}, cuda(4, "", "auto", "off")),
                     std::invalid_argument,
                     "--device cuda (GPU = local rank mod 4): the sync_root group of train rank 0 "
                     "(sync.node0.root0) has rank 4 (node 0, train 0) on cuda:0, rank 0 (node 0, "
                     "infer 0) on cuda:0, rank 1 (node 0, infer 1) on cuda:1");
  ASSERT_THROWS_WITH(plan_placement(Topology{1, 4, 4}, cuda(4, "", "auto", "off")),
                     std::invalid_argument, "need --colocate auto or on");
  Placement p = plan_placement(Topology{1, 1, 2}, cuda(2, "", "auto"));  // 0, 1, 0
  EXPECT_EQ(devices_of(p), (std::vector<std::string>{"cuda:0", "cuda:1", "cuda:0"}));
  EXPECT_EQ(p.train_backend, "nccl");
  EXPECT_EQ(p.sync_root_backends, (std::vector<std::string>{"nccl", "gloo"}));
}

TEST(PlacementTest, TwoPlusTwoWithAMap) {
  Placement distinct = plan_placement(Topology{1, 2, 2}, cuda(4, "3,2,1,0"));
  EXPECT_EQ(devices_of(distinct),
            (std::vector<std::string>{"cuda:3", "cuda:2", "cuda:1", "cuda:0"}));
  EXPECT_TRUE(distinct.from_map);
  EXPECT_EQ(distinct.train_backend, "nccl");
  EXPECT_EQ(distinct.sync_root_backends, (std::vector<std::string>{"nccl", "nccl"}));
  EXPECT_NE(distinct.table().find("--device-map 3,2,1,0"), std::string::npos) << distinct.table();

  Placement one = plan_placement(Topology{1, 2, 2}, cuda(4, "1,1,1,1"));
  EXPECT_EQ(devices_of(one), (std::vector<std::string>{"cuda:1", "cuda:1", "cuda:1", "cuda:1"}));
  EXPECT_EQ(one.train_backend, "gloo");
  EXPECT_EQ(one.sync_root_backends, (std::vector<std::string>{"gloo", "gloo"}));
  EXPECT_FALSE(one.any_nccl());

  // Engines share GPU 0, each trainer has its own: the train group shares nothing (NCCL), each
  // sync_root group {train t, infer 0, infer 1} has two members on GPU 0 and one elsewhere.
  ASSERT_THROWS_WITH(plan_placement(Topology{1, 2, 2}, cuda(4, "0,0,1,2")), std::invalid_argument,
                     "rank 2 (node 0, train 0) on cuda:1, rank 0 (node 0, infer 0) on cuda:0, "
                     "rank 1 (node 0, infer 1) on cuda:0: some members share a GPU");
}

TEST(PlacementTest, OneEngineTwoTrainersSplitsBackendsPerGroup) {
  // Trainers share GPU 1 (train group on Gloo), each sync_root group {train t on 1, infer on 0}
  // is on distinct GPUs (NCCL).
  Placement p = plan_placement(Topology{1, 1, 2}, cuda(2, "0,1,1"));
  EXPECT_EQ(p.train_backend, "gloo");
  EXPECT_EQ(p.sync_root_backends, (std::vector<std::string>{"nccl", "nccl"}));
  EXPECT_TRUE(p.any_nccl());
  // Some of the train group share a GPU, one does not.
  ASSERT_THROWS_WITH(plan_placement(Topology{1, 1, 3}, cuda(3, "0,1,1,2")), std::invalid_argument,
                     "the train group (train) has rank 1 (node 0, train 0) on cuda:1, rank 2 "
                     "(node 0, train 1) on cuda:1, rank 3 (node 0, train 2) on cuda:2");
  // Without a map the error names the rule that placed them.
  ASSERT_THROWS_WITH(plan_placement(Topology{1, 2, 2}, cuda(2, "", "auto", "off")),
                     std::invalid_argument,
                     "--device cuda (GPU = local rank mod 2): the sync_root group of train rank 0");
}

// --infer-tp N: engine i spans GPUs [i*N, (i+1)*N) (the rank's device is its group leader's), the
// trainers come after, no GPU shared; so the sync_root groups are NCCL and nothing pairs. Too few
// GPUs, or a map, is refused naming the counts.
TEST(PlacementTest, TensorParallelEnginesTakeTheirGpusInOrderThenTheTrainers) {
  PlacementRequest req = cuda(6);
  req.infer_tp = 2;
  Placement p = plan_placement(Topology{1, 2, 2}, req);
  EXPECT_EQ(p.gpu_of_local, (std::vector<int>{0, 2, 4, 5}));
  EXPECT_EQ(devices_of(p), (std::vector<std::string>{"cuda:0", "cuda:2", "cuda:4", "cuda:5"}));
  EXPECT_FALSE(p.topo.paired);
  EXPECT_EQ(p.train_backend, "nccl");
  EXPECT_EQ(p.sync_root_backends, std::vector<std::string>(2, "nccl"));
  EXPECT_NE(p.table().find("| 1 | infer 1 | cuda:2-3 |"), std::string::npos) << p.table();
  EXPECT_NE(p.table().find("engines: tensor-parallel over 2 ranks each"), std::string::npos);
  EXPECT_EQ(p.topo.lanes, 1) << "on GPUs the updates are staged on the leader (no NCCL lanes)";
  req.device_count = 5;
  ASSERT_THROWS_WITH(plan_placement(Topology{1, 2, 2}, req), std::invalid_argument,
                     "--gpus-infer 2 engines x --infer-tp 2 GPUs each + --gpus-train 2 = 6 GPUs, "
                     "but this node has 5");
  req = cuda(8, "0,2,4,5");
  req.infer_tp = 2;
  ASSERT_THROWS_WITH(plan_placement(Topology{1, 2, 2}, req), std::invalid_argument,
                     "--device-map with --infer-tp 2");
  PlacementRequest on_cpu;
  on_cpu.infer_tp = 4;
  const Placement cpu = plan_placement(Topology{1, 1, 1}, on_cpu);
  EXPECT_NE(cpu.table().find("| 0 | infer 0 | cpu x 4 |"), std::string::npos);
  EXPECT_EQ(cpu.topo.lanes, 4) << "on the CPU each engine rank has a sync lane of its own";
  EXPECT_NE(cpu.table().find("each rank receives only its slices, over a sync lane"),
            std::string::npos);
}

TEST(PlacementTest, RanksOnOtherNodesNeverShareAGpu) {
  // Two nodes of 1 + 1 on one GPU each: the train group spans the nodes (distinct GPUs: NCCL).
  Placement p = plan_placement(Topology{2, 1, 1}, cuda(1));
  EXPECT_EQ(devices_of(p), (std::vector<std::string>{"cuda:0", "cuda:0", "cuda:0", "cuda:0"}));
  EXPECT_EQ(p.train_backend, "nccl");
  EXPECT_EQ(p.sync_root_backends, (std::vector<std::string>{"gloo"}));
  EXPECT_EQ(p.rank(3).role, Role::kTrain);
  EXPECT_EQ(p.rank(3).train_backend, "nccl");
  EXPECT_NE(p.table().find("nodes 1..1: the same devices by local rank"), std::string::npos);
}

TEST(PlacementTest, BadMapsAreErrorsNamingTheFlag) {
  ASSERT_THROWS_WITH(plan_placement(Topology{1, 2, 2}, cuda(4, "0,1,2")), std::invalid_argument,
                     "--device-map has 3 entries but --gpus-infer 2 + --gpus-train 2 = 4 local "
                     "ranks need one each");
  ASSERT_THROWS_WITH(plan_placement(Topology{1, 1, 1}, cuda(4, "0,4")), std::invalid_argument,
                     "--device-map entry 1 (local rank 1, train 0) is GPU 4 but this node has 4 "
                     "CUDA device(s)");
  ASSERT_THROWS_WITH(parse_device_map("0,x"), std::invalid_argument,
                     "--device-map '0,x': entry 1 ('x')");
  ASSERT_THROWS_WITH(parse_device_map("0,,1"), std::invalid_argument, "entry 1 ('')");
  ASSERT_THROWS_WITH(parse_device_map("-1"), std::invalid_argument, "entry 0 ('-1')");
  ASSERT_THROWS_WITH(parse_device_map("1.5"), std::invalid_argument, "entry 0 ('1.5')");
  EXPECT_EQ(parse_device_map("0,0"), (std::vector<int>{0, 0}));
  EXPECT_EQ(parse_device_map(""), std::vector<int>{});
  PlacementRequest cpu_with_map;
  cpu_with_map.device_map = {0, 0};
  ASSERT_THROWS_WITH(plan_placement(Topology{1, 1, 1}, cpu_with_map), std::invalid_argument,
                     "--device-map needs --device cuda");
}

TEST(PlacementTest, CudaWithoutADeviceAndImpossibleBackendsAreErrors) {
  ASSERT_THROWS_WITH(plan_placement(Topology{1, 1, 1}, cuda(0)), std::invalid_argument,
                     "--device cuda: no CUDA device is usable here");
  ASSERT_THROWS_WITH(parse_device_kind("gpu"), std::invalid_argument,
                     "--device must be cpu or cuda");
  PlacementRequest cpu_nccl;
  cpu_nccl.comm_backend = "nccl";
  ASSERT_THROWS_WITH(plan_placement(Topology{1, 1, 1}, cpu_nccl), std::invalid_argument,
                     "--comm-backend nccl needs --device cuda");
  ASSERT_THROWS_WITH(plan_placement(Topology{1, 1, 1}, cuda(1, "", "mpi")), std::invalid_argument,
                     "--comm-backend must be auto, gloo or nccl");
  // NCCL cannot put two ranks of one communicator on one GPU.
  ASSERT_THROWS_WITH(plan_placement(Topology{1, 1, 1}, cuda(1, "", "nccl")), std::invalid_argument,
                     "--comm-backend nccl: the sync_root group of train rank 0 (sync.node0.root0)");
  Placement explicit_nccl = plan_placement(Topology{1, 1, 1}, cuda(2, "", "nccl"));
  EXPECT_EQ(explicit_nccl.sync_root_backends, (std::vector<std::string>{"nccl"}));
  Placement gloo = plan_placement(Topology{1, 4, 4}, cuda(8, "", "gloo"));
  EXPECT_EQ(gloo.train_backend, "gloo");
  EXPECT_EQ(gloo.sync_root_backends, std::vector<std::string>(4, "gloo"));
  EXPECT_EQ(gloo.rank(6).device, "cuda:6");
}

// --gpus-infer N --gpus-train N on N GPUs (N = 1..8): one engine and one trainer on each GPU,
// paired by --colocate auto; the train group spans the GPUs (NCCL from N = 2), each pair shares its
// GPU (Gloo, weights through CUDA IPC), and no engine is in another pair's group.
TEST(PlacementTest, ColocatedPairsOnOneToEightGpus) {
  for (int n = 1; n <= 8; ++n) {
    SCOPED_TRACE(n);
    Placement p = plan_placement(Topology{1, n, n}, cuda(n));
    EXPECT_TRUE(p.topo.paired);
    EXPECT_EQ(p.train_backend, "nccl");
    EXPECT_EQ(p.sync_root_backends, std::vector<std::string>(n, "gloo"));
    for (int t = 0; t < n; ++t) {
      EXPECT_EQ(p.rank(t).device, "cuda:" + std::to_string(t));      // engine t
      EXPECT_EQ(p.rank(n + t).device, "cuda:" + std::to_string(t));  // trainer t
      std::vector<std::string> roots(n, "");
      roots[t] = "gloo";
      EXPECT_EQ(p.rank(t).sync_root_backends, roots);
      EXPECT_EQ(p.rank(n + t).sync_root_backends, roots);
      EXPECT_EQ(p.topo.receivers_of(t), std::vector<int>{t});
      EXPECT_EQ(p.topo.senders_of(t), std::vector<int>{t});
    }
    EXPECT_NE(p.table().find("weight sync: paired"), std::string::npos) << p.table();
    EXPECT_NE(
        p.table().find(fmt::format("| {} | train {} | cuda:{} | nccl | root{} gloo (one GPU) |",
                                   2 * n - 1, n - 1, n - 1, n - 1)),
        std::string::npos)
        << p.table();
  }
  // Two nodes of 4 + 4 on 4 GPUs each: the same pairs on every node.
  Placement two = plan_placement(Topology{2, 4, 4}, cuda(4));
  EXPECT_TRUE(two.topo.paired);
  EXPECT_EQ(two.rank(8 + 5).device, "cuda:1");
}

TEST(PlacementTest, ColocateOnOffAndWhereAutoDoesNotPair) {
  // on: pairs on distinct GPUs (4 + 4 on 8) go over NCCL, each engine still fed by one trainer.
  Placement eight = plan_placement(Topology{1, 4, 4}, cuda(8, "", "auto", "on"));
  EXPECT_TRUE(eight.topo.paired);
  EXPECT_EQ(eight.sync_root_backends, std::vector<std::string>(4, "nccl"));
  EXPECT_EQ(eight.rank(1).sync_root_backends, (std::vector<std::string>{"", "nccl", "", ""}));
  // auto: 4 + 4 on 8 GPUs fans out as before; so do pairs all on one GPU, and the CPU.
  EXPECT_FALSE(plan_placement(Topology{1, 4, 4}, cuda(8)).topo.paired);
  Placement one = plan_placement(Topology{1, 2, 2}, cuda(4, "1,1,1,1"));
  EXPECT_FALSE(one.topo.paired);
  EXPECT_EQ(one.sync_root_backends, (std::vector<std::string>{"gloo", "gloo"}));
  EXPECT_FALSE(plan_placement(Topology{1, 2, 2}, PlacementRequest{}).topo.paired);
  // A map that pairs them: engine 0 and trainer 0 on GPU 3, engine 1 and trainer 1 on GPU 2.
  EXPECT_TRUE(plan_placement(Topology{1, 2, 2}, cuda(4, "3,2,3,2")).topo.paired);
  // on: the CPU too (the tests stand in for GPUs).
  PlacementRequest cpu_on;
  cpu_on.colocate = "on";
  Placement cpu = plan_placement(Topology{1, 3, 3}, cpu_on);
  EXPECT_TRUE(cpu.topo.paired);
  EXPECT_EQ(cpu.rank(2).sync_root_backends, (std::vector<std::string>{"", "", "gloo"}));
  ASSERT_THROWS_WITH(plan_placement(Topology{1, 3, 2}, cpu_on), std::invalid_argument,
                     "--colocate on pairs each engine with one trainer: it needs --gpus-infer == "
                     "--gpus-train, got 3 + 2");
  ASSERT_THROWS_WITH(plan_placement(Topology{1, 1, 1}, cuda(1, "", "auto", "yes")),
                     std::invalid_argument, "--colocate must be auto, on or off, got 'yes'");
  // Two engines on GPU 0 with their trainers on GPUs 0 and 1: not pairs, and fanned out mixed.
  ASSERT_THROWS_WITH(plan_placement(Topology{1, 2, 2}, cuda(2, "0,0,0,1")), std::invalid_argument,
                     "some members share a GPU and others do not");
}

// The fan-out layout's senders: each train rank gets about 1/T of the bytes, whatever the order of
// large and small buckets; the same answer from the same sizes; paired routing ignores it.
TEST(PlacementTest, FanOutSendersShareTheBytesWithinOneBucket) {
  // A 32B layer's shape at 256 MiB buckets: its attention in one small bucket, three MLP matrices
  // in one each, 64 layers. Round robin at T = 4 gave one rank every attention bucket.
  std::vector<int64_t> bytes;
  for (int layer = 0; layer < 64; ++layer) {
    for (int64_t b : {125, 270, 270, 270}) bytes.push_back(b << 20);
  }
  bytes.insert(bytes.begin(), int64_t{1485} << 20);  // the embedding
  bytes.push_back(int64_t{1485} << 20);              // the head
  for (int T : {1, 2, 3, 4, 8}) {
    SCOPED_TRACE(T);
    const std::vector<int> senders = fan_out_senders(bytes, T);
    ASSERT_EQ(senders.size(), bytes.size());
    EXPECT_EQ(senders, fan_out_senders(bytes, T));
    std::vector<int64_t> share(T, 0);
    for (size_t b = 0; b < bytes.size(); ++b) {
      ASSERT_GE(senders[b], 0);
      ASSERT_LT(senders[b], T);
      share[senders[b]] += bytes[b];
    }
    const auto [lo, hi] = std::minmax_element(share.begin(), share.end());
    EXPECT_LE(*hi - *lo, int64_t{1485} << 20);  // within the largest bucket
    int64_t total = 0;
    for (int64_t b : bytes) total += b;
    EXPECT_LE(*hi, total / T + (int64_t{1485} << 20));
  }
  // Many equal buckets: shares equal to one bucket.
  const std::vector<int> even = fan_out_senders(std::vector<int64_t>(10, 8), 4);
  std::vector<int> count(4, 0);
  for (int t : even) ++count[t];
  EXPECT_EQ(
      *std::max_element(count.begin(), count.end()) - *std::min_element(count.begin(), count.end()),
      1);
  // Routing: fan-out by the table, paired to the engine's own trainer.
  Topology fan{1, 2, 4};
  const std::vector<int> s = fan_out_senders(bytes, 4);
  EXPECT_EQ(fan.sender_of(7, 1, s), s[7]);
  EXPECT_TRUE(fan.sends(s[7], 7, s));
  EXPECT_FALSE(fan.sends((s[7] + 1) % 4, 7, s));
  Topology paired{1, 4, 4, true};
  EXPECT_EQ(paired.sender_of(7, 2, s), 2);
  EXPECT_TRUE(paired.sends(3, 7, s));
}

// The groups make_groups creates on their own (NCCL in the job) have exactly the members, order and
// names the split gives: the same job split both ways, with Gloo standing in for NCCL.
TEST(PlacementGroupsTest, GroupsOfTheirOwnMatchTheSplitOnesAndRun) {
  const Topology topo{1, 2, 2};
  struct Seen {
    std::map<std::string, std::vector<int>> members;  // group name -> world ranks
    std::map<std::string, int> rank;                  // group name -> this rank's group rank
  };
  auto record = [](const Communicator* c, Seen& s) {
    if (!c) return;
    s.members[c->name()] = c->info().world_ranks;
    s.rank[c->name()] = c->rank();
  };
  std::vector<Seen> split(4), own(4);
  std::vector<std::vector<std::string>> made(4);
  std::mutex mu;
  auto errors = test::run_ranks(4, milliseconds(20000), [&](int r, auto& comm, const StorePtr&) {
    Groups g = make_groups(std::move(comm), topo);
    record(g.train.get(), split[r]);
    for (const auto& c : g.sync_roots) record(c.get(), split[r]);
  });
  for (const auto& e : errors) ASSERT_EQ(e, "");
  auto errors2 =
      test::run_ranks(4, milliseconds(20000), [&](int r, auto& comm, const StorePtr& store) {
        GroupBackends b{"nccl", {"nccl", "nccl"}};
        CommFactory gloo = [&, r](const std::string& backend, const std::string& prefix,
                                  GroupInfo info) {
          EXPECT_EQ(backend, "nccl");
          {
            std::lock_guard<std::mutex> lock(mu);
            made[r].push_back(info.name);
          }
          return make_gloo_communicator(store, prefix, std::move(info), "127.0.0.1");
        };
        Groups g = make_groups(std::move(comm), topo, b, store, gloo);
        record(g.train.get(), own[r]);
        for (const auto& c : g.sync_roots) record(c.get(), own[r]);
        // The groups work: the train group sums, each root broadcasts from its train rank.
        if (g.train) {
          at::Tensor t = at::ones({3});
          g.train->all_reduce(t);
          EXPECT_TRUE(t.equal(at::full({3}, 2.0f)));
        }
        for (int t = 0; t < topo.train_per_node; ++t) {
          if (!g.sync_roots[t]) continue;
          at::Tensor v = g.sync_roots[t]->rank() == 0 ? at::full({2}, 10.0f + t) : at::zeros({2});
          g.sync_roots[t]->broadcast(v, 0);
          EXPECT_TRUE(v.equal(at::full({2}, 10.0f + t))) << g.sync_roots[t]->name();
        }
        EXPECT_EQ(g.sync->backend(), "gloo");
        EXPECT_EQ(g.infer != nullptr, g.role == Role::kInfer);
        g.world->barrier();  // as below
      });
  for (const auto& e : errors2) ASSERT_EQ(e, "");
  for (int r = 0; r < 4; ++r) {
    EXPECT_EQ(own[r].members, split[r].members) << "rank " << r;
    EXPECT_EQ(own[r].rank, split[r].rank) << "rank " << r;
  }
  EXPECT_EQ(split[0].members.at("sync.node0.root1"), (std::vector<int>{3, 0, 1}));
  EXPECT_EQ(made[0], (std::vector<std::string>{"sync.node0.root0", "sync.node0.root1"}));
  EXPECT_EQ(made[1], made[0]);
  EXPECT_EQ(made[2], (std::vector<std::string>{"train", "sync.node0.root0"}));
  EXPECT_EQ(made[3], (std::vector<std::string>{"train", "sync.node0.root1"}));

  // Paired, with groups of their own: root t is {train t, infer t}, made by those two only.
  Topology paired = topo;
  paired.paired = true;
  std::vector<std::vector<std::string>> made_paired(4);
  std::vector<Seen> own_paired(4);
  auto errors3 =
      test::run_ranks(4, milliseconds(20000), [&](int r, auto& comm, const StorePtr& store) {
        CommFactory gloo = [&, r](const std::string&, const std::string& prefix, GroupInfo info) {
          {
            std::lock_guard<std::mutex> lock(mu);
            made_paired[r].push_back(info.name);
          }
          return make_gloo_communicator(store, prefix, std::move(info), "127.0.0.1");
        };
        Groups g = make_groups(std::move(comm), paired, GroupBackends{"nccl", {"nccl", "nccl"}},
                               store, gloo);
        for (const auto& c : g.sync_roots) record(c.get(), own_paired[r]);
        // No rank closes its groups while a peer may still be connecting to it (a closed pair
        // during another member's connect fails that connect).
        g.world->barrier();
      });
  for (const auto& e : errors3) ASSERT_EQ(e, "");
  EXPECT_EQ(made_paired[0], (std::vector<std::string>{"sync.node0.root0"}));
  EXPECT_EQ(made_paired[1], (std::vector<std::string>{"sync.node0.root1"}));
  EXPECT_EQ(made_paired[3], (std::vector<std::string>{"train", "sync.node0.root1"}));
  EXPECT_EQ(own_paired[1].members.at("sync.node0.root1"), (std::vector<int>{3, 1}));
  EXPECT_EQ(own_paired[1].rank.at("sync.node0.root1"), 1);
}

}  // namespace
}  // namespace crl::sync
