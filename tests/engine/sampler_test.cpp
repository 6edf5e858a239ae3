#include "engine/sampler.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <numeric>
#include <set>
#include <stdexcept>
#include <string>
#include <vector>

#include "engine/sampling_params.h"
#include "tests/test_utils.h"

namespace crl::engine {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

// Chi-square 0.999 quantiles by degrees of freedom.
double chi2_critical_999(int df) {
  static const std::map<int, double> table = {{1, 10.828}, {2, 13.816}, {3, 16.266}, {4, 18.467},
                                              {5, 20.515}, {6, 22.458}, {7, 24.322}};
  return table.at(df);
}

at::Tensor random_logits(int64_t rows, int64_t vocab, double scale, uint64_t seed) {
  at::manual_seed(seed);
  return at::randn({rows, vocab}) * scale;
}

std::vector<float> row_of(const at::Tensor& logits, int64_t r) {
  const at::Tensor row = logits[r].contiguous();
  return std::vector<float>(row.data_ptr<float>(), row.data_ptr<float>() + row.numel());
}

// n rows over logits row `row`, one per position 0..n-1.
std::vector<SampleRow> rows_at_positions(int64_t row, const SamplingParams* p, uint64_t seed, int n,
                                         const std::vector<int32_t>* banned = nullptr) {
  std::vector<SampleRow> rows(n);
  for (int i = 0; i < n; ++i) {
    rows[i].logits_row = row;
    rows[i].params = p;
    rows[i].seed = seed;
    rows[i].position = i;
    rows[i].banned = banned;
  }
  return rows;
}

// The processed distribution in double, written directly from the definition: banned ids ->
// temperature -> top_k -> top_p -> min_p, renormalised (T > 0).
std::vector<double> reference_probs(const std::vector<float>& logits, const SamplingParams& p,
                                    const std::vector<int32_t>& banned = {}) {
  const int64_t v = static_cast<int64_t>(logits.size());
  std::vector<double> z(logits.begin(), logits.end());
  for (int32_t b : banned) z[b] = -kInf;
  if (*std::max_element(z.begin(), z.end()) == -kInf) z.assign(logits.begin(), logits.end());
  const double m = *std::max_element(z.begin(), z.end());
  std::vector<double> e(v);
  for (int64_t i = 0; i < v; ++i) e[i] = std::exp((z[i] - m) / p.temperature);
  std::vector<int64_t> order(v);
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) { return e[a] > e[b]; });
  std::vector<bool> keep(v);
  for (int64_t i = 0; i < v; ++i) keep[i] = e[i] > 0;
  if (p.top_k > 0) {
    for (int64_t j = p.top_k; j < v; ++j) keep[order[j]] = false;
  }
  if (p.top_p < 1.0) {
    double total = 0;
    for (int64_t i = 0; i < v; ++i) total += keep[i] ? e[i] : 0.0;
    double cum = 0;
    for (int64_t idx : order) {
      if (!keep[idx]) continue;
      if (cum >= p.top_p * total) {
        keep[idx] = false;
      } else {
        cum += e[idx];
      }
    }
  }
  for (int64_t i = 0; i < v; ++i) {
    if (e[i] < p.min_p) keep[i] = false;  // the max of e is 1
  }
  double kept = 0;
  for (int64_t i = 0; i < v; ++i) kept += keep[i] ? e[i] : 0.0;
  std::vector<double> probs(v);
  for (int64_t i = 0; i < v; ++i) probs[i] = keep[i] ? e[i] / kept : 0.0;
  return probs;
}

int64_t first_argmax(const std::vector<float>& x) {
  return std::max_element(x.begin(), x.end()) - x.begin();
}

void expect_same_result(const SampleResult& a, const SampleResult& b) {
  EXPECT_EQ(a.token, b.token);
  EXPECT_EQ(a.raw_logprob, b.raw_logprob);
  EXPECT_EQ(a.processed_logprob, b.processed_logprob);
  EXPECT_EQ(a.top_logprobs, b.top_logprobs);
}

