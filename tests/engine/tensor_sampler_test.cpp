// The tensor sampler (engine/tensor_sampler.h) against the CPU engine's sampler (engine/sampler.h)
// and against the filters' definition: on CPU tensors here, on cuda:0 in the Cuda suite (ctest
// label gpu), and through a whole engine.
#include "engine/tensor_sampler.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "engine/llm_engine.h"
#include "engine/sampler.h"
#include "tests/engine/test_model.h"
#include "tests/test_utils.h"

namespace crl::engine {
namespace {

at::Tensor random_logits(int64_t rows, int64_t vocab, double scale, uint64_t seed) {
  at::manual_seed(seed);
  return at::randn({rows, vocab}) * scale;
}

// Params that exercise every filter, alone and together (index 0 greedy).
std::vector<SamplingParams> filter_configs() {
  std::vector<SamplingParams> c(9);
  c[0].temperature = 0;
  c[1].temperature = 0.7;
  c[2].top_k = 40;
  c[3].top_p = 0.9;
  c[3].temperature = 1.3;
  c[4].min_p = 0.05;
  c[5].top_k = 200;
  c[5].top_p = 0.95;
  c[5].min_p = 0.01;
  c[6].top_k = 1;
  c[7].top_p = 0.5;
  c[7].logprobs = 5;
  c[8].temperature = 1e-300;  // the CPU sampler clamps 1/T to FLT_MAX: greedy in effect
  return c;
}

// One row per (logits row, config) pair, with distinct seeds and positions. The rows point into
// `configs`, which must outlive them.
std::vector<SampleRow> mixed_rows(int64_t logit_rows, const std::vector<SamplingParams>& configs,
                                  const std::vector<int32_t>* banned = nullptr) {
  std::vector<SampleRow> rows;
  for (int64_t r = 0; r < logit_rows; ++r) {
    SampleRow row;
    row.logits_row = r;
    row.params = &configs[r % configs.size()];
    row.seed = 1000 + r;
    row.sample_index = static_cast<int32_t>(r % 3);
    row.position = 17 + r;
    row.banned = (banned != nullptr && r % 4 == 1) ? banned : nullptr;
    rows.push_back(row);
  }
  return rows;
}

// Compares the two samplers row by row. Draws may differ only where the uniform lands within
// rounding of a CDF step: at most `max_draw_mismatches` rows.
void expect_samplers_agree(const at::Tensor& cpu_logits, const at::Tensor& logits,
                           const std::vector<SampleRow>& rows, int max_draw_mismatches = 0) {
  const auto ref = sample_tokens(cpu_logits, rows);
  TensorSamplerStats stats;
  const auto got = sample_tokens_tensor(logits, rows, &stats);
  ASSERT_EQ(ref.size(), got.size());
  int mismatches = 0;
  for (size_t r = 0; r < rows.size(); ++r) {
    SCOPED_TRACE("row " + std::to_string(r));
    const bool greedy = rows[r].params->is_greedy();
    if (greedy) {
      EXPECT_EQ(got[r].token, ref[r].token);
      EXPECT_EQ(got[r].processed_logprob, 0.0f);
    } else if (got[r].token != ref[r].token) {
      ++mismatches;
      continue;
    }
    EXPECT_NEAR(got[r].raw_logprob, ref[r].raw_logprob, 1e-5);
    EXPECT_NEAR(got[r].processed_logprob, ref[r].processed_logprob, 1e-5);
    ASSERT_EQ(got[r].top_logprobs.size(), ref[r].top_logprobs.size());
    for (size_t j = 0; j < ref[r].top_logprobs.size(); ++j) {
      EXPECT_EQ(got[r].top_logprobs[j].first, ref[r].top_logprobs[j].first);
      EXPECT_NEAR(got[r].top_logprobs[j].second, ref[r].top_logprobs[j].second, 1e-5);
    }
  }
  EXPECT_LE(mismatches, max_draw_mismatches);
  if (logits.device().is_cpu()) EXPECT_EQ(stats.d2h_bytes, 0);
}

// The kept set from its definition: rank by (q desc, id asc), keep ranks < top_k, then ranks
// whose predecessors' mass is below top_p times the mass top_k kept, then q >= min_p.
std::vector<bool> reference_kept(const at::Tensor& logits_row, const SamplingParams& p) {
  const at::Tensor x = logits_row.to(at::kDouble).contiguous();
  const int64_t v = x.numel();
  const double* d = x.data_ptr<double>();
  const double m = *std::max_element(d, d + v);
  std::vector<double> q(v);
  for (int64_t i = 0; i < v; ++i) {
    q[i] = std::exp(static_cast<double>(static_cast<float>(d[i] - m) *
                                        static_cast<float>(1.0 / p.temperature)));
  }
  std::vector<int64_t> order(v);
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) { return q[a] > q[b]; });
  std::vector<bool> keep(v, true);
  const int64_t k = p.top_k > 0 ? std::min<int64_t>(p.top_k, v) : v;
  for (int64_t j = k; j < v; ++j) keep[order[j]] = false;
  if (p.top_p < 1.0) {
    double mass = 0;
    for (int64_t j = 0; j < k; ++j) mass += q[order[j]];
    double cum = 0;
    for (int64_t j = 0; j < k; ++j) {
      if (cum >= p.top_p * mass) keep[order[j]] = false;
      cum += q[order[j]];
    }
  }
  for (int64_t i = 0; i < v; ++i) keep[i] = keep[i] && q[i] > 0 && q[i] >= p.min_p;
  return keep;
}

