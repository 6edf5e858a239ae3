// WeightSync's ipc transport with every rank a thread of this process: the protocol (batches,
// acknowledgements, in-flight buffer reuse, version handshake, --sync-verify, deadlines and their
// errors) over host memory, which runs here; and, where a GPU is present (ctest label `gpu`), the
// CUDA side of a region in one process. Two processes on one GPU: ctest gpu.sync_check_ipc_*.
#include <ATen/ATen.h>
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include "sync/bucket_ipc.h"
#include "sync/cuda_ipc.h"
#include "sync/groups.h"
#include "sync/store.h"
#include "sync/weight_sync.h"
#include "tests/test_utils.h"

namespace crl::sync {
namespace {

using std::chrono::milliseconds;
using test::run_ranks;

std::vector<TensorSpec> make_specs(int n, at::ScalarType dtype) {
  std::vector<TensorSpec> specs;
  for (int i = 0; i < n; ++i) specs.push_back({"w" + std::to_string(i), {29, 13 + i}, dtype});
  return specs;
}

WeightSyncOptions ipc_options() {
  WeightSyncOptions o;
  o.transport = SyncTransport::kIpc;
  o.verify = true;
  return o;
}

// fp32 masters cast into bf16 buckets, 2 train + 2 infer, 3 versions (more buckets per sender
// than send buffers, so pull reuses its 2 buffers after acknowledgements). Push writes straight
// into the engines' buckets: no send buffer, and nothing changes in an engine's buckets before it
// enters receive() (checked after ready(), with time for a sender that wrote early to do so).
void cast_buckets_arrive_bit_identical(bool push) {
  auto specs = make_specs(12, at::kBFloat16);
  auto layout = WeightLayout::plan(specs, 2048);
  ASSERT_GE(layout.buckets().size(), 6u);
  Topology topo{1, 2, 2};
  const int versions = 3;
  auto masters_of = [&](int64_t v) {
    std::vector<at::Tensor> m;
    for (size_t i = 0; i < specs.size(); ++i) {
      const int64_t n = specs[i].shape[0] * specs[i].shape[1];
      m.push_back(at::arange(n, at::kFloat)
                      .reshape(specs[i].shape)
                      .mul(1.0 / (1.0 + static_cast<double>(i)))
                      .add(0.5 * static_cast<double>(v)));
    }
    return m;
  };
  WeightSyncOptions opts = ipc_options();
  opts.ipc_push = push;
  auto errors = run_ranks(4, milliseconds(10000), [&](int r, auto& comm, const StorePtr& store) {
    Groups g = make_groups(std::move(comm), topo);
    WeightSync ws(g, store, layout, opts);
    EXPECT_EQ(ws.transport(0), SyncTransport::kIpc);
    EXPECT_EQ(ws.transport(1), SyncTransport::kIpc);
    if (g.role == Role::kTrain) {
      for (int64_t v = 1; v <= versions; ++v) {
        ws.wait_requested(v, Clock::now() + milliseconds(10000));
        auto st = ws.send(masters_of(v), v);
        int t = topo.role_index(g.world_rank);
        int64_t mine = 0;
        for (const auto& b : layout.buckets()) mine += ws.sends(b.index) ? 1 : 0;
        EXPECT_EQ(st.collectives, mine);
        if (push) {
          EXPECT_EQ(st.extra_bytes, 0);
        } else {
          EXPECT_LE(st.extra_bytes, 2 * layout.max_bucket_nbytes());
        }
      }
    } else {
      auto buckets = layout.allocate_buckets(at::TensorOptions());
      for (auto& b : buckets) b.zero_();
      for (int64_t v = 1; v <= versions; ++v) {
        ws.request(v);
        auto deadline = Clock::now() + milliseconds(10000);
        while (!ws.ready(v)) ASSERT_LT(Clock::now(), deadline) << "version " << v << " not ready";
        if (push) {
          std::vector<at::Tensor> before;
          for (const auto& b : buckets) before.push_back(b.clone());
          std::this_thread::sleep_for(milliseconds(30));
          for (size_t b = 0; b < buckets.size(); ++b) {
            EXPECT_TRUE(buckets[b].equal(before[b])) << "bucket " << b << " changed before receive";
          }
        }
        auto st = ws.receive(buckets, v);
        EXPECT_TRUE(st.verified);
        EXPECT_EQ(st.collectives, static_cast<int64_t>(layout.buckets().size()));
        EXPECT_EQ(st.extra_bytes, 0);
        auto views = layout.views(buckets);
        auto want = masters_of(v);
        for (size_t i = 0; i < views.size(); ++i) {
          EXPECT_TRUE(views[i].equal(want[i].to(at::kBFloat16))) << specs[i].name << " v" << v;
        }
      }
    }
  });
  for (const auto& e : errors) EXPECT_EQ(e, "");
}

TEST(WeightSyncIpcTest, CastBucketsArriveBitIdenticalOneHandOverPerBucket) {
  cast_buckets_arrive_bit_identical(/*push=*/false);
}

TEST(WeightSyncIpcTest, PushCastsIntoTheEnginesBucketsOnlyWhileTheyReceive) {
  cast_buckets_arrive_bit_identical(/*push=*/true);
}

// Dtypes equal: the trainer's flat storage is handed over as it is, all buckets in one batch.
TEST(WeightSyncIpcTest, FlatStorageIsHandedOverInOneBatchPerSender) {
  auto specs = make_specs(7, at::kFloat);
  auto layout = WeightLayout::plan(specs, 4096);
  ASSERT_GE(layout.buckets().size(), 3u);
  Topology topo{1, 3, 1};
  auto errors = run_ranks(4, milliseconds(10000), [&](int r, auto& comm, const StorePtr& store) {
    Groups g = make_groups(std::move(comm), topo);
    WeightSync ws(g, store, layout, ipc_options());
    if (g.role == Role::kTrain) {
      auto flat = layout.allocate_buckets(at::TensorOptions());
      auto views = layout.views(flat);
      for (int64_t v = 1; v <= 2; ++v) {
        for (size_t i = 0; i < views.size(); ++i) views[i].fill_(static_cast<float>(v * 100 + i));
        auto st = ws.send_buckets(flat, v);
        EXPECT_EQ(st.collectives, static_cast<int64_t>(layout.buckets().size()));
        EXPECT_EQ(st.extra_bytes, 0);
      }
    } else {
      auto buckets = layout.allocate_buckets(at::TensorOptions());
      for (int64_t v = 1; v <= 2; ++v) {
        while (!ws.ready(v)) std::this_thread::yield();
        auto st = ws.receive(buckets, v);
        EXPECT_TRUE(st.verified);
        EXPECT_EQ(st.collectives, static_cast<int64_t>(layout.buckets().size()));
        auto views = layout.views(buckets);
        for (size_t i = 0; i < views.size(); ++i) {
          EXPECT_TRUE(views[i].eq(static_cast<float>(v * 100 + i)).all().item<bool>()) << i;
        }
      }
    }
  });
  for (const auto& e : errors) EXPECT_EQ(e, "");
}

TEST(WeightSyncIpcTest, AutoOnTheCpuKeepsTheCommunicatorAndBaselinesRefuseIpc) {
  auto layout = WeightLayout::plan(make_specs(2, at::kFloat), 1 << 20);
  Topology topo{1, 1, 1};
  auto errors = run_ranks(2, milliseconds(5000), [&](int r, auto& comm, const StorePtr& store) {
    Groups g = make_groups(std::move(comm), topo);
    WeightSync ws(g, store, layout, WeightSyncOptions{});
    EXPECT_EQ(ws.transport(0), SyncTransport::kCommunicator);
    WeightSyncOptions pt = ipc_options();
    pt.mode = SyncMode::kPerTensor;
    ASSERT_THROWS_WITH(WeightSync(g, store, layout, pt), std::invalid_argument,
                       "the per-tensor baseline always uses the communicator");
  });
  for (const auto& e : errors) EXPECT_EQ(e, "");
}

// A receiver whose sender never sends: the error names op, group, ranks, version, bucket, bytes.
TEST(WeightSyncIpcTest, MissingBatchFailsAtTheDeadlineNamingVersionBucketAndBytes) {
  auto layout = WeightLayout::plan(make_specs(3, at::kFloat), 1 << 20);
  Topology topo{1, 1, 1};
  auto errors = run_ranks(2, milliseconds(300), [&](int r, auto& comm, const StorePtr& store) {
    Groups g = make_groups(std::move(comm), topo);
    WeightSync ws(g, store, layout, ipc_options());
    if (g.role == Role::kInfer) {
      auto buckets = layout.allocate_buckets(at::TensorOptions());
      ws.receive(buckets, 5);
    }
  });
  EXPECT_EQ(errors[1], "");
  const std::string& e = errors[0];
  EXPECT_NE(e.find("ipc: rank 1 (node 0, train 0) did not publish bucket 0 within 300 ms"),
            std::string::npos)
      << e;
  EXPECT_NE(e.find("op=ipc-receive group=sync.node0.root0"), std::string::npos) << e;
  EXPECT_NE(e.find(fmt::format("bytes={}", layout.buckets()[0].nbytes)), std::string::npos) << e;
  EXPECT_NE(e.find("version=5 buckets=[0]"), std::string::npos) << e;
}

// A pull sender whose receiver never copies: it does not return (nor reuse buffers) before the
// acks, and fails at the deadline naming the receiver.
TEST(WeightSyncIpcTest, MissingAckFailsTheSenderNamingTheReceiver) {
  auto layout = WeightLayout::plan(make_specs(3, at::kFloat), 1 << 20);
  Topology topo{1, 1, 1};
  WeightSyncOptions pull = ipc_options();
  pull.ipc_push = false;
  auto errors = run_ranks(2, milliseconds(300), [&](int r, auto& comm, const StorePtr& store) {
    Groups g = make_groups(std::move(comm), topo);
    WeightSync ws(g, store, layout, pull);
    if (g.role == Role::kTrain) {
      std::vector<at::Tensor> masters;
      for (const auto& s : layout.specs()) masters.push_back(at::ones(s.shape));
      ws.send(masters, 2);
    }
  });
  EXPECT_EQ(errors[0], "");
  const std::string& e = errors[1];
  EXPECT_NE(e.find("ipc: rank 0 (node 0, infer 0) never acknowledged the copy within 300 ms"),
            std::string::npos)
      << e;
  EXPECT_NE(e.find("op=ipc-send group=sync.node0.root0"), std::string::npos) << e;
  EXPECT_NE(e.find("version=2 buckets=[0]"), std::string::npos) << e;
}

// Push: an engine that never enters receive() never opens its buckets; the sender fails at the
// deadline naming it (and writes nothing).
TEST(WeightSyncIpcTest, PushSenderFailsNamingTheEngineThatNeverOpened) {
  auto layout = WeightLayout::plan(make_specs(3, at::kBFloat16), 1 << 20);
  Topology topo{1, 1, 1};
  auto errors = run_ranks(2, milliseconds(300), [&](int r, auto& comm, const StorePtr& store) {
    Groups g = make_groups(std::move(comm), topo);
    WeightSync ws(g, store, layout, ipc_options());
    if (g.role == Role::kTrain) {
      std::vector<at::Tensor> masters;
      for (const auto& s : layout.specs()) masters.push_back(at::ones(s.shape));
      ws.send(masters, 4);
    }
  });
  EXPECT_EQ(errors[0], "");
  const std::string& e = errors[1];
  EXPECT_NE(e.find("ipc: rank 0 (node 0, infer 0) never opened its weight buckets within 300 ms"),
            std::string::npos)
      << e;
  EXPECT_NE(e.find("op=ipc-push group=sync.node0.root0"), std::string::npos) << e;
  EXPECT_NE(e.find("version=4 buckets=[0]"), std::string::npos) << e;
}

// Push: a sender that dies after the engine opened its buckets (here: throws after its first
// bucket) leaves the engine waiting; it fails at the deadline naming the sender and its buckets.
TEST(WeightSyncIpcTest, PushReceiverFailsNamingTheSenderThatNeverFinished) {
  auto layout = WeightLayout::plan(make_specs(6, at::kBFloat16), 512);
  ASSERT_GE(layout.buckets().size(), 2u);
  Topology topo{1, 1, 1};
  WeightSyncOptions opts = ipc_options();
  opts.on_bucket_posted = [](int64_t) { throw std::runtime_error("sender died"); };
  auto errors = run_ranks(2, milliseconds(300), [&](int r, auto& comm, const StorePtr& store) {
    Groups g = make_groups(std::move(comm), topo);
    WeightSync ws(g, store, layout, opts);
    if (g.role == Role::kTrain) {
      std::vector<at::Tensor> masters;
      for (const auto& s : layout.specs()) masters.push_back(at::ones(s.shape));
      ws.send(masters, 3);
    } else {
      auto buckets = layout.allocate_buckets(at::TensorOptions());
      while (!ws.ready(3)) std::this_thread::yield();
      ws.receive(buckets, 3);
    }
  });
  EXPECT_NE(errors[1].find("sender died"), std::string::npos) << errors[1];
  const std::string& e = errors[0];
  EXPECT_NE(e.find("ipc: rank 1 (node 0, train 0) did not finish writing its buckets into this "
                   "engine within 300 ms"),
            std::string::npos)
      << e;
  EXPECT_NE(e.find("op=ipc-receive group=sync.node0.root0"), std::string::npos) << e;
  EXPECT_NE(e.find("version=3 buckets=[0, 1"), std::string::npos) << e;
}

TEST(WeightSyncIpcTest, HostRegionsFromAnotherProcessAreRefused) {
  auto mem = make_host_ipc_memory();
  at::Tensor src = at::arange(16, at::kFloat);
  IpcRegion r = mem->export_region(src);
  EXPECT_EQ(r.bytes, 64);
  at::Tensor dst = at::zeros({16}, at::kFloat);
  ASSERT_TRUE(mem->copy_async(r, dst)->done());
  EXPECT_TRUE(dst.equal(src));
  // The writable alias a push sender casts into: the exporter's own bytes.
  at::Tensor alias = mem->open_region(r);
  EXPECT_EQ(alias.numel(), 64);
  EXPECT_EQ(alias.data_ptr(), src.data_ptr());
  alias.narrow(0, 4, 4).copy_(at::full({1}, 42.0f).view(at::kByte));
  EXPECT_EQ(src[1].item<float>(), 42.0f);
  r.pid += 1;
  ASSERT_THROWS_WITH(mem->copy_async(r, dst), std::runtime_error, "shared only between ranks");
  ASSERT_THROWS_WITH(mem->open_region(r), std::runtime_error, "shared only between ranks");
  EXPECT_EQ(decode_handle(encode_handle(std::string("\x00\xff\x10", 3))),
            std::string("\x00\xff\x10", 3));
}

TEST(WeightSyncIpcTest, ChecksumDoesNotDependOnTheChunkSize) {
  for (int64_t n : {0, 5, 31, 32, 33, 100, 1000, 4099}) {
    at::Tensor t = at::randint(0, 256, {n}, at::kByte);
    uint64_t whole = checksum_bytes(t, int64_t{1} << 20);
    for (int64_t chunk : {32, 64, 96, 1024}) EXPECT_EQ(checksum_bytes(t, chunk), whole) << n;
  }
  EXPECT_THROW(checksum_bytes(at::zeros({4}), 48), std::invalid_argument);
}

// The paired layout (--colocate): N engines and N trainers, engine i fed by train rank i alone with
// every bucket. Here each trainer's weights differ (in a job they are equal), so a bucket from
// another pair's trainer shows. Casts (send()) or flat storage (send_buckets()), 2 versions.
void paired_sync(int n, const WeightSyncOptions& opts, bool flat) {
  SCOPED_TRACE(fmt::format("N = {}, transport {}, {}", n, sync_transport_name(opts.transport),
                           flat ? "flat" : (opts.ipc_push ? "cast, push" : "cast, pull")));
  auto specs = make_specs(5, flat ? at::kFloat : at::kBFloat16);
  auto layout = WeightLayout::plan(specs, 2048);
  ASSERT_GE(layout.buckets().size(), 3u);
  Topology topo{1, n, n};
  topo.paired = true;
  const int64_t nb = static_cast<int64_t>(layout.buckets().size());
  auto value = [](int64_t v, int pair, size_t i) {
    return static_cast<float>(v * 64 + pair * 6 + static_cast<int64_t>(i));  // exact in bf16
  };
  auto errors =
      run_ranks(2 * n, milliseconds(20000), [&](int r, auto& comm, const StorePtr& store) {
        Groups g = make_groups(std::move(comm), topo);
        const int pair = topo.role_index(g.world_rank);
        // Each rank is in its pair's group alone.
        for (int t = 0; t < n; ++t) {
          EXPECT_EQ(g.sync_roots[t] != nullptr, t == pair) << "rank " << r << " root " << t;
        }
        EXPECT_EQ(g.sync_roots[pair]->info().world_ranks, (std::vector<int>{n + pair, pair}));
        WeightSync ws(g, store, layout, opts);
        if (g.role == Role::kTrain) {
          auto flat_storage = layout.allocate_buckets(at::TensorOptions());
          auto views = layout.views(flat_storage);
          for (int64_t v = 1; v <= 2; ++v) {
            ws.wait_requested(v, Clock::now() + milliseconds(20000));
            std::vector<at::Tensor> masters;
            for (size_t i = 0; i < specs.size(); ++i) {
              masters.push_back(at::full(specs[i].shape, value(v, pair, i)));
              views[i].fill_(value(v, pair, i));
            }
            auto st = flat ? ws.send_buckets(flat_storage, v) : ws.send(masters, v);
            EXPECT_EQ(st.collectives, nb);  // every bucket, to its one engine
          }
        } else {
          auto buckets = layout.allocate_buckets(at::TensorOptions());
          for (int64_t v = 1; v <= 2; ++v) {
            ws.request(v);
            auto deadline = Clock::now() + milliseconds(20000);
            while (!ws.ready(v)) ASSERT_LT(Clock::now(), deadline) << "version " << v;
            auto st = ws.receive(buckets, v);
            EXPECT_TRUE(st.verified);
            EXPECT_EQ(st.collectives, nb);
            auto views = layout.views(buckets);
            for (size_t i = 0; i < views.size(); ++i) {
              EXPECT_TRUE(views[i].to(at::kFloat).eq(value(v, pair, i)).all().item<bool>())
                  << "engine " << pair << " " << specs[i].name << " v" << v;
            }
          }
        }
      });
  for (const auto& e : errors) EXPECT_EQ(e, "");
}

TEST(WeightSyncPairedTest, EachEngineGetsEveryBucketFromItsOwnTrainerForOneToEightPairs) {
  WeightSyncOptions o;
  o.verify = true;
  for (int n = 1; n <= 8; ++n) paired_sync(n, o, /*flat=*/n % 2 == 0);
}

TEST(WeightSyncPairedTest, IpcPairsPushPullAndHandOverFlatStorage) {
  WeightSyncOptions push = ipc_options(), pull = ipc_options();
  pull.ipc_push = false;
  paired_sync(3, push, /*flat=*/false);
  paired_sync(3, pull, /*flat=*/false);
  paired_sync(3, push, /*flat=*/true);
}

// The per-tensor and raw baselines: each pair's trainer sends to its engine.
TEST(WeightSyncPairedTest, BaselinesSendFromEachPairsTrainer) {
  auto specs = make_specs(3, at::kFloat);
  auto layout = WeightLayout::plan(specs, 1 << 20);
  Topology topo{1, 2, 2};
  topo.paired = true;
  WeightSyncOptions pt;
  pt.mode = SyncMode::kPerTensor;
  auto errors = run_ranks(4, milliseconds(10000), [&](int r, auto& comm, const StorePtr& store) {
    Groups g = make_groups(std::move(comm), topo);
    const int pair = topo.role_index(g.world_rank);
    WeightSync ws(g, store, layout, pt);
    if (g.role == Role::kTrain) {
      std::vector<at::Tensor> masters;
      for (const auto& s : specs) masters.push_back(at::full(s.shape, 7.0f + pair));
      EXPECT_EQ(ws.send(masters, 1).collectives, static_cast<int64_t>(specs.size()));
    } else {
      auto buckets = layout.allocate_buckets(at::TensorOptions());
      while (!ws.ready(1)) std::this_thread::yield();
      ws.receive(buckets, 1);
      for (const auto& v : layout.views(buckets)) EXPECT_TRUE(v.eq(7.0f + pair).all().item<bool>());
    }
  });
  for (const auto& e : errors) EXPECT_EQ(e, "");
}

// One process on a GPU (label `gpu` through the Cuda* filter): a region names its allocation's
// base, with the bucket's offset in it, and CUDA refuses to open it in the exporting process.
TEST(CudaIpcTest, RegionsNameTheAllocationAndItsOffset) {
  if (!at::hasCUDA() || cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device";
  CudaDeviceInfo info = cuda_device_info(0);
  EXPECT_FALSE(info.pci_bus_id.empty());
  EXPECT_EQ(identify_device(at::Device("cuda:0")).kind, "cuda");
  auto mem = make_cuda_ipc_memory(0);
  at::Tensor whole = at::zeros({1 << 20}, at::TensorOptions().dtype(at::kByte).device(at::kCUDA));
  IpcRegion a = mem->export_region(whole.narrow(0, 0, 4096));
  IpcRegion b = mem->export_region(whole.narrow(0, 8192, 1000));
  EXPECT_EQ(a.handle, b.handle);
  EXPECT_EQ(b.offset - a.offset, 8192);
  EXPECT_EQ(b.bytes, 1000);
  EXPECT_TRUE(mem->wait_writes(Clock::now() + std::chrono::seconds(10)));
  ASSERT_THROWS_WITH(mem->copy_async(a, whole.narrow(0, 4096, 4096)), std::runtime_error,
                     "in the process that exported it");
  ASSERT_THROWS_WITH(mem->open_region(a), std::runtime_error, "in the process that exported it");
  ASSERT_THROWS_WITH(mem->export_region(at::zeros({4})), std::runtime_error, "cuda:0 only");
}

}  // namespace
}  // namespace crl::sync
