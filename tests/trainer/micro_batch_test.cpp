#include "trainer/micro_batch.h"

#include <gtest/gtest.h>

#include "tests/test_utils.h"
#include "trainer/rollout_consumer.h"

namespace crl::trainer {
namespace {

SampleGroup group(std::vector<int32_t> prompt, std::vector<std::vector<int32_t>> completions,
                  std::vector<double> rewards) {
  SampleGroup g;
  g.prompt_ids = std::move(prompt);
  for (size_t i = 0; i < completions.size(); ++i) {
    Sample s;
    s.completion_ids = completions[i];
    for (size_t j = 0; j < completions[i].size(); ++j) s.logprobs.push_back(-0.5f - 0.1f * j);
    s.reward = rewards[i];
    g.samples.push_back(std::move(s));
  }
  return g;
}

TEST(MicroBatchTest, GroupAdvantagesAreNormalisedPerGroup) {
  std::vector<SampleGroup> groups = {group({1}, {{5}, {6}, {7}, {8}}, {1, 0, 0, 1}),
                                     group({2}, {{5}, {6}}, {3, 3}), group({3}, {{5}}, {1})};
  compute_group_advantages(groups, 0.0);
  const double s = std::sqrt(1.0 / 3.0);  // Bessel-corrected std of {1, 0, 0, 1}
  EXPECT_NEAR(groups[0].samples[0].advantage, 0.5 / s, 1e-12);
  EXPECT_NEAR(groups[0].samples[1].advantage, -0.5 / s, 1e-12);
  EXPECT_EQ(groups[1].samples[0].advantage, 0.0);  // equal rewards: no signal, even with eps 0
  EXPECT_EQ(groups[2].samples[0].advantage, 0.0);  // a group of one
}

// Equal partial-credit rewards are equal: eight scores of 0.1 (whose computed mean and spread
// are rounding: std ~1e-17, advantages ~1e-13 without the check) get advantage 0 exactly, as
// eight 0s do; rewards that differ by a real amount still get theirs.
TEST(MicroBatchTest, EqualPartialCreditRewardsGiveNoAdvantage) {
  for (double r : {0.1, 0.2, 0.7, 1.1, 123.4}) {
    SampleGroup g =
        group({1}, std::vector<std::vector<int32_t>>(8, {5}), std::vector<double>(8, r));
    compute_group_advantages(g);
    for (const Sample& s : g.samples) EXPECT_EQ(s.advantage, 0.0) << r;
  }
  SampleGroup g = group({1}, {{5}, {6}}, {0.1, 0.1 + 1e-6});
  compute_group_advantages(g, 0.0);
  EXPECT_NEAR(g.samples[1].advantage, 1 / std::sqrt(2.0), 1e-6);
}

TEST(MicroBatchTest, PackerConcatenatesWholeSequencesUnderTheTokenCap) {
  std::vector<SampleGroup> groups = {group({1, 2, 3}, {{10, 11}, {12, 13, 14}}, {1, 0}),
                                     group({4, 5}, {{20}, {}, {21, 22, 23, 24}}, {0, 1, 1})};
  compute_group_advantages(groups);
  auto mbs = pack_micro_batches(groups, 8, /*weight_version=*/7);
  // Sequences: 5, 6, 3, (empty completion skipped), 6 tokens -> [5], [6], [3], [6] under a cap
  // of 8.
  ASSERT_EQ(mbs.size(), 4u);
  EXPECT_EQ(mbs[0].seq_lens, (std::vector<int64_t>{5}));
  EXPECT_EQ(mbs[2].seq_lens, (std::vector<int64_t>{3}));
  auto big = pack_micro_batches(groups, 64);
  ASSERT_EQ(big.size(), 1u);
  const MicroBatch& mb = big[0];
  EXPECT_EQ(mb.seq_lens, (std::vector<int64_t>{5, 6, 3, 6}));
  EXPECT_EQ(mb.num_tokens(), 20);
  EXPECT_EQ(mb.num_loss_tokens(), 2 + 3 + 1 + 4);
  std::vector<int64_t> want = {1,  2, 3, 10, 11, 1, 2,  3,  12, 13,
                               14, 4, 5, 20, 4,  5, 21, 22, 23, 24};
  test::expect_tensor_equal(mb.tokens, at::tensor(want, at::kLong));
  EXPECT_EQ(mb.loss_mask[2].item<float>(), 0.0f);
  EXPECT_EQ(mb.loss_mask[3].item<float>(), 1.0f);
  EXPECT_FLOAT_EQ(mb.old_logprobs[4].item<float>(), -0.6f);
  EXPECT_FLOAT_EQ(mb.advantages[3].item<float>(),
                  static_cast<float>(groups[0].samples[0].advantage));
  EXPECT_EQ(mb.advantages[0].item<float>(), 0.0f);
  test::expect_tensor_equal(mb.cu_seqlens(),
                            at::tensor(std::vector<int64_t>{0, 5, 11, 14, 20}, at::kLong));
  EXPECT_EQ(mbs[0].weight_version, 7);
}

TEST(MicroBatchTest, PackerRejectsASequenceLongerThanTheCapAndMismatchedLogprobs) {
  std::vector<SampleGroup> groups = {group({1, 2, 3}, {{10, 11, 12}}, {1})};
  ASSERT_THROWS_WITH(pack_micro_batches(groups, 5), std::invalid_argument,
                     "exceeds micro_batch_tokens 5");
  groups[0].samples[0].logprobs.pop_back();
  ASSERT_THROWS_WITH(pack_micro_batches(groups, 64), std::invalid_argument, "log-probs");
}

TEST(MicroBatchTest, SerializationRoundTripsEveryFieldInOneByteTensor) {
  std::vector<SampleGroup> groups = {group({1, 2, 3}, {{10, 11}, {12, 13, 14}}, {1, 0}),
                                     group({4, 5}, {{20}, {21, 22, 23, 24}}, {0, 1})};
  compute_group_advantages(groups);
  groups[1].samples[1].versions = {2, 2, 3, 3};  // an update landed mid-sample
  MicroBatch mb = pack_micro_batches(groups, 64, 3)[0];
  // Per token: -1 on prompt tokens, the sample's versions (or the packer's) on completions.
  at::Tensor tail = mb.versions.narrow(0, mb.num_tokens() - 6, 6).contiguous();
  EXPECT_EQ(std::vector<int64_t>(tail.data_ptr<int64_t>(), tail.data_ptr<int64_t>() + 6),
            std::vector<int64_t>({-1, -1, 2, 2, 3, 3}));
  at::Tensor bytes = serialize_micro_batch(mb);
  EXPECT_EQ(bytes.scalar_type(), at::kByte);
  EXPECT_EQ(bytes.dim(), 1);
  MicroBatch back = deserialize_micro_batch(bytes);
  EXPECT_EQ(back.seq_lens, mb.seq_lens);
  EXPECT_EQ(back.weight_version, 3);
  test::expect_tensor_equal(back.tokens, mb.tokens);
  test::expect_tensor_equal(back.loss_mask, mb.loss_mask);
  test::expect_tensor_equal(back.old_logprobs, mb.old_logprobs);
  test::expect_tensor_equal(back.advantages, mb.advantages);
  test::expect_tensor_equal(back.versions, mb.versions);

  ASSERT_THROWS_WITH(deserialize_micro_batch(bytes.narrow(0, 0, bytes.size(0) - 4)),
                     std::invalid_argument, "does not match");
  at::Tensor bad = bytes.clone();
  bad[0] = 0;
  ASSERT_THROWS_WITH(deserialize_micro_batch(bad), std::invalid_argument, "bad magic");
}

// PPO mini-batches: a step's sequences in order, in runs of equal counts (one more where they do
// not divide), micro-batches sliced at the runs' edges with every field following its tokens.
TEST(MicroBatchTest, MiniBatchesSplitTheSequencesEvenlyInOrder) {
  std::vector<SampleGroup> groups = {
      group({1, 2}, {{10}, {11, 12}, {13}}, {1, 0, 1}),
      group({3}, {{20, 21}, {22}, {23, 24, 25}, {26}}, {0, 1, 1, 0})};
  compute_group_advantages(groups);
  groups[1].samples[2].versions = {4, 4, 5};
  // Sequences of 3, 4, 3 | 3, 2, 4, 2 tokens: micro-batches of 10 and 11 under a cap of 11.
  const auto held = pack_micro_batches(groups, 11, 4);
  ASSERT_EQ(held.size(), 2u);
  const MicroBatch whole = pack_micro_batches(groups, 64, 4).at(0);
  auto seqs = [](const std::vector<MicroBatch>& run) {
    std::vector<int64_t> lens;
    for (const MicroBatch& mb : run)
      lens.insert(lens.end(), mb.seq_lens.begin(), mb.seq_lens.end());
    return lens;
  };
  // Field by field, the runs' tokens laid end to end are the step's.
  auto joined = [](const std::vector<std::vector<MicroBatch>>& runs, at::Tensor MicroBatch::*f) {
    std::vector<at::Tensor> parts;
    for (const auto& run : runs)
      for (const MicroBatch& mb : run) parts.push_back(mb.*f);
    return at::cat(parts);
  };
  for (int64_t count : {1, 2, 3, 7, 9}) {
    const auto runs = split_mini_batches(held, count);
    ASSERT_EQ(static_cast<int64_t>(runs.size()), count);
    std::vector<int64_t> all;
    for (const auto& run : runs) {
      const int64_t n = static_cast<int64_t>(seqs(run).size());
      // 7 sequences: each run holds floor(7 / count) or one more (none when count > 7 leaves it).
      EXPECT_TRUE(n == 7 / count || n == 7 / count + 1) << count << ": " << n;
      for (const MicroBatch& mb : run) {
        EXPECT_NO_THROW(mb.validate());
        EXPECT_LE(mb.num_tokens(), 11);
      }
      const auto lens = seqs(run);
      all.insert(all.end(), lens.begin(), lens.end());
    }
    EXPECT_EQ(all, whole.seq_lens) << count;
    for (auto f : {&MicroBatch::tokens, &MicroBatch::loss_mask, &MicroBatch::old_logprobs,
                   &MicroBatch::advantages, &MicroBatch::versions}) {
      test::expect_tensor_equal(joined(runs, f), whole.*f);
    }
  }
  // Two runs of 7: 4 and 3 sequences; the second micro-batch's first sequence goes to the first
  // run.
  const auto two = split_mini_batches(held, 2);
  EXPECT_EQ(seqs(two[0]), (std::vector<int64_t>{3, 4, 3, 3}));
  ASSERT_EQ(two[0].size(), 2u);
  EXPECT_EQ(two[1].size(), 1u);
  EXPECT_EQ(seqs(two[1]), (std::vector<int64_t>{2, 4, 2}));
  EXPECT_TRUE(split_mini_batches({}, 2)[1].empty());
  ASSERT_THROWS_WITH(split_mini_batches(held, 0), std::invalid_argument, ">= 1");
}

// ZeRO-2 rounds in the RL step: round i runs once some rank has an i-th micro-batch and every rank
// has one or ended its stream; a rank still receiving holds the rounds beyond its count back.
TEST(ZeroRoundsTest, ARoundRunsOnceEveryRankHasItsMicroBatchOrEnded) {
  // round_runnable(have(i), ended, ended(i), ranks)
  EXPECT_FALSE(round_runnable(0, 0, 0, 2));  // nothing received
  EXPECT_TRUE(round_runnable(2, 0, 0, 2));   // both have an i-th
  EXPECT_FALSE(round_runnable(1, 0, 0, 2));  // the other may still get one
  EXPECT_TRUE(round_runnable(1, 1, 0, 2));   // the other ended without: it pads the round
  // Three ranks: one ended with an i-th (counted once, in have(i)), one ended without, one has it.
  EXPECT_TRUE(round_runnable(2, 2, 1, 3));
  // The same but the third is still open without an i-th.
  EXPECT_FALSE(round_runnable(1, 2, 1, 3));
  // Every rank ended and none had an i-th: the step's rounds are over, not runnable.
  EXPECT_FALSE(round_runnable(0, 3, 0, 3));
  // A lone rank runs what it has.
  EXPECT_TRUE(round_runnable(1, 0, 0, 1));
}

}  // namespace
}  // namespace crl::trainer