void expect_kept_sets_match_the_definition(const at::Tensor& logits, const at::Tensor& cpu_logits) {
  std::vector<SamplingParams> configs(5);
  configs[0].top_k = 40;
  configs[1].top_k = 5000;
  configs[2].top_p = 0.9;
  configs[3].top_p = 0.999;
  configs[3].min_p = 1e-4;
  configs[4].min_p = 1e-3;
  configs[4].top_k = 100;
  configs[4].top_p = 0.8;
  std::vector<SampleRow> rows;
  for (size_t c = 0; c < configs.size(); ++c) {
    for (int64_t r = 0; r < logits.size(0); ++r) {
      SampleRow row;
      row.logits_row = r;
      row.params = &configs[c];
      rows.push_back(row);
    }
  }
  const at::Tensor kept = tensor_sampler_kept_mask(logits, rows).to(at::kCPU);
  for (size_t i = 0; i < rows.size(); ++i) {
    const std::vector<bool> ref = reference_kept(cpu_logits[rows[i].logits_row], *rows[i].params);
    const at::Tensor got = kept[static_cast<int64_t>(i)].contiguous();
    const bool* g = got.data_ptr<bool>();
    int64_t differ = 0, first = -1, count = 0;
    for (size_t j = 0; j < ref.size(); ++j) {
      count += ref[j];
      if (g[j] != ref[j]) {
        if (first < 0) first = static_cast<int64_t>(j);
        ++differ;
      }
    }
    EXPECT_EQ(differ, 0) << "row " << i << " (config " << i / logits.size(0) << ", " << count
                         << " kept): first differing id " << first;
  }
}

TEST(TensorSamplerTest, GreedyIdsAndRawLogprobsEqualTheCpuSamplers) {
  const at::Tensor logits = random_logits(64, 5000, 3.0, 1);
  std::vector<SamplingParams> greedy(1);  // outlives the rows, which point into it
  greedy[0].temperature = 0;
  greedy[0].logprobs = 3;
  const auto rows = mixed_rows(64, greedy);
  expect_samplers_agree(logits, logits, rows);
}

TEST(TensorSamplerTest, EveryFilterDrawsTheCpuSamplersTokens) {
  // The same uniform per row, the same kept set, the same id-order inverse CDF: the same token,
  // unless a uniform lands within rounding of a CDF step (none in these rows).
  const auto configs = filter_configs();
  const std::vector<int32_t> banned = {3, 5, 7, 11};
  for (int64_t vocab : {1000, 150000}) {
    SCOPED_TRACE("vocab " + std::to_string(vocab));
    const at::Tensor logits = random_logits(36, vocab, 2.5, 2 + vocab);
    expect_samplers_agree(logits, logits, mixed_rows(36, configs, &banned));
  }
}