// Draws n samples of row 0 and checks that every token has reference probability > 0 and a
// processed log-prob equal to its log, and that every token likely enough (missed with odds below
// e^-20) showed up.
void expect_draws_follow_reference(const at::Tensor& logits, const SamplingParams& p, int n,
                                   const std::vector<int32_t>& banned = {}) {
  const std::vector<float> x = row_of(logits, 0);
  const std::vector<double> ref = reference_probs(x, p, banned);
  const auto rows = rows_at_positions(0, &p, 99, n, banned.empty() ? nullptr : &banned);
  std::set<int32_t> seen;
  for (const SampleResult& r : sample_tokens(logits, rows)) {
    ASSERT_GT(ref[r.token], 0.0) << "token " << r.token << " is outside the kept set";
    EXPECT_NEAR(r.processed_logprob, std::log(ref[r.token]), 2e-5);
    seen.insert(r.token);
  }
  for (size_t i = 0; i < ref.size(); ++i) {
    if (ref[i] >= std::max(0.01, 20.0 / n)) {
      EXPECT_TRUE(seen.count(static_cast<int32_t>(i))) << "likely token " << i << " never drawn";
    }
  }
}

TEST(SamplerTest, GreedyPicksTheFirstArgmaxWithZeroProcessedLogprob) {
  at::Tensor logits = random_logits(4, 1000, 3.0, 1);
  logits[3][10] = 50.0f;  // ties, within a block and across blocks: the smallest id wins
  logits[3][12] = 50.0f;
  logits[3][700] = 50.0f;
  SamplingParams p;
  p.temperature = 0.0;
  std::vector<SampleRow> rows(4);
  for (int r = 0; r < 4; ++r) rows[r] = SampleRow{r, &p, 5, 0, 0, nullptr};
  const auto results = sample_tokens(logits, rows);
  const at::Tensor ref = at::log_softmax(logits.to(at::kDouble), 1);
  for (int r = 0; r < 4; ++r) {
    EXPECT_EQ(results[r].token, first_argmax(row_of(logits, r)));
    EXPECT_EQ(results[r].processed_logprob, 0.0f);
    EXPECT_NEAR(results[r].raw_logprob, ref[r][results[r].token].item<double>(), 1e-5);
  }
  EXPECT_EQ(results[3].token, 10);
}

TEST(SamplerTest, RawLogprobMatchesLogSoftmaxForEveryKindOfRow) {
  const at::Tensor logits = random_logits(6, 30000, 4.0, 2);
  std::vector<SamplingParams> params(6);
  params[0].temperature = 0.0;
  params[1].temperature = 0.7;
  params[2].top_k = 20;
  params[3].top_p = 0.5;
  params[4].min_p = 0.2;
  params[5].temperature = 1.5;
  std::vector<SampleRow> rows;
  for (int r = 0; r < 6; ++r) {
    for (int pos = 0; pos < 5; ++pos) rows.push_back(SampleRow{r, &params[r], 11, 0, pos, nullptr});
  }
  const auto results = sample_tokens(logits, rows);
  const at::Tensor ref = at::log_softmax(logits.to(at::kDouble), 1);
  for (size_t i = 0; i < rows.size(); ++i) {
    EXPECT_NEAR(results[i].raw_logprob, ref[rows[i].logits_row][results[i].token].item<double>(),
                1e-5);
  }
}

TEST(SamplerTest, RawLogprobIsAccurateToFloatPrecision) {
  const at::Tensor logits = random_logits(8, 2000, 1.0, 15);
  SamplingParams p;
  std::vector<SampleRow> rows;
  for (int r = 0; r < 8; ++r) rows.push_back(SampleRow{r, &p, 1, 0, 0, nullptr});
  const auto results = sample_tokens(logits, rows);
  const at::Tensor ref = at::log_softmax(logits.to(at::kDouble), 1);
  for (int r = 0; r < 8; ++r) {
    EXPECT_NEAR(results[r].raw_logprob, ref[r][results[r].token].item<double>(), 2e-6);
  }
}

