// HttpServer: the HTTP transport of the API server, cpp-httplib behind a pimpl.
//
// Only http_server.cpp includes httplib.h. Routes take and return the plain HttpRequest /
// HttpResponse below, so the API handlers (server/api_server.cpp) know nothing of httplib.
//
// httplib parses requests and routes them; the connection loop around them is this file's
// (deadlines per request, a cap per client address, pipelined requests answered in order, a
// connection closed after a refused or malformed request).
//
// Thread safety: route() before start(); start() and stop() from one controlling thread.
// Handlers run on the server's worker threads, one connection per thread at a time.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace crl::server {

struct HttpRequest {
  std::string method;
  std::string path;
  std::string body;
  std::multimap<std::string, std::string> headers;  // names lower-cased
  // False once the client closed its connection (polls the socket without reading from it).
  // Cheap enough to call every few tens of milliseconds while a handler waits.
  std::function<bool()> is_connection_alive;
};

// Where a streaming body goes, one piece at a time.
struct ChunkSink {
  // Sends `data` now; false when the client is gone (the stream should stop).
  std::function<bool(const std::string& data)> write;
  // False once the client closed its connection.
  std::function<bool()> is_alive;
};

struct HttpResponse {
  int status = 200;
  std::string content_type = "application/json";
  std::string body;
  std::vector<std::pair<std::string, std::string>> headers;
  // Streaming: when set, the body is sent with chunked transfer encoding by calling stream(sink)
  // once, after the status line and headers; it returns true when it wrote everything, false
  // when it stopped early (client gone, server stopping). `body` is then ignored.
  std::function<bool(ChunkSink& sink)> stream;
  // Called exactly once when a streaming response is over, whatever happened (even when stream
  // was never called because the client left first): frees what the stream holds.
  std::function<void()> on_close;
};

using HttpHandler = std::function<HttpResponse(const HttpRequest&)>;
// Runs on the request line and headers alone (HttpRequest::body empty), before a body is read: a
// response it returns is sent as it is, the connection closed and the body never read (an
// unauthenticated client cannot make the server buffer its body); nullopt lets the request on.
using HttpGate = std::function<std::optional<HttpResponse>(const HttpRequest&)>;

struct HttpServerOptions {
  // Worker threads: each in-flight request holds one while it runs (streams included).
  int threads = 128;
  // Bodies over this size are refused with 413 before any handler runs, counted as they arrive
  // whatever the transfer encoding (a chunked body has no Content-Length to check first); the
  // connection is then closed.
  size_t max_body_bytes = size_t{8} << 20;
  // Seconds one request may take to arrive, counted from its first byte: its request line and
  // headers within head_timeout_s, the whole request (body included) within request_timeout_s.
  // Past them the request gets 408 and the connection is closed, so a client that trickles bytes
  // holds a worker thread for no longer.
  double head_timeout_s = 10;
  double request_timeout_s = 60;
  // Connections one client address may hold open at once (0: no cap); more are answered 503 with
  // Retry-After and closed. Loopback clients are not capped unless cap_loopback_clients (the
  // host's own processes: an evaluation harness on the same machine may open hundreds).
  int max_connections_per_client = 64;
  bool cap_loopback_clients = false;
  // Renders the body of a transport-level error (404 no route, 413 too large, ...) when the
  // handler left it empty: (status) -> JSON text.
  std::function<std::string(int status)> error_body;
};

class HttpServer {
 public:
  explicit HttpServer(HttpServerOptions options);
  ~HttpServer();  // stops
  HttpServer(const HttpServer&) = delete;
  HttpServer& operator=(const HttpServer&) = delete;

  // method: "GET" or "POST"; path: exact match. `gate`, when set, runs first (HttpGate).
  void route(const std::string& method, const std::string& path, HttpHandler handler,
             HttpGate gate = {});

  // Binds host:port (port 0 = any free port) and serves on a background thread. Returns the bound
  // port. Throws std::runtime_error when the address cannot be bound.
  int start(const std::string& host, int port);
  // Stops listening and joins the worker threads; handlers must return promptly by themselves.
  void stop();
  bool running() const;
  int port() const { return port_; }

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
  int port_ = 0;
};

}  // namespace crl::server