TEST(TensorSamplerTest, BannedIdsAreNeverSampledUnlessEverythingIsBanned) {
  at::Tensor logits = at::zeros({2, 6});
  logits[0][2] = 10.0f;
  logits[1][0] = 10.0f;
  SamplingParams p;
  std::vector<int32_t> ban_two = {2};
  std::vector<int32_t> ban_all = {0, 1, 2, 3, 4, 5};
  for (int pos = 0; pos < 50; ++pos) {
    std::vector<SampleRow> rows(2);
    rows[0] = {0, &p, 9, 0, pos, &ban_two};
    rows[1] = {1, &p, 9, 0, pos, &ban_all};  // all banned: the raw row is sampled
    const auto got = sample_tokens_tensor(logits, rows);
    EXPECT_NE(got[0].token, 2);
    const auto ref = sample_tokens(logits, rows);
    EXPECT_EQ(got[0].token, ref[0].token);
    EXPECT_EQ(got[1].token, ref[1].token);
  }
}

TEST(TensorSamplerTest, KeptSetsAreExactlyTheDefinitionsOnLargeVocabularies) {
  const int64_t v = 150000;
  at::Tensor flat = random_logits(2, v, 3.0, 9);
  for (int j = 0; j < 10; ++j) flat[1][(j * 15013) % v] += 9.0f + 0.2f * j;  // row 1 peaked
  expect_kept_sets_match_the_definition(flat, flat);
}

TEST(TensorSamplerTest, SampledFrequenciesPassAChiSquareTestAgainstTheProcessedDistribution) {
  // 20,000 draws of one row (positions 0..19999) with top_k + top_p + temperature: counts against
  // the renormalised distribution, chi-square at the 0.999 quantile; and against the CPU sampler.
  std::vector<float> x(16, -1.0f);
  const float kept[6] = {2.0f, 1.7f, 1.5f, 1.2f, 0.2f, 0.1f};
  for (int j = 0; j < 6; ++j) x[2 * j] = kept[j];
  const at::Tensor logits = at::tensor(x).reshape({1, 16});
  SamplingParams p;
  p.top_k = 6;
  p.top_p = 0.8;
  p.temperature = 0.9;
  const int n = 20000;
  std::vector<SampleRow> rows(n);
  for (int i = 0; i < n; ++i) rows[i] = {0, &p, 77, 0, i, nullptr};
  // Batched: 20,000 rows of one logits row.
  const auto got = sample_tokens_tensor(logits, rows);
  const auto ref = sample_tokens(logits, rows);
  std::vector<int> counts(16, 0), cpu_counts(16, 0);
  for (int i = 0; i < n; ++i) {
    ++counts[got[i].token];
    ++cpu_counts[ref[i].token];
  }
  // Kept: the four most likely ids {0, 2, 4, 6} (the top-6's 0.8 nucleus).
  std::vector<double> probs(16, 0.0);
  double mass = 0;
  for (int j = 0; j < 4; ++j) mass += std::exp((kept[j] - kept[0]) / p.temperature);
  for (int j = 0; j < 4; ++j) probs[2 * j] = std::exp((kept[j] - kept[0]) / p.temperature) / mass;
  double chi2 = 0, chi2_cpu = 0;
  for (int i = 0; i < 16; ++i) {
    if (probs[i] == 0) {
      EXPECT_EQ(counts[i], 0) << "token " << i;
      continue;
    }
    const double e = n * probs[i];
    chi2 += (counts[i] - e) * (counts[i] - e) / e;
    chi2_cpu += (counts[i] - cpu_counts[i]) * (counts[i] - cpu_counts[i]) / e;
  }
  EXPECT_LT(chi2, 16.266);      // chi-square 0.999 quantile, 3 degrees of freedom
  EXPECT_LT(chi2_cpu, 16.266);  // the CPU sampler's counts, on the same scale
}

TEST(TensorSamplerTest, ASeedGivesTheSameTokensWhateverTheBatch) {
  const at::Tensor logits = random_logits(8, 2000, 2.0, 4);
  SamplingParams p;
  p.top_p = 0.95;
  const SampleRow mine{5, &p, 4242, 1, 33, nullptr};
  const auto alone = sample_tokens_tensor(logits, {mine});
  std::vector<SampleRow> crowd;
  for (int64_t r = 0; r < 8; ++r) crowd.push_back({r, &p, static_cast<uint64_t>(r), 0, r, nullptr});
  crowd.insert(crowd.begin() + 3, mine);
  const auto together = sample_tokens_tensor(logits, crowd);
  EXPECT_EQ(together[3].token, alone[0].token);
  EXPECT_EQ(together[3].raw_logprob, alone[0].raw_logprob);
}