TEST(SamplerTest, DrawIsTheInverseCdfOfTheRowUniformInIdOrder) {
  // Small kept sets (sorted id list), unfiltered rows (block walk) and large kept sets (zeroed
  // row, block walk) all pick the first id whose cumulative probability exceeds u.
  const at::Tensor small = random_logits(1, 50, 1.5, 16);
  const at::Tensor large = random_logits(1, 5000, 0.5, 17);
  SamplingParams plain, top_k, nucleus;
  top_k.top_k = 10;
  nucleus.top_p = 0.99;
  const std::pair<const at::Tensor*, const SamplingParams*> cases[] = {
      {&small, &plain}, {&small, &top_k}, {&large, &plain}, {&large, &nucleus}};
  for (const auto& [logits, p] : cases) {
    const std::vector<double> ref = reference_probs(row_of(*logits, 0), *p);
    int kept = 0;
    for (double r : ref) kept += r > 0;
    if (p == &nucleus) EXPECT_GT(kept, 2048);
    const auto results = sample_tokens(*logits, rows_at_positions(0, p, 31, 300));
    for (int pos = 0; pos < 300; ++pos) {
      const double u = sample_uniform(31, 0, pos);
      double cum = 0;
      size_t expected = 0;
      while (expected + 1 < ref.size() && cum + ref[expected] <= u) cum += ref[expected++];
      if (std::abs(cum - u) < 1e-9 || std::abs(cum + ref[expected] - u) < 1e-9) continue;
      EXPECT_EQ(results[pos].token, static_cast<int32_t>(expected)) << "u = " << u;
    }
  }
}

TEST(SamplerTest, SameSeedIndexAndPositionGiveTheSameToken) {
  const at::Tensor logits = random_logits(1, 5000, 2.0, 3);
  SamplingParams p;
  p.top_p = 0.95;
  p.logprobs = 3;
  std::vector<SampleRow> rows = {{0, &p, 42, 3, 17, nullptr}};
  const auto a = sample_tokens(logits, rows);
  const auto b = sample_tokens(logits, rows);
  expect_same_result(a[0], b[0]);
  EXPECT_EQ(sample_uniform(42, 3, 17), sample_uniform(42, 3, 17));
  double sum = 0;
  for (int64_t pos = 0; pos < 20000; ++pos) {
    const double u = sample_uniform(7, 0, pos);
    ASSERT_GE(u, 0.0);
    ASSERT_LT(u, 1.0);
    sum += u;
  }
  EXPECT_NEAR(sum / 20000, 0.5, 0.01);
}

TEST(SamplerTest, ResultsDoNotDependOnBatchComposition) {
  const at::Tensor logits = random_logits(5, 4000, 2.5, 4);
  std::vector<SamplingParams> params(5);
  params[0].temperature = 0.0;
  params[0].logprobs = 5;
  params[1].top_k = 30;
  params[1].temperature = 0.8;
  params[2].top_p = 0.9;
  params[3].min_p = 0.05;
  params[3].logprobs = 2;
  params[4].top_k = 100;
  params[4].top_p = 0.8;
  const std::vector<int32_t> banned = {1, 2, 3};
  std::vector<SampleRow> rows;
  for (int r = 0; r < 5; ++r) {
    rows.push_back(SampleRow{r, &params[r], 1000u + r, r % 2, 7 + r, r == 2 ? &banned : nullptr});
  }
  std::vector<SampleResult> alone;
  for (const SampleRow& row : rows) alone.push_back(sample_tokens(logits, {row})[0]);
  // The same rows reversed and interleaved with other requests' rows.
  std::vector<SampleRow> batch;
  for (int r = 4; r >= 0; --r) {
    batch.push_back(SampleRow{(r + 1) % 5, &params[r], 5u, 1, 3, nullptr});
    batch.push_back(rows[r]);
  }
  const auto mixed = sample_tokens(logits, batch);
  for (int r = 0; r < 5; ++r) expect_same_result(alone[r], mixed[2 * (4 - r) + 1]);
}

