// HttpClient: a small blocking HTTP/1.1 client over cpp-httplib, for the benchmark and tools
// (httplib itself stays behind server/'s .cpp files).
//
// Thread safety: one client per thread.
#pragma once

#include <cstddef>
#include <functional>
#include <memory>
#include <string>

namespace crl::server {

class HttpClient {
 public:
  // `base_url`: "http://host:port" (or "host:port").
  explicit HttpClient(const std::string& base_url, double read_timeout_s = 600);
  ~HttpClient();
  HttpClient(const HttpClient&) = delete;
  HttpClient& operator=(const HttpClient&) = delete;

  struct Result {
    int status = -1;   // -1: no response (error says why)
    std::string body;  // empty for post_stream
    std::string error;
  };
  // Sends "Authorization: Bearer KEY" with every request (a server started with --api-key);
  // an empty key sends none.
  void set_api_key(const std::string& key);
  Result get(const std::string& path);
  Result post(const std::string& path, const std::string& json_body);
  // Hands the response body to on_data as it arrives; on_data returning false closes the
  // connection (the server sees the client leave).
  Result post_stream(const std::string& path, const std::string& json_body,
                     std::function<bool(const char* data, size_t size)> on_data);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace crl::server