TEST(TensorSamplerTest, Bf16LogitsAndRowsThatRepeatALogitsRow) {
  // bf16 logits are read as their float values; several rows may sample one logits row (the n
  // samples at a request's first token).
  const at::Tensor logits = random_logits(3, 700, 2.0, 5).to(at::kBFloat16);
  const at::Tensor as_float = logits.to(at::kFloat);
  SamplingParams p;
  p.temperature = 0.8;
  std::vector<SampleRow> rows;
  for (int k = 0; k < 4; ++k) rows.push_back({1, &p, 7, k, 10, nullptr});
  rows.push_back({0, &p, 7, 0, 10, nullptr});
  const auto got = sample_tokens_tensor(logits, rows);
  const auto ref = sample_tokens(as_float, rows);
  for (size_t r = 0; r < rows.size(); ++r) {
    EXPECT_EQ(got[r].token, ref[r].token) << r;
    EXPECT_NEAR(got[r].raw_logprob, ref[r].raw_logprob, 1e-5);
  }
}

TEST(TensorSamplerTest, NanRowsAreAnErrorNamingTheRow) {
  at::Tensor logits = random_logits(3, 50, 1.0, 6);
  logits[2][7] = std::nanf("");
  SamplingParams p;
  std::vector<SampleRow> rows = {{0, &p, 1, 0, 0, nullptr}, {2, &p, 1, 0, 0, nullptr}};
  ASSERT_THROWS_WITH(sample_tokens_tensor(logits, rows), std::runtime_error, "logits row 2");
  rows = {{1, &p, 1, 0, 0, nullptr}, {0, &p, 1, 0, 0, nullptr}};
  EXPECT_EQ(sample_tokens_tensor(logits, rows).size(), 2u);
}

// A whole engine with the tensor sampler against the same engine with the CPU sampler: the same
// greedy and seeded outputs and log-probs (the logits are the same; only the sampler differs).
void expect_engines_agree(EngineConfig cfg, int64_t* d2h_bytes_per_step = nullptr) {
  std::vector<GenerateRequest> reqs;
  std::mt19937 rng(11);
  for (int i = 0; i < 6; ++i) {
    GenerateRequest r;
    r.request_id = "r" + std::to_string(i);
    for (int t = 0; t < 5 + 3 * i; ++t)
      r.prompt_token_ids.push_back(static_cast<int32_t>(4 + rng() % 200));
    r.params.max_tokens = 12;
    r.params.ignore_eos = true;
    r.params.seed = 100 + i;
    r.params.temperature = i % 3 == 0 ? 0.0 : 0.9;
    r.params.top_p = i % 3 == 2 ? 0.9 : 1.0;
    r.params.n = i == 4 ? 3 : 1;
    r.params.logprobs = i == 1 ? 2 : 0;
    r.params.min_tokens = i == 5 ? 4 : 0;
    reqs.push_back(r);
  }
  cfg.sampler = "cpu";
  LlmEngine cpu(cfg);
  cfg.sampler = "tensor";
  LlmEngine tensor(cfg);
  const auto a = cpu.generate(reqs);
  const auto b = tensor.generate(reqs);
  for (size_t i = 0; i < a.size(); ++i) {
    ASSERT_EQ(a[i].outputs.size(), b[i].outputs.size());
    for (size_t k = 0; k < a[i].outputs.size(); ++k) {
      SCOPED_TRACE(a[i].request_id + " sample " + std::to_string(k));
      const auto& x = a[i].outputs[k];
      const auto& y = b[i].outputs[k];
      EXPECT_EQ(x.token_ids, y.token_ids);
      ASSERT_EQ(x.raw_logprobs.size(), y.raw_logprobs.size());
      for (size_t t = 0; t < x.raw_logprobs.size(); ++t) {
        EXPECT_NEAR(x.raw_logprobs[t], y.raw_logprobs[t], 1e-5);
        EXPECT_NEAR(x.processed_logprobs[t], y.processed_logprobs[t], 1e-5);
      }
      EXPECT_EQ(x.top_logprobs.size(), y.top_logprobs.size());
    }
  }
  if (d2h_bytes_per_step != nullptr) {
    *d2h_bytes_per_step = tensor.stats().max_step_d2h_bytes;
  }
}