TEST(SamplerTest, DistinctSampleIndicesAndSeedsGiveDifferentStreams) {
  const at::Tensor logits = at::zeros({1, 1000});  // uniform over 1000 tokens
  SamplingParams p;
  auto tokens_for = [&](uint64_t seed, int32_t index) {
    auto rows = rows_at_positions(0, &p, seed, 200);
    for (auto& row : rows) row.sample_index = index;
    std::vector<int32_t> out;
    for (const auto& r : sample_tokens(logits, rows)) out.push_back(r.token);
    return out;
  };
  const auto base = tokens_for(1, 0);
  auto matches = [&](const std::vector<int32_t>& other) {
    int same = 0;
    for (size_t i = 0; i < base.size(); ++i) same += base[i] == other[i];
    return same;
  };
  EXPECT_LE(matches(tokens_for(1, 1)), 5);
  EXPECT_LE(matches(tokens_for(2, 0)), 5);
  EXPECT_EQ(matches(tokens_for(1, 0)), 200);
  EXPECT_GT(std::set<int32_t>(base.begin(), base.end()).size(), 150u);
}

TEST(SamplerTest, TopKNeverSamplesOutsideTheKLargest) {
  const at::Tensor logits = random_logits(1, 500, 1.0, 5);
  SamplingParams p;
  p.top_k = 7;
  const std::vector<float> x = row_of(logits, 0);
  std::vector<int64_t> order(x.size());
  std::iota(order.begin(), order.end(), 0);
  std::sort(order.begin(), order.end(), [&](int64_t a, int64_t b) { return x[a] > x[b]; });
  const std::set<int64_t> top(order.begin(), order.begin() + 7);
  std::set<int64_t> seen;
  for (const auto& r : sample_tokens(logits, rows_at_positions(0, &p, 8, 3000))) {
    ASSERT_TRUE(top.count(r.token)) << r.token;
    seen.insert(r.token);
  }
  EXPECT_EQ(seen, top);
}

TEST(SamplerTest, TopPNeverSamplesOutsideTheSmallestNucleus) {
  // Probabilities 0.4, 0.25, 0.15, 0.1, then 0.1 spread over 96 tokens: top_p 0.7 keeps three.
  std::vector<float> x(100, std::log(0.1f / 96));
  x[17] = std::log(0.4f);
  x[3] = std::log(0.25f);
  x[60] = std::log(0.15f);
  x[42] = std::log(0.1f);
  const at::Tensor logits = at::tensor(x).reshape({1, 100});
  SamplingParams p;
  p.top_p = 0.7;
  std::set<int32_t> seen;
  for (const auto& r : sample_tokens(logits, rows_at_positions(0, &p, 9, 2000))) {
    ASSERT_TRUE(r.token == 17 || r.token == 3 || r.token == 60) << r.token;
    seen.insert(r.token);
  }
  EXPECT_EQ(seen.size(), 3u);
  expect_draws_follow_reference(logits, p, 500);
}

TEST(SamplerTest, MinPNeverSamplesBelowTheThreshold) {
  const at::Tensor logits = random_logits(1, 300, 1.5, 6);
  SamplingParams p;
  p.min_p = 0.1;
  p.temperature = 0.9;
  const std::vector<float> x = row_of(logits, 0);
  const float m = *std::max_element(x.begin(), x.end());
  for (const auto& r : sample_tokens(logits, rows_at_positions(0, &p, 10, 2000))) {
    ASSERT_GE(std::exp((x[r.token] - m) / 0.9), 0.1 - 1e-6) << r.token;
  }
  expect_draws_follow_reference(logits, p, 1000);
}

TEST(SamplerTest, BannedIdsAreNeverSampledUnlessEverythingIsBanned) {
  const at::Tensor logits = random_logits(1, 50, 2.0, 7);
  const std::vector<float> x = row_of(logits, 0);
  const int64_t best = first_argmax(x);
  std::vector<int32_t> banned = {static_cast<int32_t>(best), 0, 49};
  SamplingParams p;
  for (const auto& r : sample_tokens(logits, rows_at_positions(0, &p, 11, 2000, &banned))) {
    ASSERT_TRUE(std::find(banned.begin(), banned.end(), r.token) == banned.end()) << r.token;
  }
  expect_draws_follow_reference(logits, p, 1000, banned);

  SamplingParams greedy;
  greedy.temperature = 0.0;
  std::vector<float> masked = x;
  for (int32_t b : banned) masked[b] = -1e30f;
  const auto g = sample_tokens(logits, rows_at_positions(0, &greedy, 1, 1, &banned))[0];
  EXPECT_EQ(g.token, first_argmax(masked));
  const at::Tensor ref = at::log_softmax(logits.to(at::kDouble), 1);
  EXPECT_NEAR(g.raw_logprob, ref[0][g.token].item<double>(), 1e-5);  // raw ignores the ban

  std::vector<int32_t> all(50);
  std::iota(all.begin(), all.end(), 0);
  EXPECT_EQ(sample_tokens(logits, rows_at_positions(0, &greedy, 1, 1, &all))[0].token, best);
  expect_draws_follow_reference(logits, p, 500, all);  // falls back to the unmasked row
}

