#include "server/http_client.h"

#include <httplib.h>

#include <stdexcept>

namespace crl::server {

struct HttpClient::Impl {
  std::unique_ptr<httplib::Client> client;
};

HttpClient::HttpClient(const std::string& base_url, double read_timeout_s)
    : impl_(std::make_unique<Impl>()) {
  std::string url = base_url;
  if (url.rfind("http://", 0) == 0) url = url.substr(7);
  while (!url.empty() && url.back() == '/') url.pop_back();
  const size_t colon = url.rfind(':');
  if (colon == std::string::npos) throw std::invalid_argument("URL '" + base_url + "' has no port");
  int port = 0;
  try {
    port = std::stoi(url.substr(colon + 1));
  } catch (const std::exception&) {
    throw std::invalid_argument("URL '" + base_url + "' has no valid port");
  }
  impl_->client = std::make_unique<httplib::Client>(url.substr(0, colon), port);
  const auto us = static_cast<int64_t>(read_timeout_s * 1e6);
  impl_->client->set_read_timeout(static_cast<time_t>(us / 1000000),
                                  static_cast<time_t>(us % 1000000));
  impl_->client->set_tcp_nodelay(true);
  impl_->client->set_keep_alive(true);  // one connection for many requests, as real clients do
}

HttpClient::~HttpClient() = default;

void HttpClient::set_api_key(const std::string& key) {
  if (!key.empty()) impl_->client->set_bearer_token_auth(key);
}

HttpClient::Result HttpClient::get(const std::string& path) {
  Result r;
  auto res = impl_->client->Get(path.c_str());
  if (!res) {
    r.error = httplib::to_string(res.error());
    return r;
  }
  r.status = res->status;
  r.body = res->body;
  return r;
}

HttpClient::Result HttpClient::post(const std::string& path, const std::string& json_body) {
  Result r;
  auto res = impl_->client->Post(path.c_str(), json_body, "application/json");
  if (!res) {
    r.error = httplib::to_string(res.error());
    return r;
  }
  r.status = res->status;
  r.body = res->body;
  return r;
}

HttpClient::Result HttpClient::post_stream(const std::string& path, const std::string& json_body,
                                           std::function<bool(const char*, size_t)> on_data) {
  httplib::Request req;
  req.method = "POST";
  req.path = path;
  req.body = json_body;
  req.set_header("Content-Type", "application/json");
  req.content_receiver = [&on_data](const char* data, size_t size, uint64_t, uint64_t) {
    return on_data(data, size);
  };
  Result r;
  auto res = impl_->client->send(req);
  if (!res) {
    r.error = httplib::to_string(res.error());
    return r;
  }
  r.status = res->status;
  return r;
}

}  // namespace crl::server
