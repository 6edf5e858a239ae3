// What server/api_server.cpp and server/api_completions.cpp share: JSON and error responses, the
// poll interval of a request waiting on the engine, and the in-flight slot.
#pragma once

#include <atomic>
#include <chrono>
#include <nlohmann/json.hpp>
#include <string>

#include "server/api_types.h"
#include "server/completion_render.h"
#include "server/http_server.h"

namespace crl::server {

constexpr auto kPollInterval = std::chrono::milliseconds(20);
constexpr int kClientClosedRequest = 499;  // nginx's status for "client went away"

inline HttpResponse json_response(int status, const nlohmann::json& body) {
  HttpResponse r;
  r.status = status;
  r.body = dump_json(body);
  return r;
}

inline HttpResponse error_response(int status, const std::string& message,
                                   const std::string& param = "", const std::string& code = "") {
  return json_response(status, error_json(status, message, param, code));
}

// Decrements the in-flight count when the last holder (handler or stream) lets go.
class InFlightSlot {
 public:
  explicit InFlightSlot(std::atomic<int>& count) : count_(count) {}
  ~InFlightSlot() { count_--; }
  InFlightSlot(const InFlightSlot&) = delete;
  InFlightSlot& operator=(const InFlightSlot&) = delete;

 private:
  std::atomic<int>& count_;
};

}  // namespace crl::server