TEST(SamplerTest, SampledFrequenciesMatchTheTemperatureSoftmax) {
  const std::vector<float> x = {1.0f, 0.5f, -0.3f, 2.0f, 0.0f, -1.0f, 1.5f, 0.2f};
  const at::Tensor logits = at::tensor(x).reshape({1, 8});
  SamplingParams p;
  p.temperature = 0.7;
  const int n = 20000;
  std::vector<int> counts(8, 0);
  for (const auto& r : sample_tokens(logits, rows_at_positions(0, &p, 2024, n))) ++counts[r.token];
  const std::vector<double> probs = reference_probs(x, p);
  const at::Tensor expected = at::softmax(logits.to(at::kDouble)[0] / 0.7, 0);
  double chi2 = 0;
  for (int i = 0; i < 8; ++i) {
    const double e = n * expected[i].item<double>();
    EXPECT_NEAR(probs[i], expected[i].item<double>(), 1e-12);
    chi2 += (counts[i] - e) * (counts[i] - e) / e;
  }
  EXPECT_LT(chi2, chi2_critical_999(7));
}

TEST(SamplerTest, TruncatedFrequenciesMatchTheRenormalisedDistribution) {
  // top_k 6 keeps ids {0,2,4,6,8,10}; top_p 0.8 of their mass keeps the four most likely.
  std::vector<float> x(16, -1.0f);
  const float kept[6] = {2.0f, 1.7f, 1.5f, 1.2f, 0.2f, 0.1f};
  for (int j = 0; j < 6; ++j) x[2 * j] = kept[j];
  const at::Tensor logits = at::tensor(x).reshape({1, 16});
  SamplingParams p;
  p.top_k = 6;
  p.top_p = 0.8;
  const std::vector<double> ref = reference_probs(x, p);
  int num_kept = 0;
  for (double r : ref) num_kept += r > 0;
  ASSERT_EQ(num_kept, 4);
  const int n = 20000;
  std::vector<int> counts(16, 0);
  for (const auto& r : sample_tokens(logits, rows_at_positions(0, &p, 77, n))) ++counts[r.token];
  double chi2 = 0;
  for (int i = 0; i < 16; ++i) {
    if (ref[i] == 0) {
      EXPECT_EQ(counts[i], 0) << "token " << i;
      continue;
    }
    const double e = n * ref[i];
    chi2 += (counts[i] - e) * (counts[i] - e) / e;
  }
  EXPECT_LT(chi2, chi2_critical_999(num_kept - 1));
}

TEST(SamplerTest, ProcessedLogprobIsLogOfTheRenormalisedProbability) {
  const at::Tensor logits = random_logits(1, 300, 2.0, 8);
  std::vector<SamplingParams> configs(6);
  configs[0].temperature = 0.6;
  configs[1].top_k = 10;
  configs[2].top_p = 0.7;
  configs[2].temperature = 1.3;
  configs[3].min_p = 0.05;
  configs[4].top_k = 20;
  configs[4].top_p = 0.9;
  configs[4].min_p = 0.02;
  configs[5].top_k = 1;  // a single kept token: log-prob 0
  for (const SamplingParams& p : configs) expect_draws_follow_reference(logits, p, 200);
  const auto one = sample_tokens(logits, rows_at_positions(0, &configs[5], 3, 1))[0];
  EXPECT_EQ(one.processed_logprob, 0.0f);
  EXPECT_EQ(one.token, first_argmax(row_of(logits, 0)));
}

