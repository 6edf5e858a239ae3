#include "tests/trainer/engine_rollouts.h"

#include <random>

namespace crl::test {

using trainer::Sample;
using trainer::SampleGroup;

std::vector<trainer::MicroBatch> engine_rollouts(engine::LlmEngine& eng, int prompts, int n,
                                                 int max_tokens, int64_t cap, uint64_t seed,
                                                 int reward_mod, double temperature) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int> tok(4, 500), len(3, 12);
  std::vector<engine::GenerateRequest> reqs;
  for (int i = 0; i < prompts; ++i) {
    engine::GenerateRequest r;
    for (int j = len(rng); j > 0; --j) r.prompt_token_ids.push_back(tok(rng));
    r.params.n = n;
    r.params.temperature = temperature;
    r.params.max_tokens = max_tokens;
    r.params.ignore_eos = true;
    r.params.seed = seed + i;
    reqs.push_back(r);
  }
  std::vector<SampleGroup> groups;
  for (auto& out : eng.generate(reqs)) {
    SampleGroup g;
    g.prompt_ids = out.prompt_token_ids;
    for (auto& c : out.outputs) {
      Sample s;
      s.completion_ids = c.token_ids;
      s.logprobs = c.sampled_logprobs(temperature);
      s.reward = static_cast<double>(c.token_ids[0] % reward_mod);
      g.samples.push_back(s);
    }
    groups.push_back(g);
  }
  trainer::compute_group_advantages(groups);
  return trainer::pack_micro_batches(groups, cap);
}

}  // namespace crl::test
