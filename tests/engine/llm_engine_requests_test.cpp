// The engine's request lifecycle end to end: stops, bad requests, aborts in every state, and a
// failed step that fails only its own requests.
#include <gtest/gtest.h>

#include <random>
#include <string>
#include <vector>

#include "engine/llm_engine.h"
#include "tests/engine/engine_requests.h"
#include "tests/engine/test_model.h"
#include "tests/test_utils.h"

namespace crl::engine {
namespace {

using test::greedy;
using test::random_tokens;

TEST(LlmEngineTest, StopTokensStopStringsAndLengthsFinishAsDocumented) {
  EngineConfig cfg = test::test_engine_config();
  LlmEngine eng(cfg);
  std::mt19937 rng(8);
  auto prompt = random_tokens(rng, 6);
  auto base = eng.generate({greedy("base", prompt, 12)})[0].outputs[0];
  EXPECT_EQ(base.finish_reason, FinishReason::kLength);
  ASSERT_EQ(base.token_ids.size(), 12u);

  auto by_token = greedy("tok", prompt, 12);
  by_token.params.stop_token_ids = {base.token_ids[4]};
  auto t = eng.generate({by_token})[0].outputs[0];
  EXPECT_EQ(t.finish_reason, FinishReason::kStop);
  ASSERT_TRUE(t.stop_token.has_value());
  EXPECT_EQ(t.token_ids.back(), base.token_ids[4]);
  EXPECT_LE(t.token_ids.size(), 5u);

  auto min_tok = by_token;
  min_tok.request_id = "min";
  min_tok.params.min_tokens = 8;
  auto m = eng.generate({min_tok})[0].outputs[0];
  EXPECT_GE(m.token_ids.size(), 8u);

  ASSERT_GE(base.text.size(), 6u);
  auto by_string = greedy("str", prompt, 12);
  const std::string stop = base.text.substr(base.text.size() / 2, 3);
  by_string.params.stop = {stop};
  auto s = eng.generate({by_string})[0].outputs[0];
  EXPECT_EQ(s.finish_reason, FinishReason::kStop);
  ASSERT_TRUE(s.stop_string.has_value());
  EXPECT_EQ(s.text.find(stop), std::string::npos);
  EXPECT_EQ(base.text.rfind(s.text, 0), 0u) << "the cut text is a prefix of the full text";
}

TEST(LlmEngineTest, RejectsBadRequestsWithClearErrors) {
  EngineConfig cfg = test::test_engine_config();
  cfg.max_model_len = 64;
  LlmEngine eng(cfg);
  std::mt19937 rng(9);
  ASSERT_THROWS_WITH(eng.add_request(greedy("long", random_tokens(rng, 60), 10)),
                     std::invalid_argument, "exceeds the context length 64");
  ASSERT_THROWS_WITH(eng.add_request(greedy("vocab", {1, 2, 100000}, 4)), std::invalid_argument,
                     "outside the vocabulary");
  auto bad = greedy("bad", {5, 6}, 4);
  bad.params.top_p = 1.5;
  ASSERT_THROWS_WITH(eng.add_request(bad), std::invalid_argument, "top_p");
  eng.add_request(greedy("dup", {5, 6}, 4));
  ASSERT_THROWS_WITH(eng.add_request(greedy("dup", {5, 6}, 4)), std::invalid_argument,
                     "already in use");
  EngineConfig small = test::test_engine_config();
  small.num_kv_blocks = 3;
  LlmEngine tiny(small);
  ASSERT_THROWS_WITH(tiny.add_request(greedy("big", random_tokens(rng, 10), 10)),
                     std::invalid_argument, "does not fit the KV pool");
}

TEST(LlmEngineTest, AbortFreesBlocksInEveryState) {
  EngineConfig cfg = test::test_engine_config();
  cfg.num_kv_blocks = 24;
  cfg.max_batched_tokens = 8;
  LlmEngine eng(cfg);
  std::mt19937 rng(10);
  for (int i = 0; i < 5; ++i)
    eng.add_request(greedy("r" + std::to_string(i), random_tokens(rng, 19), 40));
  eng.add_request(greedy("waiting", random_tokens(rng, 5), 5));
  eng.step();
  eng.step();  // r0 is mid chunked prefill, others wait
  eng.abort("waiting");
  eng.abort("r0");
  int64_t preempted_seen = 0;
  for (int i = 0; i < 200 && eng.has_unfinished(); ++i) {
    eng.step();
    preempted_seen = eng.stats().preemptions;
    if (i == 30) eng.abort("r1");  // decoding (or preempted)
    if (preempted_seen > 0) eng.abort("r4");
  }
  while (eng.has_unfinished()) eng.step();
  EXPECT_EQ(eng.scheduler().allocator().num_free_blocks(), 24);
  eng.scheduler().allocator().check_invariants();
}

}  // namespace
}  // namespace crl::engine
