// Gloo communicator and groups with every rank a thread of this process (c10d allows it): ops,
// splits, deadlines and their errors.
#include "sync/communicator.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <chrono>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "sync/gloo_communicator.h"
#include "sync/groups.h"
#include "sync/nccl_communicator.h"
#include "sync/store.h"
#include "sync/weight_sync.h"
#include "tests/test_utils.h"

namespace crl::sync {
namespace {

using std::chrono::milliseconds;

using test::run_ranks;

TEST(CommunicatorTest, BroadcastAllReduceSendRecvBarrier) {
  auto errors = run_ranks(3, milliseconds(10000), [](int r, auto& comm, const StorePtr&) {
    at::Tensor b = r == 1 ? at::arange(10, at::kFloat) : at::zeros({10}, at::kFloat);
    comm->broadcast(b, 1);
    EXPECT_TRUE(b.equal(at::arange(10, at::kFloat)));
    at::Tensor s = at::full({4}, static_cast<double>(r + 1), at::kDouble);
    comm->all_reduce(s);
    EXPECT_TRUE(s.equal(at::full({4}, 6.0, at::kDouble)));
    at::Tensor m = at::full({2}, static_cast<int64_t>(r), at::kLong);
    comm->all_reduce(m, ReduceOp::kMax);
    EXPECT_EQ(m[0].item<int64_t>(), 2);
    // bf16 moves as raw bytes.
    at::Tensor h =
        r == 0 ? at::linspace(-1, 1, 7).to(at::kBFloat16) : at::zeros({7}, at::kBFloat16);
    comm->broadcast(h, 0);
    EXPECT_TRUE(h.equal(at::linspace(-1, 1, 7).to(at::kBFloat16)));
    if (r == 0) comm->send(at::arange(5, at::kInt), 2);
    if (r == 2) {
      at::Tensor got = at::zeros({5}, at::kInt);
      comm->recv(got, 0);
      EXPECT_TRUE(got.equal(at::arange(5, at::kInt)));
    }
    comm->barrier();
    EXPECT_EQ(comm->op_count(), r == 1 ? 5 : 6);
  });
  for (const auto& e : errors) EXPECT_EQ(e, "");
}

TEST(CommunicatorTest, ReduceScatterAndAllGatherOverUnevenRankCounts) {
  auto errors = run_ranks(3, milliseconds(10000), [](int r, auto& comm, const StorePtr&) {
    // Rank r contributes (r + 1) * [0, 1, ..., 11]; chunk r of the sum is 6 * [4r, 4r + 4).
    at::Tensor in = at::arange(12, at::kFloat) * static_cast<float>(r + 1);
    at::Tensor out = at::zeros({4}, at::kFloat);
    comm->reduce_scatter(in, out);
    EXPECT_TRUE(out.equal(at::arange(4 * r, 4 * r + 4, at::kFloat) * 6));
    // In place: this rank's chunk of the output is the input, and bf16 travels as bytes.
    at::Tensor full = at::zeros({9}, at::kBFloat16);
    full.narrow(0, 3 * r, 3).fill_(static_cast<double>(r) + 0.5);
    comm->all_gather(full.narrow(0, 3 * r, 3), full);
    at::Tensor want = at::repeat_interleave(at::arange(3, at::kFloat) + 0.5, 3).to(at::kBFloat16);
    EXPECT_TRUE(full.equal(want));
    EXPECT_THROW(comm->all_gather(at::zeros({2}), at::zeros({7})), CollectiveError);
  });
  for (const auto& e : errors) EXPECT_EQ(e, "");
}

TEST(CommunicatorTest, SplitOrdersByKeyAndSkipsNegativeColors) {
  auto errors = run_ranks(4, milliseconds(10000), [](int r, auto& comm, const StorePtr&) {
    // Evens and odds, reversed order by key; rank 3 opts out.
    int color = r == 3 ? -1 : r % 2;
    auto child = comm->split(color, 10 - r, "half");
    if (r == 3) {
      EXPECT_EQ(child, nullptr);
      return;
    }
    ASSERT_NE(child, nullptr);
    if (r % 2 == 0) {
      EXPECT_EQ(child->size(), 2);
      EXPECT_EQ(child->info().world_ranks, (std::vector<int>{2, 0}));
      EXPECT_EQ(child->rank(), r == 2 ? 0 : 1);
      at::Tensor t = at::full({3}, static_cast<float>(r), at::kFloat);
      child->all_reduce(t);
      EXPECT_EQ(t[0].item<float>(), 2.0f);
    } else {
      EXPECT_EQ(child->size(), 1);
    }
  });
  for (const auto& e : errors) EXPECT_EQ(e, "");
}

TEST(CommunicatorTest, MissingPeerFailsAtTheDeadlineNamingOpGroupRanksAndBytes) {
  auto errors = run_ranks(2, milliseconds(1500), [](int r, auto& comm, const StorePtr&) {
    if (r == 1) {  // alive but never calls the broadcast
      std::this_thread::sleep_for(milliseconds(2500));
      return;
    }
    at::Tensor t = at::zeros({256}, at::kFloat);
    auto b0 = std::chrono::steady_clock::now();
    try {
      comm->broadcast(t, 1);
    } catch (const CollectiveError&) {
      double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - b0).count();
      EXPECT_GE(s, 1.4);  // not before the deadline...
      EXPECT_LT(s, 5.0);  // ...and not long after it (loaded CI machines included)
      throw;
    }
  });
  ASSERT_NE(errors[0], "");
  EXPECT_TRUE(errors[0].find("Timed out") != std::string::npos ||
              errors[0].find("deadline") != std::string::npos)
      << errors[0];
  for (const char* part : {"op=broadcast", "group=world", "rank=0/2", "members=world[0, 1]",
                           "root=1 (world 1)", "bytes=1024", "timeout=1500ms"}) {
    EXPECT_NE(errors[0].find(part), std::string::npos) << part << " not in: " << errors[0];
  }
}

TEST(CommunicatorTest, AbortedCommunicatorRefusesFurtherOps) {
  auto errors = run_ranks(2, milliseconds(800), [](int r, auto& comm, const StorePtr&) {
    if (r == 1) {
      std::this_thread::sleep_for(milliseconds(1500));
      return;
    }
    at::Tensor t = at::zeros({4}, at::kFloat);
    EXPECT_THROW(comm->all_reduce(t), CollectiveError);
    EXPECT_TRUE(comm->aborted());
    try {
      comm->barrier();
      ADD_FAILURE() << "barrier on an aborted communicator";
    } catch (const CollectiveError& e) {
      EXPECT_NE(std::string(e.what()).find("aborted"), std::string::npos);
    }
  });
  EXPECT_EQ(errors[0], "");
}

// Weight sync in-process: 2 train + 2 infer threads on one node, fp32 masters into bf16 buckets,
// several buckets per root. Bit-identity against a local cast, and the collective count.
TEST(WeightSyncTest, BucketSyncIsBitIdenticalAndOneCollectivePerBucket) {
  std::vector<TensorSpec> specs;
  for (int i = 0; i < 9; ++i) {
    specs.push_back({"w" + std::to_string(i), {33, 17 + i}, at::kBFloat16});
  }
  auto layout = WeightLayout::plan(specs, 4096);
  ASSERT_GE(layout.buckets().size(), 4u);
  std::vector<at::Tensor> masters;
  for (size_t i = 0; i < specs.size(); ++i) {
    masters.push_back(at::randn(specs[i].shape, at::kFloat));
  }
  Topology topo{1, 2, 2};
  auto errors = run_ranks(4, milliseconds(10000), [&](int r, auto& comm, const StorePtr& store) {
    Groups g = make_groups(std::move(comm), topo);
    WeightSyncOptions o;
    o.verify = true;
    WeightSync ws(g, store, layout, o);
    if (g.role == Role::kTrain) {
      auto st = ws.send(masters, 1);
      EXPECT_GT(st.collectives, 0);
      EXPECT_LE(st.extra_bytes, 2 * layout.max_bucket_nbytes());
      store_set(store, "colls/" + std::to_string(r), std::to_string(st.collectives));
    } else {
      auto buckets = layout.allocate_buckets(at::TensorOptions());
      auto st = ws.receive(buckets, 1);
      EXPECT_TRUE(st.verified);
      EXPECT_EQ(st.collectives, static_cast<int64_t>(layout.buckets().size()));
      EXPECT_EQ(st.extra_bytes, 0);
      auto views = layout.views(buckets);
      for (size_t i = 0; i < views.size(); ++i) {
        EXPECT_TRUE(views[i].equal(masters[i].to(at::kBFloat16))) << specs[i].name;
      }
    }
  });
  for (const auto& e : errors) EXPECT_EQ(e, "");
}

// A streamed send (a ZeRO-3 trainer's): the senders' weights exist one run of buckets at a time,
// and every run before is wiped when the next is gathered. Every train rank gathers the same runs
// in order (a collective inside gather(), as the trainer's all-gather), and the engines still get
// every byte: send() (casting, fp32 -> bf16) and send_buckets() (the buckets themselves), fan-out
// over 2 senders with the checksums on. Over IPC (host memory here) the stream is one gather of
// every bucket before the first hand-over.
TEST(WeightSyncTest, AStreamedSendReadsEachRunOnlyWhileItIsGathered) {
  for (int mode = 0; mode < 3; ++mode) {
    const at::ScalarType dtype = mode == 0 ? at::kBFloat16 : at::kFloat;
    const bool ipc = mode == 2;
    SCOPED_TRACE(mode == 0 ? "send" : ipc ? "send_buckets over ipc" : "send_buckets");
    std::vector<TensorSpec> specs;
    for (int i = 0; i < 11; ++i) specs.push_back({"w" + std::to_string(i), {37, 19 + i}, dtype});
    auto layout = WeightLayout::plan(specs, 6000);
    const int64_t chunk = 9000;
    ASSERT_GE(layout.chunks(chunk).size(), 3u);
    const auto runs =
        ipc ? layout.chunks(0) : layout.chunks(chunk);  // IPC: one gather of the whole model
    std::vector<at::Tensor> masters;
    for (const auto& spec : specs) masters.push_back(at::randn(spec.shape, at::kFloat));
    Topology topo{1, 2, 2};
    auto errors = run_ranks(4, milliseconds(20000), [&](int, auto& comm, const StorePtr& store) {
      Groups g = make_groups(std::move(comm), topo);
      WeightSyncOptions o;
      o.verify = true;
      o.stream_chunk_bytes = chunk;
      if (ipc) o.transport = SyncTransport::kIpc;
      WeightSync ws(g, store, layout, o);
      if (g.role == Role::kInfer) {
        auto buckets = layout.allocate_buckets(at::TensorOptions());
        EXPECT_TRUE(ws.receive(buckets, 1).verified);
        auto views = layout.views(buckets);
        for (size_t i = 0; i < views.size(); ++i) {
          EXPECT_TRUE(views[i].equal(masters[i].to(dtype))) << specs[i].name;
        }
        return;
      }
      // The sender's storage: every tensor wiped outside the run gathered now.
      std::vector<at::Tensor> buckets = layout.allocate_buckets(at::TensorOptions());
      std::vector<at::Tensor> tensors = layout.views(buckets);
      std::vector<std::pair<int64_t, int64_t>> seen;
      SendStream stream;
      stream.gather = [&](int64_t first, int64_t end) {
        at::Tensor probe = at::full({1}, static_cast<float>(first));
        g.train->all_reduce(probe);  // both train ranks gather the same run at once
        EXPECT_EQ(probe.item<float>(), 2.0f * static_cast<float>(first));
        seen.emplace_back(first, end);
        for (auto& b : buckets) b.zero_();
        for (int64_t b = first; b < end; ++b) {
          for (const BucketEntry& e : layout.buckets()[b].entries)
            tensors[e.tensor].copy_(masters[e.tensor]);
        }
      };
      if (dtype == at::kFloat) {
        ws.send_buckets(buckets, 1, &stream);
      } else {
        // Cast from tensors of the trainer's own (fp32), alive only inside the runs too.
        std::vector<at::Tensor> fp32;
        for (const auto& t : tensors) fp32.push_back(at::zeros(t.sizes(), at::kFloat));
        SendStream cast;
        cast.gather = [&](int64_t first, int64_t end) {
          stream.gather(first, end);
          for (size_t i = 0; i < fp32.size(); ++i) fp32[i].copy_(tensors[i]);
        };
        ws.send(fp32, 1, &cast);
      }
      EXPECT_EQ(seen, runs);
    });
    for (const auto& e : errors) EXPECT_EQ(e, "");
  }
}

TEST(WeightSyncTest, LayoutMismatchNamesTheFirstDifferingTensor) {
  std::vector<TensorSpec> a = {{"x", {4, 4}, at::kFloat}, {"y", {8}, at::kFloat}};
  std::vector<TensorSpec> b = {{"x", {4, 4}, at::kFloat}, {"y", {9}, at::kFloat}};
  auto la = WeightLayout::plan(a, 1 << 20);
  auto lb = WeightLayout::plan(b, 1 << 20);
  Topology topo{1, 1, 1};
  auto errors = run_ranks(2, milliseconds(5000), [&](int r, auto& comm, const StorePtr& store) {
    Groups g = make_groups(std::move(comm), topo);
    WeightSync ws(g, store, g.role == Role::kTrain ? lb : la, WeightSyncOptions{});
  });
  for (const auto& e : errors) {
    EXPECT_NE(e.find("weight layout mismatch at setup"), std::string::npos) << e;
    EXPECT_NE(e.find("y [9]"), std::string::npos) << e;
  }
}

TEST(WeightSyncTest, LayoutJsonRoundTripsToTheSameHash) {
  std::vector<TensorSpec> specs = {{"a.weight", {3, 5}, at::kBFloat16}, {"b", {}, at::kFloat}};
  auto l = WeightLayout::plan(specs, 1000, 64);
  auto back = layout_from_json(layout_to_json(l));
  EXPECT_EQ(back.hash(), l.hash());
  EXPECT_FALSE(back.first_difference(l).has_value());
}

TEST(WeightSyncTest, ChecksumSeesEveryByte) {
  at::Tensor t = at::zeros({1000}, at::kByte);
  uint64_t base = checksum_bytes(t);
  for (int64_t i : {0, 7, 31, 32, 999}) {
    at::Tensor u = t.clone();
    u[i] = 1;
    EXPECT_NE(checksum_bytes(u), base) << i;
  }
  EXPECT_NE(checksum_bytes(t.narrow(0, 0, 999)), base);
}

namespace crl::sync {
namespace {

TEST(CommBackendTest, AutoPicksGlooForCpuTensorsAndRefusesImpossibleChoices) {
  EXPECT_EQ(resolve_comm_backend("auto", false), "gloo");
  EXPECT_EQ(resolve_comm_backend("gloo", false), "gloo");
  EXPECT_THROW(resolve_comm_backend("nccl", false), std::invalid_argument);
  EXPECT_THROW(resolve_comm_backend("gloo", true), std::invalid_argument);
  EXPECT_THROW(resolve_comm_backend("mpi", false), std::invalid_argument);
}

// One NCCL rank on the one GPU (ctest label `gpu`): the communicator opens through the store,
// runs broadcast, all-reduce and barrier, and names itself. Two ranks cannot share one GPU in
// NCCL, so the multi-rank path stays unverified on a one-GPU machine.
TEST(CudaNcclTest, OneRankCommunicatorRunsItsOps) {
  std::string why;
  if (!at::hasCUDA() || !nccl_available(&why)) GTEST_SKIP() << "no CUDA device or NCCL: " << why;
  auto run = run_ranks(
      1, milliseconds(20000), [](int, std::unique_ptr<Communicator>&, const StorePtr& store) {
        GroupInfo info;
        info.name = "nccl-one";
        info.rank = 0;
        info.world_ranks = {0};
        info.timeout = milliseconds(20000);
        auto comm = make_nccl_communicator(store, "nccl-one", info);
        EXPECT_EQ(comm->backend(), "nccl");
        at::Tensor t = at::arange(1 << 20, at::TensorOptions().dtype(at::kFloat).device(at::kCUDA));
        at::Tensor ref = t.clone();
        comm->broadcast_async(t, 0)->wait();
        comm->all_reduce_async(t, ReduceOp::kSum)->wait();
        at::Tensor part = at::empty_like(t);
        comm->reduce_scatter(t, part);
        comm->all_gather(part, t);
        comm->barrier();
        EXPECT_TRUE(t.equal(ref));
      });
  EXPECT_EQ(run[0], "");
}

TEST(CommBackendTest, NcclWithoutADeviceIsAClearError) {
  std::string why;
  if (nccl_available(&why)) GTEST_SKIP() << "a CUDA device and NCCL are present";
  EXPECT_FALSE(why.empty());
  GroupInfo info;
  info.name = "world";
  info.world_ranks = {0};
  info.timeout = std::chrono::milliseconds(1000);
  try {
    make_nccl_communicator(StorePtr(), "x", info);
    ADD_FAILURE() << "no error";
  } catch (const CollectiveError& e) {
    EXPECT_NE(std::string(e.what()).find("NCCL"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace crl::sync

// A collective can end on the sender before a receiver enters it (small buckets fit the
// transport's buffers), so a sender can post versions 2 and 3 before a slow engine looks for 1:
// every version it missed must still be announced and verifiable, in order. Without the
// request/wait_requested handshake nothing of an older version may be withdrawn.
TEST(WeightSyncTest, AReceiverThatFallsVersionsBehindStillFindsEachOne) {
  using Clock = std::chrono::steady_clock;
  std::vector<TensorSpec> specs = {{"a", {16, 8}, at::kFloat}, {"b", {40}, at::kFloat}};
  auto layout = WeightLayout::plan(specs, 256);
  ASSERT_GE(layout.buckets().size(), 2u);
  auto masters_of = [&](int64_t v) {
    std::vector<at::Tensor> m;
    for (const auto& s : specs) m.push_back(at::full(s.shape, static_cast<float>(v), at::kFloat));
    return m;
  };
  const int64_t versions = 3;
  Topology topo{1, 3, 1};
  auto errors = run_ranks(4, milliseconds(8000), [&](int r, auto& comm, const StorePtr& store) {
    Groups g = make_groups(std::move(comm), topo);
    WeightSyncOptions o;
    o.verify = true;
    WeightSync ws(g, store, layout, o);
    if (g.role == Role::kTrain) {
      for (int64_t v = 1; v <= versions; ++v) ws.send(masters_of(v), v);
      return;
    }
    auto buckets = layout.allocate_buckets(at::TensorOptions());
    if (topo.role_index(r) == 2) {
      // The late engine: starts once the sender is past version 1 (or after a while, if the
      // transport made the sender wait for it).
      auto until = Clock::now() + milliseconds(1500);
      while (!ws.ready(2) && Clock::now() < until) std::this_thread::sleep_for(milliseconds(5));
    }
    for (int64_t v = 1; v <= versions; ++v) {
      auto until = Clock::now() + milliseconds(3000);
      while (!ws.ready(v)) {
        ASSERT_LT(Clock::now(), until) << "version " << v << " never announced";
        std::this_thread::sleep_for(milliseconds(1));
      }
      auto st = ws.receive(buckets, v);
      EXPECT_TRUE(st.verified);
      auto views = layout.views(buckets);
      for (size_t i = 0; i < views.size(); ++i) EXPECT_TRUE(views[i].equal(masters_of(v)[i]));
    }
  });
  for (const auto& e : errors) EXPECT_EQ(e, "");
}

// A staged receive (a tensor-parallel engine's): the same collectives as a whole receive, one
// bucket at a time through one reused buffer, each verified before it lands, in bucket order.
TEST(WeightSyncTest, AStagedReceiveLandsEveryBucketInOrderThroughOneBuffer) {
  std::vector<TensorSpec> specs;
  for (int i = 0; i < 7; ++i)
    specs.push_back({"w" + std::to_string(i), {29, 13 + i}, at::kBFloat16});
  auto layout = WeightLayout::plan(specs, 2048);
  ASSERT_GE(layout.buckets().size(), 4u);
  std::vector<at::Tensor> masters;
  for (const auto& spec : specs) masters.push_back(at::randn(spec.shape, at::kFloat));
  Topology topo{1, 2, 1};
  auto errors = run_ranks(3, milliseconds(10000), [&](int r, auto& comm, const StorePtr& store) {
    Groups g = make_groups(std::move(comm), topo);
    WeightSyncOptions o;
    o.verify = true;
    WeightSync ws(g, store, layout, o);
    if (g.role == Role::kTrain) {
      ws.send(masters, 1);
      return;
    }
    auto buckets = layout.allocate_buckets(at::TensorOptions());
    const int64_t nb = static_cast<int64_t>(layout.buckets().size());
    SyncStats st;
    if (topo.role_index(r) == 0) {
      st = ws.receive(buckets, 1);
    } else {
      at::Tensor staging = at::empty({layout.max_bucket_nbytes()}, at::kByte);
      int64_t next = 0;
      st = ws.receive_staged(1, staging, [&](int64_t b, const at::Tensor& bytes) {
        EXPECT_EQ(b, next++);
        EXPECT_EQ(bytes.data_ptr(), staging.data_ptr());
        buckets[b].copy_(bytes.narrow(0, 0, layout.buckets()[b].nbytes));
      });
      EXPECT_EQ(next, nb);
      EXPECT_EQ(st.extra_bytes, layout.max_bucket_nbytes());
    }
    EXPECT_TRUE(st.verified);
    EXPECT_EQ(st.collectives, nb);
    auto views = layout.views(buckets);
    for (size_t i = 0; i < views.size(); ++i) {
      EXPECT_TRUE(views[i].equal(masters[i].to(at::kBFloat16))) << specs[i].name;
    }
  });
  for (const auto& e : errors) EXPECT_EQ(e, "");
}

// Tensor-parallel lanes (issue 55, item 4): engines of two ranks, each keeping its half of every
// tensor in buckets of its own. Two senders (fan-out) slice each bucket per lane inside their
// stream's runs, and each lane's bytes go over that lane's own communicators: an engine rank
// receives its half of the model and nothing else, one collective per bucket and lane, verified.
// The stream is gathered once for both lanes. A member with another lane count is refused at setup.
TEST(WeightSyncTest, LanesCarryEachEngineRanksSlicesOverCommunicatorsOfTheirOwn) {
  constexpr int64_t kRows = 64;  // each lane's rows: 64 x 16 bf16, 2 KiB (no padding)
  std::vector<TensorSpec> whole_specs, specs;
  for (int i = 0; i < 7; ++i) {
    whole_specs.push_back({"w" + std::to_string(i), {2 * kRows, 16}, at::kBFloat16});
    specs.push_back({"w" + std::to_string(i), {kRows, 16}, at::kBFloat16});
  }
  const auto whole = WeightLayout::plan(whole_specs, 8192);
  const auto layout = WeightLayout::plan(specs, 4096);  // one lane's: 2 tensors a bucket
  const auto nb = static_cast<int64_t>(layout.buckets().size());
  ASSERT_EQ(nb, 4);
  std::vector<at::Tensor> masters;
  for (const auto& spec : whole_specs) masters.push_back(at::randn(spec.shape, at::kFloat));
  const LaneSlicer slice = [](int lane, int64_t, const at::Tensor& full) {
    return full.narrow(0, lane * kRows, kRows);
  };
  Topology topo{1, 1, 2};
  topo.lanes = 2;
  auto errors = run_ranks(3, milliseconds(10000), [&](int r, auto& comm, const StorePtr& store) {
    Groups g = make_groups(std::move(comm), topo);
    WeightSyncOptions o;
    o.verify = true;
    o.lanes = 2;
    o.stream_chunk_bytes = 4 * layout.bucket_bytes();  // runs of 2 buckets a lane: chunk / lanes
    WeightSync ws(g, store, layout, o);
    if (g.role == Role::kTrain) {
      std::vector<std::pair<int64_t, int64_t>> runs;
      SendStream stream{[&](int64_t first, int64_t end) { runs.emplace_back(first, end); }};
      const SyncStats st = ws.send_lanes(masters, slice, 1, &stream);
      EXPECT_EQ(runs, layout.chunks(2 * layout.bucket_bytes()));  // once for both lanes
      ASSERT_EQ(st.lane_bytes.size(), 2u);
      EXPECT_EQ(st.lane_bytes[0], st.lane_bytes[1]);
      EXPECT_EQ(st.bytes, st.lane_bytes[0] + st.lane_bytes[1]);
      EXPECT_THROW(ws.send(masters, 2), std::invalid_argument);  // whole tensors need a slicer
      return;
    }
    std::vector<at::Tensor> rank0 = layout.allocate_buckets(at::TensorOptions());
    std::vector<at::Tensor> rank1 = layout.allocate_buckets(at::TensorOptions());
    const SyncStats st = ws.receive_lanes({&rank0, &rank1}, 1);
    EXPECT_TRUE(st.verified);
    EXPECT_EQ(st.collectives, 2 * nb);
    // Each engine rank received its share: half the whole model's bytes.
    EXPECT_EQ(st.lane_bytes,
              (std::vector<int64_t>{whole.total_bytes() / 2, whole.total_bytes() / 2}));
    for (int lane = 0; lane < 2; ++lane) {
      int64_t ops = 0;
      for (int t = 0; t < 2; ++t) ops += g.sync_root(t, lane)->op_count();
      EXPECT_EQ(ops, nb) << "lane " << lane
                         << ": one broadcast per bucket, on its own communicators";
      const auto views = layout.views(lane == 0 ? rank0 : rank1);
      for (size_t i = 0; i < views.size(); ++i) {
        EXPECT_TRUE(views[i].equal(slice(lane, 0, masters[i]).to(at::kBFloat16))) << lane << i;
      }
    }
  });
  for (const auto& e : errors) EXPECT_EQ(e, "");

  errors = run_ranks(3, milliseconds(5000), [&](int, auto& comm, const StorePtr& store) {
    Groups g = make_groups(std::move(comm), topo);
    WeightSyncOptions o;
    o.lanes = g.role == Role::kTrain ? 2 : 1;
    WeightSync ws(g, store, layout, o);
  });
  for (const auto& e : errors) {
    EXPECT_NE(e.find("tensor-parallel lane(s)"), std::string::npos) << e;
  }
}

}  // namespace
}  // namespace crl::sync
