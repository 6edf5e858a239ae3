// Many concurrent clients mixing streaming, non-streaming and early-disconnecting requests:
// no 5xx, no crash, and the KV pool is empty again afterwards.
//
// 64 clients for CRL_SERVER_LOAD_SECONDS (default 3 s); ctest also runs the 20 s version
// (label `long`).
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <map>
#include <mutex>
#include <random>
#include <thread>

#include "tests/engine/test_model.h"
#include "tests/server/server_test_util.h"

namespace crl::test {
namespace {

using json = nlohmann::json;

TEST(ServerLoadTest, ManyClientsMixedStreamingAndDisconnects) {
  const char* env = std::getenv("CRL_SERVER_LOAD_SECONDS");
  const double seconds = env ? std::atof(env) : 3.0;
  constexpr int kClients = 64;
  engine::EngineConfig config = test_engine_config("llama");
  config.max_seqs = 32;
  ServedModel served(config);

  std::mutex mu;
  std::map<int, int64_t> statuses;  // HTTP status -> count (-1: transport failure)
  std::vector<std::string> failures;
  std::atomic<int64_t> completed{0}, disconnected{0}, streamed_tokens{0};
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
  std::vector<std::thread> clients;
  for (int i = 0; i < kClients; ++i) {
    clients.emplace_back([&, i] {
      std::mt19937 rng(1234 + i);
      auto c = served.client();
      while (std::chrono::steady_clock::now() < deadline) {
        const int kind = static_cast<int>(rng() % 4);  // 0,1: plain  2: stream  3: leave early
        json body = {{"prompt", "Request " + std::to_string(rng() % 1000) + " from a busy client"},
                     {"max_tokens", 4 + static_cast<int>(rng() % 28)},
                     {"n", 1 + static_cast<int>(rng() % 2)},
                     {"temperature", 1.0},
                     {"ignore_eos", rng() % 2 == 0}};
        int status = -1;
        std::string failure;
        if (kind < 2) {
          auto res = c->Post("/v1/completions", body.dump(), "application/json");
          if (res)
            status = res->status;
          else
            failure = "post: " + httplib::to_string(res.error());
          if (res && res->status == 200) completed++;
        } else {
          body["stream"] = true;
          body["stream_options"] = {{"include_usage", true}};
          httplib::Request req;
          req.method = "POST";
          req.path = i % 2 ? "/v1/completions" : "/v1/chat/completions";
          if (i % 2 == 0) {
            body.erase("prompt");
            body["messages"] =
                json::array({{{"role", "user"}, {"content", "hello " + std::to_string(i)}}});
          }
          req.body = body.dump();
          req.set_header("Content-Type", "application/json");
          const int leave_after = kind == 3 ? 1 + static_cast<int>(rng() % 3) : 1 << 30;
          int chunks = 0;
          std::string received;
          req.content_receiver = [&](const char* data, size_t len, uint64_t, uint64_t) {
            received.append(data, len);
            return ++chunks < leave_after;
          };
          auto res = c->send(req);
          if (res) {
            status = res->status;
            if (status == 200) {
              completed++;
              if (received.find("data: [DONE]") == std::string::npos) status = -2;  // truncated
              streamed_tokens += static_cast<int64_t>(sse_payloads(received).size());
            }
          } else if (kind == 3 && res.error() == httplib::Error::Canceled) {
            status = 0;  // left on purpose
            disconnected++;
            c = served.client();  // the old connection is gone
          } else {
            failure = std::string("stream: ") + httplib::to_string(res.error()) + " after " +
                      std::to_string(chunks) + " chunks";
            c = served.client();
          }
        }
        std::lock_guard<std::mutex> lock(mu);
        statuses[status]++;
        if (!failure.empty() && failures.size() < 10) failures.push_back(failure);
      }
    });
  }
  for (auto& t : clients) t.join();

  std::string summary;
  for (auto [s, n] : statuses) summary += std::to_string(s) + ":" + std::to_string(n) + " ";
  for (const auto& f : failures) summary += "[" + f + "] ";
  for (auto [s, n] : statuses) {
    EXPECT_TRUE(s == 200 || s == 0) << "status " << s << " x" << n << " (" << summary << ")";
  }
  EXPECT_GT(completed.load(), kClients) << summary;
  EXPECT_GT(disconnected.load(), 0) << summary;
  EXPECT_TRUE(served.wait_idle(10))
      << "KV blocks still in use: " << served.metric("crl:kv_blocks_used");
  EXPECT_EQ(served.metric("crl:kv_blocks_used"), 0);
  EXPECT_EQ(served.metric("vllm:kv_cache_usage_perc"), 0);
  auto health = served.client()->Get("/health");
  ASSERT_TRUE(health);
  EXPECT_EQ(health->status, 200);
  std::printf("load: %.0f s, %d clients: %s completed %lld, left early %lld\n", seconds, kClients,
              summary.c_str(), static_cast<long long>(completed.load()),
              static_cast<long long>(disconnected.load()));
}

}  // namespace
}  // namespace crl::test
