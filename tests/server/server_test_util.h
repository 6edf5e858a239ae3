// Helpers for the HTTP API tests: a served test model and a few client calls (httplib::Client).
#pragma once

#include <httplib.h>

#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "engine/llm_engine.h"
#include "server/api_server.h"

namespace crl::test {

// A Server on a free loopback port over a test model; ready when constructed.
struct ServedModel {
  explicit ServedModel(engine::EngineConfig config, server::ServerOptions options = {});
  ~ServedModel();
  std::unique_ptr<httplib::Client> client(int read_timeout_ms = 60000) const;
  // POSTs JSON; returns (status, body). Status -1 when the transport failed.
  std::pair<int, std::string> post(const std::string& path, const nlohmann::json& body) const;
  std::pair<int, std::string> post_raw(const std::string& path, const std::string& body) const;
  // POSTs a streaming request; returns the "data: " payloads in order ([DONE] included).
  std::vector<std::string> stream(const std::string& path, nlohmann::json body,
                                  int* status = nullptr) const;
  // The value of a Prometheus sample line starting with `prefix` (name plus labels); -1 if absent.
  double metric(const std::string& prefix) const;
  // Polls /metrics until crl:kv_blocks_used is 0 and no request runs or waits; false on timeout.
  bool wait_idle(double timeout_s) const;

  server::Server server;
  int port = 0;
};

// The test model (llama) in deterministic mode: logits do not depend on batching or prefix-cache
// hits, so the server's engine and a separate reference engine sample the same tokens for the same
// seed.
engine::EngineConfig server_test_config();

// Splits an SSE body into its "data: " payloads.
std::vector<std::string> sse_payloads(const std::string& body);

}  // namespace crl::test
