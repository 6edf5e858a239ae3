#include "sync/coordinator.h"

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <ifaddrs.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <thread>

#include "tests/test_utils.h"

namespace crl::sync {
namespace {

using std::chrono::milliseconds;

class CoordinatorTest : public ::testing::Test {
 protected:
  StorePtr store_ = host_store(0, milliseconds(5000));
  Coordinator coord_{store_, "rl/"};

  bool has(const std::string& key) { return store_->check({key}); }
  Clock::time_point soon() { return Clock::now() + milliseconds(50); }
};

TEST_F(CoordinatorTest, ReportsLiveUnderItsScopeUntilCollected) {
  coord_.publish(3, 0, "a");
  coord_.publish(3, 1, "b");
  EXPECT_TRUE(has("rl/m/s3/r0"));
  EXPECT_EQ(coord_.collect(3, 2, milliseconds(1000)), (std::vector<std::string>{"a", "b"}));
  EXPECT_FALSE(has("rl/m/s3/r0"));  // the store does not grow with the steps
  EXPECT_FALSE(has("rl/m/s3/r1"));
}

TEST_F(CoordinatorTest, CollectNamesTheMissingReport) {
  coord_.publish(4, 0, "a");
  ASSERT_THROWS_WITH(coord_.collect(4, 2, milliseconds(50)), std::runtime_error,
                     "step 5 metrics of rank 1: store key 'rl/m/s4/r1' was not set in time");
}

TEST_F(CoordinatorTest, CountersAddReadAndRemovePerStep) {
  EXPECT_EQ(coord_.add("zr", 2, "have1", 1), 1);
  EXPECT_EQ(coord_.add("zr", 2, "have1", 1), 2);
  EXPECT_EQ(coord_.read("zr", 2, "have1"), 2);
  EXPECT_EQ(coord_.read("zr", 3, "have1"), 0);  // another step's
  EXPECT_TRUE(has("rl/zr/s2/have1"));
  coord_.remove("zr", 2, "have1");
  EXPECT_FALSE(has("rl/zr/s2/have1"));
}

TEST_F(CoordinatorTest, BarrierPassesOnceEveryRankArrivedAndDropsThePreviousOnesKeys) {
  coord_.barrier("a", 1, soon());
  EXPECT_TRUE(has("rl/bar/a/n"));
  coord_.barrier("b", 1, soon(), "a");
  EXPECT_FALSE(has("rl/bar/a/n"));
  EXPECT_FALSE(has("rl/bar/a/done"));
  EXPECT_TRUE(has("rl/bar/b/done"));
}

TEST_F(CoordinatorTest, BarrierNamesItselfAndWhoArrivedAtTheDeadline) {
  ASSERT_THROWS_WITH(coord_.barrier("rollouts-s0", 2, soon()), std::runtime_error,
                     "only 1 of 2 ranks reached 'rollouts-s0' before the deadline");
}

TEST_F(CoordinatorTest, ResultsAreKeptAndAMissingOneIsNamed) {
  coord_.publish_result("eval", "start", "x");
  EXPECT_EQ(coord_.wait_result("eval", "start", soon(), "start eval"), "x");
  EXPECT_EQ(coord_.wait_result("eval", "start", soon(), "start eval"), "x");
  ASSERT_THROWS_WITH(coord_.wait_result("eval", "s3", soon(), "step 4 eval"), std::runtime_error,
                     "step 4 eval: store key 'rl/eval/s3' was not set in time");
}

TEST_F(CoordinatorTest, ConnectUsesTheJobsStorePrefix) {
  RankEnv env;
  env.master_addr = "127.0.0.1";
  env.master_port = store_port(store_);
  env.store_prefix = "crl/job/";
  auto own = Coordinator::connect(env, milliseconds(5000), "rl/");
  own->publish(0, 0, "p");
  EXPECT_FALSE(has("rl/m/s0/r0"));  // not the unprefixed key
  auto other = Coordinator::connect(env, milliseconds(5000), "rl/");
  EXPECT_EQ(other->collect(0, 1, milliseconds(1000)), std::vector<std::string>{"p"});
}

// A one-node job's store is tied to the loopback device (libtorch 1.13's TCPStore listens on every
// interface, unauthenticated): the option is set on its listening socket, clients through
// 127.0.0.1 connect, and a connection to the host's own network address is refused (the kernel
// matches the address's device, so this stands for another host's connection).
TEST(StoreTest, AOneNodeStoreIsTiedToLoopbackAndRefusesTheNetwork) {
  StorePtr server = host_store(0, milliseconds(5000));
  std::string why;
  ASSERT_TRUE(bind_store_to_loopback(server, &why)) << why;
  const int port = store_port(server);
  // The listening socket carries the device.
  int tied = 0;
  for (int fd = 0; fd < 1024; ++fd) {
    int listening = 0;
    socklen_t len = sizeof(listening);
    if (getsockopt(fd, SOL_SOCKET, SO_ACCEPTCONN, &listening, &len) != 0 || !listening) continue;
    sockaddr_in a{};
    len = sizeof(a);
    if (getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) != 0) continue;
    if (ntohs(a.sin_port) != port) continue;
    char dev[32] = {0};
    len = sizeof(dev);
    ASSERT_EQ(getsockopt(fd, SOL_SOCKET, SO_BINDTODEVICE, dev, &len), 0);
    EXPECT_STREQ(dev, "lo");
    ++tied;
  }
  EXPECT_GE(tied, 1);
  store_set(server, "k", "v");
  auto local = connect_store("127.0.0.1", port, milliseconds(3000));
  EXPECT_EQ(store_get(local, "k", Clock::now() + milliseconds(1000), "test"), "v");
  ifaddrs* ifs = nullptr;
  std::string own;
  if (getifaddrs(&ifs) == 0) {
    for (ifaddrs* i = ifs; i && own.empty(); i = i->ifa_next) {
      if (!i->ifa_addr || i->ifa_addr->sa_family != AF_INET) continue;
      char buf[INET_ADDRSTRLEN] = {0};
      inet_ntop(AF_INET, &reinterpret_cast<sockaddr_in*>(i->ifa_addr)->sin_addr, buf, sizeof(buf));
      if (std::string(buf).rfind("127.", 0) != 0) own = buf;
    }
    freeifaddrs(ifs);
  }
  if (own.empty()) GTEST_SKIP() << "no non-loopback IPv4 address to try the refusal through";
  {
    const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
    timeval tv{1, 0};
    ::setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(static_cast<uint16_t>(port));
    inet_pton(AF_INET, own.c_str(), &a.sin_addr);
    EXPECT_NE(::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)), 0)
        << "the store took a connection through " << own;
    ::close(fd);
  }
}

// The job's failure key: absent, polls go on; once a launcher set it, the next poll throws naming
// the failure, and the first failure stays the one named.
TEST(StoreTest, APollThrowsTheJobsFailureOnceALauncherSetIt) {
  StorePtr store = host_store(0, milliseconds(5000));
  EXPECT_FALSE(store_has(store, "absent"));
  EXPECT_EQ(job_failure(store), "");
  report_job_failure(store, "rank 3 (node 1, train 0) killed by signal 9");
  report_job_failure(store, "rank 2 (node 1, infer 0) exit code 1");
  EXPECT_EQ(job_failure(store), "rank 3 (node 1, train 0) killed by signal 9");
  std::this_thread::sleep_for(milliseconds(250));  // past the per-thread look interval
  try {
    (void)wait_keys(store, {"absent"}, Clock::now() + milliseconds(2000));
    FAIL() << "wait_keys did not throw";
  } catch (const JobFailed& e) {
    EXPECT_STREQ(e.what(), "the job failed elsewhere: rank 3 (node 1, train 0) killed by signal 9");
  }
}

}  // namespace
}  // namespace crl::sync