TEST(TensorSamplerTest, AnEngineWithTheTensorSamplerGivesTheCpuSamplersOutputs) {
  expect_engines_agree(test::test_engine_config("qwen2"));
}

// --- On the device (ctest label gpu; skipped where no CUDA device is present). ---

TEST(CudaTensorSamplerTest, MatchesTheCpuSamplerOnTheSameLogits) {
  if (!at::hasCUDA()) GTEST_SKIP() << "no CUDA device";
  const auto configs = filter_configs();
  const std::vector<int32_t> banned = {3, 5, 7, 11};
  const at::Tensor cpu = random_logits(256, 151936, 2.5, 21);
  const at::Tensor dev = cpu.to(at::Device("cuda"));
  // The device's reductions and prefix sums run in other orders: allow a few boundary draws.
  expect_samplers_agree(cpu, dev, mixed_rows(256, configs, &banned), /*max_draw_mismatches=*/2);
  expect_kept_sets_match_the_definition(dev.narrow(0, 0, 2), cpu.narrow(0, 0, 2));
  // Only ids and log-probs come back: 4 words a row plus the top log-probs asked (5 here).
  SamplingParams p;
  std::vector<SampleRow> rows;
  for (int64_t r = 0; r < 256; ++r) rows.push_back({r, &p, 1, 0, r, nullptr});
  TensorSamplerStats stats;
  sample_tokens_tensor(dev, rows, &stats);
  EXPECT_EQ(stats.d2h_bytes, 256 * 4 * 4);
}

// A batch of plain rows (temperatures, greedy rows; no filter, ban or top log-probs) runs as the
// fused kernel: against the CPU sampler, and against the tensor ops on the same device.
TEST(CudaTensorSamplerTest, PlainRowsTakeTheFusedKernelAndMatchTheCpuSampler) {
  if (!at::hasCUDA()) GTEST_SKIP() << "no CUDA device";
  std::vector<SamplingParams> configs(4);
  configs[0].temperature = 0;
  configs[1].temperature = 0.7;
  configs[2].temperature = 1.0;
  configs[3].temperature = 1.3;
  const at::Tensor cpu = random_logits(256, 151936, 2.5, 23);
  const at::Tensor dev = cpu.to(at::Device("cuda"));
  const auto rows = mixed_rows(256, configs);
  expect_samplers_agree(cpu, dev, rows, /*max_draw_mismatches=*/2);
  const auto fused = sample_tokens_tensor(dev, rows, nullptr, /*fused=*/true);
  const auto ops = sample_tokens_tensor(dev, rows, nullptr, /*fused=*/false);
  int differ = 0;
  for (size_t r = 0; r < rows.size(); ++r) {
    differ += fused[r].token != ops[r].token;
    if (fused[r].token != ops[r].token) continue;
    EXPECT_NEAR(fused[r].raw_logprob, ops[r].raw_logprob, 1e-5) << "row " << r;
    EXPECT_NEAR(fused[r].processed_logprob, ops[r].processed_logprob, 1e-5) << "row " << r;
  }
  EXPECT_LE(differ, 2);
  // A NaN row is the same error as on the other paths.
  at::Tensor bad = dev.clone();
  bad[5][77] = std::numeric_limits<float>::quiet_NaN();
  EXPECT_THROW(sample_tokens_tensor(bad, rows), std::runtime_error);
}

TEST(CudaTensorSamplerTest, AnEngineOnTheDeviceCopiesOnlyIdsAndLogprobs) {
  if (!at::hasCUDA()) GTEST_SKIP() << "no CUDA device";
  EngineConfig cfg = test::test_engine_config("qwen2");
  cfg.device = "cuda";
  int64_t per_step = 0;
  expect_engines_agree(cfg, &per_step);
  EXPECT_GT(per_step, 0);
  EXPECT_LE(per_step, 64 * 1024);
}

}  // namespace
}  // namespace crl::engine
