#include "sync/coordinator.h"

#include <gtest/gtest.h>

#include <chrono>

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

}  // namespace
}  // namespace crl::sync
