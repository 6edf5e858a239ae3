// The weight-sync transport rule (select_transport, a pure function) and the device identities it
// reads, on CPU: one GPU -> ipc, distinct GPUs -> communicator, a mix -> an error naming ranks and
// GPUs, CPU -> communicator.
#include "sync/sync_transport.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "sync/cuda_ipc.h"
#include "sync/nccl_communicator.h"
#include "tests/test_utils.h"

namespace crl::sync {
namespace {

DeviceIdentity gpu(const std::string& uuid, int index = 0, const std::string& host = "node-a") {
  DeviceIdentity d;
  d.host = host;
  d.pid = 100 + index;
  d.kind = "cuda";
  d.gpu = uuid;
  d.pci = "0000:" + uuid.substr(uuid.size() - 2) + ":00.0";
  d.index = index;
  return d;
}

DeviceIdentity cpu(int64_t pid, const std::string& host = "node-a") {
  DeviceIdentity d;
  d.host = host;
  d.pid = pid;
  return d;
}

// Train rank 0 first, then the node's infer ranks, as WeightSync builds a sync_root group.
std::vector<SyncMember> group(const std::vector<DeviceIdentity>& devices) {
  std::vector<SyncMember> m;
  for (size_t r = 0; r < devices.size(); ++r) {
    std::string who =
        r == 0 ? "rank 2 (node 0, train 0)"
               : "rank " + std::to_string(r - 1) + " (node 0, infer " + std::to_string(r - 1) + ")";
    m.push_back({who, devices[r]});
  }
  return m;
}

const auto kAuto = SyncTransport::kAuto;
const auto kIpc = SyncTransport::kIpc;
const auto kComm = SyncTransport::kCommunicator;

TEST(SyncTransportTest, AllMembersOnOneGpuUseIpc) {
  auto g = group({gpu("GPU-aa", 0), gpu("GPU-aa", 0), gpu("GPU-aa", 0)});
  EXPECT_EQ(select_transport(kAuto, "sync.node0.root0", g), kIpc);
  EXPECT_EQ(select_transport(kIpc, "sync.node0.root0", g), kIpc);
  // Forcing the communicator is the caller's choice (e.g. a benchmark over Gloo).
  EXPECT_EQ(select_transport(kComm, "sync.node0.root0", g), kComm);
}

TEST(SyncTransportTest, TheSameGpuSeenUnderDifferentOrdinalsIsStillOneGpu) {
  // CUDA_VISIBLE_DEVICES may number one GPU differently per process: the UUID decides.
  auto g = group({gpu("GPU-aa", 0), gpu("GPU-aa", 3)});
  EXPECT_EQ(select_transport(kAuto, "g", g), kIpc);
}

TEST(SyncTransportTest, DistinctGpusUseTheCommunicator) {
  auto g = group({gpu("GPU-aa", 0), gpu("GPU-bb", 1), gpu("GPU-cc", 2)});
  EXPECT_EQ(select_transport(kAuto, "sync.node0.root0", g), kComm);
  EXPECT_EQ(select_transport(kComm, "sync.node0.root0", g), kComm);
  ASSERT_THROWS_WITH(select_transport(kIpc, "sync.node0.root0", g), std::runtime_error,
                     "ipc transport requested, but the members are on distinct GPUs");
}

TEST(SyncTransportTest, SameUuidOnAnotherHostIsAnotherGpu) {
  auto g = group({gpu("GPU-aa", 0, "node-a"), gpu("GPU-aa", 0, "node-b")});
  EXPECT_EQ(select_transport(kAuto, "g", g), kComm);
}

TEST(SyncTransportTest, SomeSharingAGpuAndSomeNotIsAnErrorNamingRanksAndGpus) {
  auto g = group({gpu("GPU-aa", 0), gpu("GPU-aa", 0), gpu("GPU-bb", 1)});
  try {
    select_transport(kAuto, "sync.node0.root0", g);
    ADD_FAILURE() << "no error";
  } catch (const std::runtime_error& e) {
    std::string m = e.what();
    EXPECT_NE(m.find("weight sync group sync.node0.root0"), std::string::npos) << m;
    EXPECT_NE(m.find("rank 2 (node 0, train 0) and rank 0 (node 0, infer 0) share cuda:0 GPU-aa "
                     "(pci 0000:aa:00.0) on node-a"),
              std::string::npos)
        << m;
    EXPECT_NE(m.find("rank 1 (node 0, infer 1) on cuda:1 GPU-bb (pci 0000:bb:00.0) on node-a"),
              std::string::npos)
        << m;
  }
  // Forcing ipc does not make it work either.
  ASSERT_THROWS_WITH(select_transport(kIpc, "g", g), std::runtime_error, "not every member");
}

TEST(SyncTransportTest, CpuAndCudaMembersMixedIsAnError) {
  auto g = group({gpu("GPU-aa", 0), cpu(7)});
  ASSERT_THROWS_WITH(select_transport(kAuto, "g", g), std::runtime_error,
                     "some members' weight buckets are on the CPU and others on a GPU");
}

TEST(SyncTransportTest, CpuMembersUseTheCommunicator) {
  auto processes = group({cpu(10), cpu(11), cpu(12)});
  EXPECT_EQ(select_transport(kAuto, "g", processes), kComm);
  ASSERT_THROWS_WITH(select_transport(kIpc, "g", processes), std::runtime_error,
                     "CPU buckets can be handed over only between ranks of one process");
  // Ranks as threads of one process (tests) may force ipc over host memory; auto stays put.
  auto threads = group({cpu(10), cpu(10)});
  EXPECT_EQ(select_transport(kAuto, "g", threads), kComm);
  EXPECT_EQ(select_transport(kIpc, "g", threads), kIpc);
}

TEST(SyncTransportTest, NamesParseAndIdentitiesRoundTrip) {
  for (auto t : {kAuto, kComm, kIpc}) EXPECT_EQ(parse_sync_transport(sync_transport_name(t)), t);
  EXPECT_THROW(parse_sync_transport("nccl"), std::invalid_argument);
  DeviceIdentity d = gpu("GPU-5e1c", 2);
  DeviceIdentity back = DeviceIdentity::from_json(d.to_json());
  EXPECT_EQ(back.describe(), d.describe());
  EXPECT_TRUE(back.shares_memory_with(d));
  EXPECT_THROW(DeviceIdentity::from_json("{\"host\": 1}"), std::invalid_argument);
  DeviceIdentity here = identify_device(at::kCPU);
  EXPECT_FALSE(here.is_cuda());
  EXPECT_FALSE(here.host.empty());
}

TEST(SyncTransportTest, RanksSharingAGpuGetGlooAndRefuseNccl) {
  EXPECT_EQ(resolve_comm_backend("auto", true, /*ranks_share_gpu=*/true), "gloo");
  EXPECT_EQ(resolve_comm_backend("gloo", true, true), "gloo");
  ASSERT_THROWS_WITH(resolve_comm_backend("nccl", true, true), std::invalid_argument,
                     "NCCL cannot hold two ranks on one device");
  // On the CPU sharing means nothing.
  EXPECT_EQ(resolve_comm_backend("auto", false, true), "gloo");
}

TEST(SyncTransportTest, CudaWithoutADeviceIsAClearError) {
  std::string why;
  if (cuda_runtime_available(&why)) GTEST_SKIP() << "a CUDA device is present";
  EXPECT_FALSE(why.empty());
  EXPECT_EQ(cuda_device_count(), 0);
  ASSERT_THROWS_WITH(make_cuda_ipc_memory(0), std::runtime_error, "CUDA IPC is not usable here");
  ASSERT_THROWS_WITH(identify_device(at::Device("cuda:0")), std::runtime_error, "CUDA");
}

}  // namespace
}  // namespace crl::sync
