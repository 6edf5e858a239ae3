// The trainer tests' data: an engine's rollouts of random prompts, scored and packed.
#pragma once

#include <cstdint>
#include <vector>

#include "engine/llm_engine.h"
#include "trainer/micro_batch.h"

namespace crl::test {

// `prompts` random prompts (3-12 ids in [4, 500]) of `n` seeded samples of `max_tokens` at
// `temperature` (requests without an adapter: the engine's policy adapter where it has one), each
// sample rewarded its first token mod `reward_mod` (arbitrary but varied), its log-probs those of
// the distribution sampled from, group advantages computed, packed into micro-batches of at most
// `cap` tokens.
std::vector<trainer::MicroBatch> engine_rollouts(engine::LlmEngine& eng, int prompts, int n,
                                                 int max_tokens, int64_t cap, uint64_t seed,
                                                 int reward_mod = 7, double temperature = 1.0);

}  // namespace crl::test
