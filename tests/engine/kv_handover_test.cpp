// The colocated hand-over on the engine (LlmEngine::release_kv_cache, docs/design.md §5): the KV
// pool is freed with nothing in flight, comes back with the next work, and the engine then gives
// the outputs it gave before; the prefix cache goes with the pool.
#include <gtest/gtest.h>
#include <unistd.h>

#include <string>
#include <vector>

#include "common/host_memory.h"
#include "engine/engine_loop.h"
#include "engine/llm_engine.h"
#include "tests/engine/test_model.h"
#include "tests/test_utils.h"

namespace crl::engine {
namespace {

GenerateRequest greedy(const std::string& id, int max_tokens) {
  GenerateRequest r;
  r.request_id = id;
  r.prompt_token_ids = {5, 17, 42, 9, 88, 23, 61, 7, 14};  // two full blocks of 4, and one more
  r.params.temperature = 0;
  r.params.max_tokens = max_tokens;
  r.params.ignore_eos = true;
  return r;
}

TEST(KvHandoverTest, ReleasedPoolComesBackWithTheNextWorkAndTheSameOutputs) {
  LlmEngine eng(test::test_engine_config());
  const int64_t pool = eng.runner().kv_cache_bytes();
  ASSERT_GT(pool, 0);
  const auto before = eng.generate({greedy("a", 12)}).at(0).outputs.at(0).token_ids;

  EXPECT_GT(eng.runner().kv_cache().abs().sum().item<double>(), 0);  // the first request's KV
  const void* address = eng.runner().kv_cache().data_ptr();
  eng.release_kv_cache();
  EXPECT_TRUE(eng.kv_cache_released());
  EXPECT_EQ(eng.runner().kv_cache_bytes(), 0);
  // On the CPU the pages are dropped in place: the same address, reading zeros.
  EXPECT_EQ(eng.runner().kv_cache().data_ptr(), address);
  EXPECT_EQ(eng.runner().kv_cache().abs().sum().item<double>(), 0);
  EXPECT_EQ(eng.stats().kv_releases, 1);
  eng.release_kv_cache();  // a second release is a no-op
  EXPECT_EQ(eng.stats().kv_releases, 1);

  // The prefix cache went with the pool: the same prompt is computed again, not served.
  const int64_t hits = eng.stats().prefix_hit_tokens;
  const auto after = eng.generate({greedy("b", 12)}).at(0).outputs.at(0).token_ids;
  EXPECT_EQ(after, before);
  EXPECT_FALSE(eng.kv_cache_released());
  EXPECT_EQ(eng.runner().kv_cache_bytes(), pool);
  EXPECT_EQ(eng.stats().kv_restores, 1);
  EXPECT_EQ(eng.stats().prefix_hit_tokens, hits);
  // With the pool back the cache works again.
  eng.generate({greedy("c", 4)});
  EXPECT_GT(eng.stats().prefix_hit_tokens, hits);

  // An explicit restore, then nothing left to restore.
  eng.release_kv_cache();
  eng.restore_kv_cache();
  eng.restore_kv_cache();
  EXPECT_EQ(eng.stats().kv_restores, 2);
  EXPECT_EQ(eng.generate({greedy("d", 12)}).at(0).outputs.at(0).token_ids, before);
}

TEST(KvHandoverTest, ReleaseWithRequestsInFlightIsRefusedAndLosesNothing) {
  LlmEngine eng(test::test_engine_config());
  eng.add_request(greedy("a", 8));
  eng.step();  // prefilled, decoding
  ASSERT_THROWS_WITH(eng.release_kv_cache(), std::logic_error,
                     "cannot release the KV pool: 1 request(s) in flight");
  EXPECT_FALSE(eng.kv_cache_released());
  std::vector<int32_t> tokens;
  while (eng.has_unfinished()) {
    for (auto& out : eng.step()) {
      if (out.finished) tokens = out.outputs.at(0).token_ids;
    }
  }
  EXPECT_EQ(tokens.size(), 8u);
}

// drop_host_pages: every byte reads zero after, whole pages and the partial ones at both ends, and
// the tensor keeps its address.
TEST(KvHandoverTest, DroppedHostPagesReadZeroAndStayInPlace) {
  const int64_t page = sysconf(_SC_PAGESIZE);
  at::Tensor whole = at::ones({5 * page}, at::kByte);
  at::Tensor t = whole.narrow(0, 100, 3 * page + 7);  // neither end on a page boundary
  const void* address = t.data_ptr();
  drop_host_pages(t);
  EXPECT_EQ(t.data_ptr(), address);
  EXPECT_EQ(t.sum().item<int64_t>(), 0);
  EXPECT_EQ(whole.sum().item<int64_t>(), 5 * page - (3 * page + 7));  // nothing outside it
  at::Tensor tiny = at::ones({10}, at::kFloat);
  drop_host_pages(tiny);
  EXPECT_EQ(tiny.sum().item<float>(), 0);
  EXPECT_THROW(drop_host_pages(at::ones({4, 4}).t()), std::invalid_argument);
}

// Through the engine loop, as the RL job's producer does it: posted between two steps.
TEST(KvHandoverTest, EngineLoopReleasesBetweenStepsAndReportsTheRestoreTime) {
  auto loop = std::make_shared<EngineLoop>(test::test_engine_config());
  loop->start();
  loop->wait_ready();
  auto run = [&](const std::string& id) {
    auto ch = loop->submit({greedy(id, 6)});
    RequestChannel::Snapshot s;
    while (!s.all_finished) s = ch->wait(s.version, std::chrono::milliseconds(50));
    return s.outputs.at(0)->outputs.at(0).token_ids;
  };
  const auto first = run("a");
  loop->post([](LlmEngine& e) { e.release_kv_cache(); }).get();
  const auto second = run("b");
  EXPECT_EQ(second, first);
  const EngineGauges g = loop->gauges();
  EXPECT_FALSE(g.kv_released);
  EXPECT_GT(g.kv_restore_seconds, 0);
  loop->stop();
}

}  // namespace
}  // namespace crl::engine