TEST(SamplerTest, LargeVocabularyFiltersKeepExactlyTheReferenceSet) {
  // Flat rows send top_p and large top_k through the sampled candidate threshold and the
  // zero-and-walk draw; peaked rows through the block-maxima certificate.
  const int64_t v = 150000;
  at::Tensor flat = random_logits(1, v, 3.0, 9);
  at::Tensor peaked = random_logits(1, v, 1.0, 10);
  for (int j = 0; j < 10; ++j) peaked[0][(j * 15013) % v] += 9.0f + 0.2f * j;
  std::vector<SamplingParams> configs(5);
  configs[0].top_k = 40;
  configs[1].top_k = 5000;
  configs[2].top_p = 0.9;
  configs[3].top_p = 0.999;
  configs[3].min_p = 1e-4;
  configs[4].min_p = 1e-3;
  for (const SamplingParams& p : configs) {
    expect_draws_follow_reference(flat, p, 60);
    expect_draws_follow_reference(peaked, p, 60);
  }
  // Every 36th token e times likelier than the rest: a strided look at the row sees only those.
  at::Tensor striped = at::zeros({1, v});
  striped.index_put_({0, at::arange(0, v, 36)}, 1.0f);
  expect_draws_follow_reference(striped, configs[2], 60);
}

TEST(SamplerTest, TinyTemperatureBehavesLikeGreedy) {
  const at::Tensor logits = random_logits(1, 1000, 1.0, 12);
  for (double t : {1e-6, 1e-300}) {
    SamplingParams p;
    p.temperature = t;
    const auto r = sample_tokens(logits, rows_at_positions(0, &p, 1, 3));
    for (const auto& res : r) {
      EXPECT_EQ(res.token, first_argmax(row_of(logits, 0)));
      EXPECT_NEAR(res.processed_logprob, 0.0, 1e-6);
    }
  }
}

TEST(SamplerTest, TokenLogprobsMatchLogSoftmaxGatherAndTopK) {
  const at::Tensor logits = random_logits(5, 3000, 3.0, 13);
  const std::vector<int32_t> tokens = {0, 2999, 17, 1500, 42};
  const auto out = token_logprobs(logits, tokens, 5);
  const at::Tensor ref = at::log_softmax(logits.to(at::kDouble), 1);
  const auto top = at::topk(ref, 5, 1);
  ASSERT_EQ(out.size(), 5u);
  for (int r = 0; r < 5; ++r) {
    EXPECT_NEAR(out[r].first, ref[r][tokens[r]].item<double>(), 1e-5);
    ASSERT_EQ(out[r].second.size(), 5u);
    for (int j = 0; j < 5; ++j) {
      EXPECT_EQ(out[r].second[j].first, std::get<1>(top)[r][j].item<int64_t>());
      EXPECT_NEAR(out[r].second[j].second, std::get<0>(top)[r][j].item<double>(), 1e-5);
    }
  }
  EXPECT_TRUE(token_logprobs(logits, tokens, 0)[0].second.empty());
  // sample_tokens reports the same top log-probs.
  SamplingParams p;
  p.logprobs = 5;
  const auto s = sample_tokens(logits, rows_at_positions(2, &p, 1, 1))[0];
  EXPECT_EQ(s.top_logprobs, out[2].second);
}

TEST(SamplerTest, TopLogprobsBreakTiesBySmallerId) {
  const at::Tensor logits =
      at::tensor(std::vector<float>{1, 3, 3, 0, 3, 2, 2, 0, 0, 0}).reshape({1, 10});
  const auto out = token_logprobs(logits, {0}, 4)[0].second;
  ASSERT_EQ(out.size(), 4u);
  const std::vector<int32_t> ids = {1, 2, 4, 5};
  const at::Tensor ref = at::log_softmax(logits.to(at::kDouble), 1)[0];
  for (int j = 0; j < 4; ++j) {
    EXPECT_EQ(out[j].first, ids[j]);
    EXPECT_NEAR(out[j].second, ref[ids[j]].item<double>(), 1e-6);
  }
  EXPECT_EQ(token_logprobs(logits, {0}, 20)[0].second.size(), 10u);  // k capped at V
}

