// TpGroup's gather to the leader, over Gloo communicators (ranks in other processes, here threads)
// and in one process (LocalTpHub): rank 0 gets every part in rank order, the others nothing.
#include "sync/tp_group.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <chrono>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "sync/communicator.h"
#include "sync/store.h"
#include "tests/test_utils.h"

namespace crl::sync {
namespace {

using std::chrono::milliseconds;

constexpr int kRanks = 3;

// Rank r's part: 2 x 3 values r * 100 + 0..5.
at::Tensor part_of(int r) { return at::arange(6, at::kFloat).view({2, 3}) + 100.0 * r; }

// One rank's gather; returns what it received (undefined on a follower).
at::Tensor gather_part(TpGroup& g) {
  at::Tensor out;
  if (g.rank() == 0) out = at::full({g.size(), 2, 3}, -1.0f);
  g.gather_to_leader(part_of(g.rank()), out);
  return out;
}

void expect_every_part_in_rank_order(const at::Tensor& out) {
  ASSERT_TRUE(out.defined());
  ASSERT_EQ(out.size(0), kRanks);
  for (int r = 0; r < kRanks; ++r) EXPECT_TRUE(at::equal(out[r], part_of(r))) << "part " << r;
}

TEST(TpGroupTest, OverCommunicatorsTheLeaderGetsEveryPartAndAFollowerOnlySends) {
  std::vector<at::Tensor> got(kRanks);
  std::vector<int64_t> ops(kRanks);
  auto errors =
      test::run_ranks(kRanks, milliseconds(10000), [&](int r, auto& comm, const StorePtr&) {
        const auto group = make_tp_group(*comm, at::kCPU);
        const int64_t before = comm->op_count();
        got[r] = gather_part(*group);
        ops[r] = comm->op_count() - before;
      });
  for (const auto& e : errors) EXPECT_EQ(e, "");
  expect_every_part_in_rank_order(got[0]);
  EXPECT_EQ(ops[0], kRanks - 1);  // a receive from each follower
  for (int r = 1; r < kRanks; ++r) {
    EXPECT_FALSE(got[r].defined());
    EXPECT_EQ(ops[r], 1) << "rank " << r << ": one send, nothing received";
  }
}

TEST(TpGroupTest, InOneProcessTheLeaderGetsEveryPartTwiceInARow) {
  LocalTpHub hub(kRanks, milliseconds(10000));
  std::vector<at::Tensor> got(kRanks), again(kRanks);
  std::vector<std::string> errors(kRanks);
  std::vector<std::thread> threads;
  for (int r = 0; r < kRanks; ++r) {
    threads.emplace_back([&, r] {
      try {
        const auto group = hub.join(r, at::kCPU);
        got[r] = gather_part(*group);
        again[r] = gather_part(*group);  // the barriers let a second gather follow at once
      } catch (const std::exception& e) {
        errors[r] = e.what();
      }
    });
  }
  for (auto& t : threads) t.join();
  for (const auto& e : errors) EXPECT_EQ(e, "");
  expect_every_part_in_rank_order(got[0]);
  expect_every_part_in_rank_order(again[0]);
  for (int r = 1; r < kRanks; ++r) EXPECT_FALSE(got[r].defined() || again[r].defined());
}

TEST(TpGroupTest, AGatherWithTheWrongOutputIsRefusedNamingTheOpAndTheGroup) {
  LocalTpHub hub(2, milliseconds(10000));
  std::vector<std::string> errors(2);
  std::vector<std::thread> threads;
  for (int r = 0; r < 2; ++r) {
    threads.emplace_back([&, r] {
      try {
        const auto group = hub.join(r, at::kCPU);
        // The leader's output one part short; the follower passes one it must not.
        group->gather_to_leader(part_of(r), at::empty({r == 0 ? 1 : 2, 2, 3}));
      } catch (const CollectiveError& e) {
        errors[r] = e.what();
      }
    });
  }
  for (auto& t : threads) t.join();
  for (int r = 0; r < 2; ++r) {
    EXPECT_NE(errors[r].find("gather_to_leader on group tp"), std::string::npos) << errors[r];
    EXPECT_NE(errors[r].find("rank " + std::to_string(r) + " of 2"), std::string::npos)
        << errors[r];
    EXPECT_NE(errors[r].find("24 bytes a rank"), std::string::npos) << errors[r];
  }
}

}  // namespace
}  // namespace crl::sync
