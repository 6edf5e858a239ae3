#include "tests/server/server_test_util.h"

#include <chrono>
#include <sstream>
#include <thread>

#include "tests/engine/test_model.h"

namespace crl::test {

namespace {

server::ServerOptions loopback(server::ServerOptions o) {
  o.host = "127.0.0.1";
  o.port = 0;
  return o;
}

}  // namespace

ServedModel::ServedModel(engine::EngineConfig config, server::ServerOptions options)
    : server(std::move(config), loopback(std::move(options))) {
  port = server.start();
  server.engine_loop().wait_ready();
}

ServedModel::~ServedModel() { server.stop(); }

std::unique_ptr<httplib::Client> ServedModel::client(int read_timeout_ms) const {
  auto c = std::make_unique<httplib::Client>("127.0.0.1", port);
  c->set_read_timeout(read_timeout_ms / 1000, (read_timeout_ms % 1000) * 1000);
  c->set_connection_timeout(5, 0);
  return c;
}

std::pair<int, std::string> ServedModel::post(const std::string& path,
                                              const nlohmann::json& body) const {
  return post_raw(path, body.dump());
}

std::pair<int, std::string> ServedModel::post_raw(const std::string& path,
                                                  const std::string& body) const {
  auto c = client();
  auto res = c->Post(path.c_str(), body, "application/json");
  if (!res) return {-1, httplib::to_string(res.error())};
  return {res->status, res->body};
}

engine::EngineConfig server_test_config() {
  engine::EngineConfig c = test_engine_config("llama");
  c.deterministic = true;
  return c;
}

std::vector<std::string> sse_payloads(const std::string& body) {
  std::vector<std::string> out;
  std::istringstream in(body);
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("data: ", 0) == 0) out.push_back(line.substr(6));
  }
  return out;
}

std::vector<std::string> ServedModel::stream(const std::string& path, nlohmann::json body,
                                             int* status) const {
  body["stream"] = true;
  auto c = client();
  auto res = c->Post(path.c_str(), body.dump(), "application/json");
  if (status) *status = res ? res->status : -1;
  if (!res) return {};
  return sse_payloads(res->body);
}

double ServedModel::metric(const std::string& prefix) const {
  auto c = client();
  auto res = c->Get("/metrics");
  if (!res || res->status != 200) return -1;
  std::istringstream in(res->body);
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind(prefix, 0) == 0 && line.size() > prefix.size() &&
        (line[prefix.size()] == ' ' || line[prefix.size()] == '{')) {
      return std::stod(line.substr(line.rfind(' ') + 1));
    }
  }
  return -1;
}

bool ServedModel::wait_idle(double timeout_s) const {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
  while (std::chrono::steady_clock::now() < deadline) {
    if (metric("crl:kv_blocks_used") == 0 && metric("vllm:num_requests_running") == 0 &&
        metric("vllm:num_requests_waiting") == 0) {
      return true;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return false;
}

}  // namespace crl::test
