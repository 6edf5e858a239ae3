// Repetition, frequency and presence penalties (issue 52) against their definitions (vLLM's and
// OpenAI's): the entries a sequence's history gives, the sampled frequencies (chi-square) and
// processed log-probs under the penalized distribution with raw log-probs untouched, the tensor
// sampler equal to the CPU sampler, and a whole engine (greedy) picking the argmax of each step's
// penalized logits.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <utility>
#include <vector>

#include "engine/llm_engine.h"
#include "engine/sampler.h"
#include "engine/sampling_params.h"
#include "engine/tensor_sampler.h"
#include "tests/engine/test_model.h"

namespace crl::engine {
namespace {

// The definition, in double: repetition on every id of prompt or output, then frequency and
// presence on the generated ones.
std::vector<double> penalized_reference(const std::vector<float>& x, const SamplingParams& p,
                                        const std::vector<int32_t>& tokens, int64_t prompt_len) {
  std::vector<double> z(x.begin(), x.end());
  std::map<int32_t, int> generated;
  std::map<int32_t, bool> seen;
  for (size_t i = 0; i < tokens.size(); ++i) {
    seen[tokens[i]] = true;
    if (static_cast<int64_t>(i) >= prompt_len) ++generated[tokens[i]];
  }
  for (const auto& [id, yes] : seen) {
    z[id] = z[id] > 0 ? z[id] / p.repetition_penalty : z[id] * p.repetition_penalty;
  }
  for (const auto& [id, c] : generated) z[id] -= p.frequency_penalty * c + p.presence_penalty;
  return z;
}

TEST(SamplerPenaltyTest, EntriesFollowTheHistory) {
  SamplingParams p;
  EXPECT_TRUE(penalty_entries(p, {1, 2, 3}, 1).empty());  // no penalty: nothing to apply
  p.repetition_penalty = 1.5;
  p.frequency_penalty = 0.5;
  p.presence_penalty = 0.25;
  // prompt 5 6 5, generated 6 7 7
  const std::vector<PenaltyEntry> e = penalty_entries(p, {5, 6, 5, 6, 7, 7}, 3);
  ASSERT_EQ(e.size(), 3u);
  EXPECT_EQ(e[0].id, 5);
  EXPECT_EQ(e[0].rep, 1.5f);
  EXPECT_EQ(e[0].add, 0.0f);  // only in the prompt
  EXPECT_EQ(e[1].id, 6);
  EXPECT_EQ(e[1].add, -0.75f);  // generated once
  EXPECT_EQ(e[2].id, 7);
  EXPECT_EQ(e[2].add, -1.25f);  // twice
  SamplingParams f;
  f.frequency_penalty = 1;
  const std::vector<PenaltyEntry> g = penalty_entries(f, {5, 6, 5, 6, 7, 7}, 3);
  ASSERT_EQ(g.size(), 2u);  // prompt-only ids are untouched without repetition_penalty
  EXPECT_EQ(g[0].id, 6);
  EXPECT_EQ(g[0].rep, 1.0f);
  EXPECT_EQ(penalized(2.0f, e[0]), 2.0f / 1.5f);
  EXPECT_EQ(penalized(-2.0f, e[2]), -2.0f * 1.5f - 1.25f);
}

TEST(SamplerPenaltyTest, SampledFrequenciesAndLogprobsFollowThePenalizedSoftmax) {
  const std::vector<float> x = {1.0f, 0.5f, -0.3f, 2.0f, 0.0f, -1.0f, 1.5f, 0.2f};
  const at::Tensor logits = at::tensor(x).reshape({1, 8});
  SamplingParams p;
  p.temperature = 0.8;
  p.repetition_penalty = 1.3;
  p.frequency_penalty = 0.4;
  p.presence_penalty = 0.3;
  const std::vector<int32_t> tokens = {3, 0, 3, 6, 6, 2};  // prompt 3 0, generated 3 6 6 2
  const std::vector<PenaltyEntry> entries = penalty_entries(p, tokens, 2);
  const std::vector<double> z = penalized_reference(x, p, tokens, 2);
  std::vector<double> probs(8);
  double zmax = *std::max_element(z.begin(), z.end()), sum = 0;
  for (int i = 0; i < 8; ++i) sum += probs[i] = std::exp((z[i] - zmax) / p.temperature);
  for (double& q : probs) q /= sum;
  const double lse = std::log(at::exp(logits.to(at::kDouble)).sum().item<double>());
  const int n = 20000;
  std::vector<SampleRow> rows(n);
  for (int i = 0; i < n; ++i) {
    rows[i].params = &p;
    rows[i].seed = 99;
    rows[i].position = i;
    rows[i].penalties = &entries;
  }
  std::vector<int> counts(8, 0);
  const std::vector<SampleResult> cpu = sample_tokens(logits, rows);
  for (const SampleResult& r : cpu) {
    ++counts[r.token];
    EXPECT_NEAR(r.processed_logprob, std::log(probs[r.token]), 1e-5);
    EXPECT_NEAR(r.raw_logprob, x[r.token] - lse, 1e-5);  // raw: the model's, unpenalized
  }
  double chi2 = 0;
  for (int i = 0; i < 8; ++i)
    chi2 += (counts[i] - n * probs[i]) * (counts[i] - n * probs[i]) / (n * probs[i]);
  EXPECT_LT(chi2, 24.322);  // chi-square 0.999 quantile, 7 degrees of freedom
  // The penalties moved the distribution: token 3 (the max logit, generated once) lost mass.
  const at::Tensor plain = at::softmax(logits.to(at::kDouble)[0] / p.temperature, 0);
  EXPECT_LT(probs[3], plain[3].item<double>() - 0.1);
  // The tensor sampler (here on CPU tensors) draws the same tokens with the same log-probs.
  const std::vector<SampleResult> tensor = sample_tokens_tensor(logits, rows);
  for (int i = 0; i < n; ++i) {
    ASSERT_EQ(tensor[i].token, cpu[i].token) << i;
    EXPECT_NEAR(tensor[i].processed_logprob, cpu[i].processed_logprob, 1e-5);
    EXPECT_NEAR(tensor[i].raw_logprob, cpu[i].raw_logprob, 1e-6);
  }
}

TEST(SamplerPenaltyTest, GreedyTakesThePenalizedArgmaxAndBansStillApply) {
  const std::vector<float> x = {1.0f, 3.0f, 2.5f, -1.0f};
  const at::Tensor logits = at::tensor(x).reshape({1, 4});
  SamplingParams p;
  p.temperature = 0;
  p.repetition_penalty = 2.0;  // id 1 in the prompt: 3.0 -> 1.5, so 2.5 (id 2) wins
  const std::vector<PenaltyEntry> entries = penalty_entries(p, {1, 0}, 2);
  SampleRow row;
  row.params = &p;
  row.penalties = &entries;
  EXPECT_EQ(sample_tokens(logits, {row})[0].token, 2);
  EXPECT_EQ(sample_tokens_tensor(logits, {row})[0].token, 2);
  const std::vector<int32_t> banned = {2};
  row.banned = &banned;  // banned after the penalties: 1.5 (id 1) beats 1.0 / 2 (id 0)
  EXPECT_EQ(sample_tokens(logits, {row})[0].token, 1);
  EXPECT_EQ(sample_tokens_tensor(logits, {row})[0].token, 1);
  const std::vector<int32_t> all = {0, 1, 2, 3};
  row.banned = &all;  // everything banned: the penalized row, unbanned
  EXPECT_EQ(sample_tokens(logits, {row})[0].token, 2);
  EXPECT_EQ(sample_tokens_tensor(logits, {row})[0].token, 2);
}

// Every greedy token of a whole engine is the argmax of its step's logits after the penalties of
// what came before it (the history the engine keeps per sequence, prefill chunks and decode).
TEST(SamplerPenaltyTest, AnEnginesGreedyTokensAreThePenalizedArgmaxOfEachStep) {
  EngineConfig cfg = test::test_engine_config("llama");
  LlmEngine eng(cfg);
  std::map<int64_t, at::Tensor> seen;
  eng.set_logits_observer([&](const std::string&, int32_t, int64_t pos, const at::Tensor& l) {
    seen[pos] = l.clone();
  });
  GenerateRequest q;
  q.request_id = "pen";
  q.prompt_token_ids = {5, 9, 5, 17, 9, 5};
  q.params.temperature = 0;
  q.params.max_tokens = 12;
  q.params.ignore_eos = true;
  q.params.repetition_penalty = 1.8;
  q.params.frequency_penalty = 1.0;
  q.params.presence_penalty = 0.5;
  const RequestOutput out = eng.generate({q}).at(0);
  const std::vector<int32_t>& gen = out.outputs.at(0).token_ids;
  ASSERT_EQ(gen.size(), 12u);
  std::vector<int32_t> tokens = q.prompt_token_ids;
  int changed = 0;
  for (int32_t t : gen) {
    const int64_t pos = static_cast<int64_t>(tokens.size());
    ASSERT_TRUE(seen.count(pos)) << pos;
    const at::Tensor row = seen[pos].to(at::kFloat).contiguous();
    const std::vector<float> x(row.data_ptr<float>(), row.data_ptr<float>() + row.numel());
    const std::vector<double> z = penalized_reference(x, q.params, tokens, 6);
    EXPECT_EQ(std::max_element(z.begin(), z.end()) - z.begin(), t) << "position " << pos;
    changed += std::max_element(x.begin(), x.end()) - x.begin() != t;
    tokens.push_back(t);
  }
  EXPECT_GT(changed, 0) << "the penalties never changed a greedy choice: the test shows nothing";
}

}  // namespace
}  // namespace crl::engine