TEST(SamplerTest, NonFiniteLogitsAreRejectedButMaskedEntriesAreFine) {
  at::Tensor logits = random_logits(1, 100, 1.0, 14);
  logits[0][5] = -std::numeric_limits<float>::infinity();
  SamplingParams p;
  for (const auto& r : sample_tokens(logits, rows_at_positions(0, &p, 3, 500))) {
    ASSERT_NE(r.token, 5);
  }
  logits[0][7] = std::numeric_limits<float>::quiet_NaN();
  ASSERT_THROWS_WITH(sample_tokens(logits, rows_at_positions(0, &p, 3, 1)), std::runtime_error,
                     "NaN");
  const at::Tensor dead = at::full({1, 10}, -std::numeric_limits<float>::infinity());
  ASSERT_THROWS_WITH(token_logprobs(dead, {0}, 1), std::runtime_error, "no finite maximum");
}

TEST(SamplingParamsTest, DefaultsAndEdgeValuesAreValid) {
  SamplingParams p;
  EXPECT_NO_THROW(p.validate(100));
  p.temperature = 0.0;
  p.top_k = -1;
  p.min_p = 1.0;
  p.top_p = 1.0;
  p.min_tokens = p.max_tokens;
  p.stop_token_ids = {0, 99};
  p.stop = std::vector<std::string>(16, "x");
  p.logprobs = 20;
  p.prompt_logprobs = 0;
  EXPECT_NO_THROW(p.validate(100));
  p.top_k = 100;
  EXPECT_NO_THROW(p.validate(100));
}

TEST(SamplingParamsTest, ValidateRejectsEachBadFieldNamingIt) {
  struct Case {
    const char* field;
    void (*set)(SamplingParams&);
  };
  const Case cases[] = {
      {"'n'", [](SamplingParams& p) { p.n = 0; }},
      {"'n'", [](SamplingParams& p) { p.n = 1025; }},
      {"'temperature'", [](SamplingParams& p) { p.temperature = -0.5; }},
      {"'temperature'", [](SamplingParams& p) { p.temperature = std::nan(""); }},
      {"'temperature'", [](SamplingParams& p) { p.temperature = kInf; }},
      {"'top_p'", [](SamplingParams& p) { p.top_p = 0.0; }},
      {"'top_p'", [](SamplingParams& p) { p.top_p = std::nan(""); }},
      {"'top_k'", [](SamplingParams& p) { p.top_k = -2; }},
      {"'top_k'", [](SamplingParams& p) { p.top_k = 101; }},
      {"'min_p'", [](SamplingParams& p) { p.min_p = -0.1; }},
      {"'min_p'", [](SamplingParams& p) { p.min_p = 1.5; }},
      {"'max_tokens'", [](SamplingParams& p) { p.max_tokens = 0; }},
      {"'min_tokens'", [](SamplingParams& p) { p.min_tokens = -1; }},
      {"'min_tokens'", [](SamplingParams& p) { p.min_tokens = p.max_tokens + 1; }},
      {"'stop_token_ids'", [](SamplingParams& p) { p.stop_token_ids.assign(2, 100); }},
      {"'stop_token_ids'", [](SamplingParams& p) { p.stop_token_ids = {-1}; }},
      {"'stop'", [](SamplingParams& p) { p.stop = std::vector<std::string>(17, "x"); }},
      {"'stop'", [](SamplingParams& p) { p.stop.assign(2, std::string()); }},
      {"'logprobs'", [](SamplingParams& p) { p.logprobs = 21; }},
      {"'logprobs'", [](SamplingParams& p) { p.logprobs = -1; }},
      {"'prompt_logprobs'", [](SamplingParams& p) { p.prompt_logprobs = 21; }},
  };
  for (const Case& c : cases) {
    SamplingParams p;
    c.set(p);
    ASSERT_THROWS_WITH(p.validate(100), std::invalid_argument, c.field);
  }
  SamplingParams p;
  p.top_p = 1.5;
  ASSERT_THROWS_WITH(p.validate(100), std::invalid_argument,
                     "invalid sampling parameter 'top_p': 1.5 (must be in (0, 1])");
  p = SamplingParams();
  p.stop_token_ids = {100};
  ASSERT_THROWS_WITH(p.validate(100), std::invalid_argument, "'stop_token_ids': 100");
}

}  // namespace
}  // namespace crl::engine
