// The only file that includes httplib.h (with the defines Debian's libcpp-httplib was built with,
// see server/CMakeLists.txt: the struct layouts depend on them).
#include "server/http_server.h"

#include <arpa/inet.h>
#include <httplib.h>
#include <malloc.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <set>
#include <stdexcept>
#include <thread>

namespace crl::server {

namespace {

std::string lower(std::string s) {
  for (auto& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

using Clock = std::chrono::steady_clock;

// True while the peer has not closed: a non-blocking peek reads 0 bytes only after its FIN.
bool socket_alive(int fd) {
  char c;
  const ssize_t n = recv(fd, &c, 1, MSG_PEEK | MSG_DONTWAIT);
  if (n > 0) return true;
  if (n == 0) return false;
  return errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR;
}

// poll() for `events` on fd, at most until `until` (or until *stopped, looked at every 100 ms);
// true when ready.
bool wait_for(int fd, short events, Clock::time_point until,
              const std::atomic<bool>* stopped = nullptr) {
  for (;;) {
    const auto left =
        std::chrono::duration_cast<std::chrono::milliseconds>(until - Clock::now()).count();
    if (left <= 0 || (stopped && *stopped)) return false;
    pollfd p{fd, events, 0};
    const int r = ::poll(&p, 1, static_cast<int>(std::min<int64_t>(left, 100)));
    if (r > 0) return true;
    if (r < 0 && errno != EINTR) return false;
  }
}

void address_of(const sockaddr_storage& a, std::string& ip, int& port) {
  char buf[INET6_ADDRSTRLEN] = {0};
  port = -1;
  if (a.ss_family == AF_INET) {
    const auto& in = reinterpret_cast<const sockaddr_in&>(a);
    inet_ntop(AF_INET, &in.sin_addr, buf, sizeof(buf));
    port = ntohs(in.sin_port);
  } else if (a.ss_family == AF_INET6) {
    const auto& in6 = reinterpret_cast<const sockaddr_in6&>(a);
    inet_ntop(AF_INET6, &in6.sin6_addr, buf, sizeof(buf));
    port = ntohs(in6.sin6_port);
  }
  ip = buf;
}

bool is_loopback(const std::string& ip) {
  return ip.rfind("127.", 0) == 0 || ip == "::1" || ip.rfind("::ffff:127.", 0) == 0;
}

// One client connection, served by one worker thread from accept to close. The handlers reach it
// through t_connection (they run on that thread) to ask for the connection to be closed after
// their response and to poll whether the client is still there.
struct Connection {
  int fd = -1;
  std::string remote_ip, local_ip;
  int remote_port = -1, local_port = -1;
  // The current request: its head (request line and headers) must arrive by head_deadline, its
  // body by body_deadline; both counted from its first byte.
  Clock::time_point head_deadline, body_deadline;
  const std::atomic<bool>* stopped = nullptr;  // the server is stopping: reads give up
  bool head_done = false;                      // httplib parsed the head (its setup hook ran)
  bool timed_out = false;                      // a read of this request passed its deadline
  bool close_after = false;  // a handler answered without reading the whole body: close
};
thread_local Connection* t_connection = nullptr;

// httplib's Stream over a Connection, one for the connection's whole life (httplib makes one per
// request and drops what it had read past that request, so pipelined requests went unanswered).
// Reads are buffered and bound by the request's deadlines, not only per read: a client sending a
// byte a second cannot hold a worker past them.
class ConnectionStream final : public httplib::Stream {
 public:
  ConnectionStream(Connection& c, std::chrono::milliseconds write_timeout)
      : c_(c), write_timeout_(write_timeout) {}

  bool buffered() const { return pos_ < end_; }

  bool is_readable() const override {
    if (buffered()) return true;
    const Clock::time_point until = c_.head_done ? c_.body_deadline : c_.head_deadline;
    if (wait_for(c_.fd, POLLIN, until, c_.stopped)) return true;
    c_.timed_out = true;
    return false;
  }
  bool is_writable() const override {
    return wait_for(c_.fd, POLLOUT, Clock::now() + write_timeout_) && socket_alive(c_.fd);
  }
  ssize_t read(char* ptr, size_t size) override {
    if (!buffered()) {
      if (!is_readable()) return -1;
      ssize_t n;
      do n = ::recv(c_.fd, buf_, sizeof(buf_), 0);
      while (n < 0 && errno == EINTR);
      if (n <= 0) return n;
      pos_ = 0;
      end_ = static_cast<size_t>(n);
    }
    const size_t n = std::min(size, end_ - pos_);
    std::memcpy(ptr, buf_ + pos_, n);
    pos_ += n;
    return static_cast<ssize_t>(n);
  }
  ssize_t write(const char* ptr, size_t size) override {
    if (!wait_for(c_.fd, POLLOUT, Clock::now() + write_timeout_)) return -1;
    ssize_t n;
    do n = ::send(c_.fd, ptr, size, MSG_NOSIGNAL);
    while (n < 0 && errno == EINTR);
    return n;
  }
  void get_remote_ip_and_port(std::string& ip, int& port) const override {
    ip = c_.remote_ip;
    port = c_.remote_port;
  }
  void get_local_ip_and_port(std::string& ip, int& port) const override {
    ip = c_.local_ip;
    port = c_.local_port;
  }
  socket_t socket() const override { return c_.fd; }

 private:
  Connection& c_;
  std::chrono::milliseconds write_timeout_;
  char buf_[16 << 10];
  size_t pos_ = 0, end_ = 0;
};

// Closes after an answer sent while the client may still be sending (a refused body): closing a
// socket with unread bytes resets the connection, and the client may lose the answer. So stop
// sending and drain what comes while it keeps coming (a gap of 100 ms ends it), for a second and
// 1 MiB at most, then close.
void close_lingering(int fd) {
  ::shutdown(fd, SHUT_WR);
  const Clock::time_point until = Clock::now() + std::chrono::seconds(1);
  char sink[16 << 10];
  for (size_t drained = 0;
       drained < (size_t{1} << 20) &&
       wait_for(fd, POLLIN, std::min(until, Clock::now() + std::chrono::milliseconds(100)));) {
    const ssize_t n = ::recv(fd, sink, sizeof(sink), 0);
    if (n <= 0) break;
    drained += static_cast<size_t>(n);
  }
  ::close(fd);
}

// httplib's server with the connection loop replaced (process_and_close_socket is httplib's
// per-connection hook; its request parsing and routing, process_request, stay httplib's): the
// loop adds request deadlines, a cap on connections per client address, pipelining and closing
// after a refused or malformed request.
class Transport final : public httplib::Server {
 public:
  explicit Transport(const HttpServerOptions& o) : o_(o) { keep_alive_max_count_ = 100; }
  // Before httplib's stop(): connections waiting for a request's bytes give up at once.
  void begin_stop() { stopping_ = true; }

 private:
  bool process_and_close_socket(socket_t sock) override {
    Connection c;
    c.fd = sock;
    c.stopped = &stopping_;
    sockaddr_storage a{};
    socklen_t len = sizeof(a);
    if (getpeername(sock, reinterpret_cast<sockaddr*>(&a), &len) == 0) {
      address_of(a, c.remote_ip, c.remote_port);
    }
    len = sizeof(a);
    if (getsockname(sock, reinterpret_cast<sockaddr*>(&a), &len) == 0) {
      address_of(a, c.local_ip, c.local_port);
    }
    const bool capped =
        o_.max_connections_per_client > 0 && (o_.cap_loopback_clients || !is_loopback(c.remote_ip));
    if (capped && !admit(c.remote_ip)) {
      refuse_over_cap(sock);
      return false;
    }
    const bool ret = serve(c);
    if (capped) release(c.remote_ip);
    if (c.close_after) {
      close_lingering(sock);
    } else {
      ::shutdown(sock, SHUT_RDWR);
      ::close(sock);
    }
    return ret;
  }

  bool serve(Connection& c) {
    t_connection = &c;
    ConnectionStream strm(c, std::chrono::seconds(write_timeout_sec_));
    const auto head_timeout =
        std::chrono::milliseconds(static_cast<int64_t>(o_.head_timeout_s * 1000));
    const auto request_timeout =
        std::chrono::milliseconds(static_cast<int64_t>(o_.request_timeout_s * 1000));
    bool ret = false;
    for (size_t served = 0; served < keep_alive_max_count_; ++served) {
      // Idle between requests: up to the keep-alive timeout, watching for the server to stop.
      if (!strm.buffered() && !wait_idle(c.fd)) break;
      if (svr_sock_ == INVALID_SOCKET) break;
      const Clock::time_point start = Clock::now();
      c.head_deadline = start + std::min(head_timeout, request_timeout);
      c.body_deadline = start + request_timeout;
      c.head_done = c.timed_out = c.close_after = false;
      bool connection_closed = false;
      const bool last = served + 1 == keep_alive_max_count_;
      ret = process_request(strm, last, connection_closed, [&c](httplib::Request& req) {
        c.head_done = true;
        // httplib 0.11 reads a request body with neither length nor chunking until the client
        // closes; such a request has no body (RFC 9112 6.3), as `curl -X POST URL` sends it.
        if (!req.has_header("Content-Length") && !req.has_header("Transfer-Encoding")) {
          req.set_header("Content-Length", "0");
        }
      });
      // A head httplib refused (400, 414) or one that never came whole: what follows on the
      // connection cannot be trusted to start a request, so close rather than wait for more.
      if (!c.head_done || c.timed_out) c.close_after = true;
      if (!ret || connection_closed || c.close_after) break;
    }
    t_connection = nullptr;
    return ret;
  }

  // Waits for a request's first byte for up to the keep-alive timeout; false when none came or
  // the server is stopping (checked every 100 ms, so stop() does not wait out idle clients).
  bool wait_idle(int fd) const {
    const Clock::time_point until = Clock::now() + std::chrono::seconds(keep_alive_timeout_sec_);
    while (svr_sock_ != INVALID_SOCKET) {
      const Clock::time_point now = Clock::now();
      if (now >= until) return false;
      if (wait_for(fd, POLLIN, std::min(until, now + std::chrono::milliseconds(100)))) return true;
    }
    return false;
  }

  bool admit(const std::string& ip) {
    std::lock_guard<std::mutex> lock(mu_);
    int& n = open_[ip];
    if (n >= o_.max_connections_per_client) return false;
    ++n;
    return true;
  }
  void release(const std::string& ip) {
    std::lock_guard<std::mutex> lock(mu_);
    if (--open_[ip] <= 0) open_.erase(ip);
  }
  void refuse_over_cap(int fd) {
    const std::string body =
        o_.error_body ? o_.error_body(503) : std::string(R"({"error":"too many connections"})");
    const std::string head =
        "HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\n"
        "Retry-After: 1\r\nConnection: close\r\nContent-Length: " +
        std::to_string(body.size()) + "\r\n\r\n";
    const std::string out = head + body;
    if (wait_for(fd, POLLOUT, Clock::now() + std::chrono::seconds(1))) {
      (void)::send(fd, out.data(), out.size(), MSG_NOSIGNAL);
    }
    close_lingering(fd);
  }

  const HttpServerOptions& o_;
  std::atomic<bool> stopping_{false};
  std::mutex mu_;
  std::map<std::string, int> open_;  // connections open per capped client address
};

}  // namespace

struct HttpServer::Impl {
  explicit Impl(HttpServerOptions o) : options(std::move(o)), svr(options) {}
  HttpServerOptions options;
  Transport svr;
  std::thread listener;
  std::atomic<bool> running{false};
  std::atomic<int> listen_fd{-1};
  std::set<std::pair<std::string, std::string>> routes;  // (method, path), fixed after start()
};

HttpServer::HttpServer(HttpServerOptions options)
    : impl_(std::make_unique<Impl>(std::move(options))) {
  auto& svr = impl_->svr;
  const int threads = std::max(1, impl_->options.threads);
  svr.new_task_queue = [threads] { return new httplib::ThreadPool(static_cast<size_t>(threads)); };
  svr.set_payload_max_length(impl_->options.max_body_bytes);
  svr.set_tcp_nodelay(true);
  // Remember the listening socket: start() widens its accept backlog.
  svr.set_socket_options([impl = impl_.get()](socket_t sock) {
    httplib::default_socket_options(sock);
    impl->listen_fd = sock;
  });
  auto error_body = impl_->options.error_body;
  // Called for every response with status >= 400: fill only bodies nobody wrote (404, 413...).
  httplib::Server::HandlerWithResponse on_error = [error_body](const httplib::Request&,
                                                               httplib::Response& res) {
    // A head or body that did not arrive within its deadline is a 408, not a malformed request.
    if (res.status == 400 && t_connection && t_connection->timed_out) res.status = 408;
    if (!res.body.empty() || res.is_chunked_content_provider_) {
      return httplib::Server::HandlerResponse::Unhandled;  // a handler's own answer
    }
    // httplib's own refusal of a request's framing: the rest of the connection cannot be trusted.
    if ((res.status == 400 || res.status == 408 || res.status == 413) && t_connection) {
      t_connection->close_after = true;
    }
    if (!error_body) return httplib::Server::HandlerResponse::Unhandled;
    res.set_content(error_body(res.status), "application/json");
    return httplib::Server::HandlerResponse::Handled;
  };
  svr.set_error_handler(on_error);
  // A request no route takes is refused before httplib reads its body (it would read a chunked
  // one whole, with no limit): 404, and the connection closed when a body was coming.
  svr.set_pre_routing_handler(
      [impl = impl_.get()](const httplib::Request& req, httplib::Response& res) {
        const std::string method = req.method == "HEAD" ? "GET" : req.method;
        if (impl->routes.count({method, req.path}))
          return httplib::Server::HandlerResponse::Unhandled;
        // A route of another method: 405 naming the ones it takes (as vLLM answers), else 404.
        std::string allowed;
        for (const auto& [m, p] : impl->routes) {
          if (p == req.path)
            allowed += (allowed.empty() ? "" : ", ") + m + (m == "GET" ? ", HEAD" : "");
        }
        res.status = allowed.empty() ? 404 : 405;
        if (!allowed.empty()) res.set_header("Allow", allowed);
        const bool body =
            (req.has_header("Content-Length") && req.get_header_value("Content-Length") != "0") ||
            req.has_header("Transfer-Encoding");
        if (body && t_connection) t_connection->close_after = true;
        return httplib::Server::HandlerResponse::Handled;
      });
  // Backstop only: the API handlers catch everything themselves.
  svr.set_exception_handler(
      [error_body](const httplib::Request&, httplib::Response& res, std::exception_ptr) {
        res.status = 500;
        res.set_content(error_body ? error_body(500) : std::string("{}"), "application/json");
      });
}

HttpServer::~HttpServer() { stop(); }

namespace {

// Bodies from this size up are followed by a malloc_trim (see route()).
constexpr size_t kTrimAfterBodyBytes = size_t{1} << 20;

// Answers without reading (the rest of) the body: the connection is closed after the answer
// (Transport drains what the client still sends, so the answer is not lost to a reset).
void close_after_answer(httplib::Response& res) {
  res.set_header("Connection", "close");
  if (t_connection) t_connection->close_after = true;
}

// A gate's answer, sent without reading the body.
void send_gated(httplib::Response& res, const HttpResponse& out) {
  res.status = out.status;
  for (const auto& [k, v] : out.headers) res.set_header(k, v);
  close_after_answer(res);
  res.set_content(out.body, out.content_type);
}

HttpRequest head_of(const httplib::Request& req) {
  HttpRequest r;
  r.method = req.method;
  r.path = req.path;
  for (const auto& [k, v] : req.headers) r.headers.emplace(lower(k), v);
  return r;
}

}  // namespace

void HttpServer::route(const std::string& method, const std::string& path, HttpHandler handler,
                       HttpGate gate) {
  impl_->routes.emplace(method, path);
  // `body` is null for GET: then req.body is used.
  auto serve = [handler = std::move(handler)](const httplib::Request& req, httplib::Response& res,
                                              std::string* body) {
    HttpRequest r = head_of(req);
    r.body = body ? std::move(*body) : req.body;
    // The handler runs on the connection's worker thread, which keeps the socket open until
    // the handler has returned.
    const int fd = t_connection ? t_connection->fd : -1;
    r.is_connection_alive = [fd]() { return fd < 0 || socket_alive(fd); };
    HttpResponse out = handler(r);
    res.status = out.status;
    for (const auto& [k, v] : out.headers) res.set_header(k, v);
    if (!out.stream) {
      res.set_content(out.body, out.content_type);
      return;
    }
    auto stream = std::make_shared<std::function<bool(ChunkSink&)>>(std::move(out.stream));
    auto on_close = std::make_shared<std::function<void()>>(std::move(out.on_close));
    res.set_chunked_content_provider(
        out.content_type,
        [stream](size_t, httplib::DataSink& sink) {
          ChunkSink s;
          s.write = [&sink](const std::string& data) {
            return sink.is_writable() && sink.write(data.data(), data.size());
          };
          s.is_alive = [&sink]() { return sink.is_writable(); };
          const bool complete = (*stream)(s);
          if (complete) sink.done();
          return complete;
        },
        [on_close](bool) {
          if (*on_close) (*on_close)();
        });
  };
  if (method == "GET") {
    impl_->svr.Get(path, [serve, gate](const httplib::Request& req, httplib::Response& res) {
      if (gate) {
        if (auto out = gate(head_of(req))) return send_gated(res, *out);
      }
      serve(req, res, nullptr);
    });
  } else if (method == "POST") {
    // Read the body ourselves: httplib caps bodies it reads as form data (curl's default
    // Content-Type) at 8 KiB; this way only max_body_bytes applies, whatever the Content-Type,
    // counted here because httplib 0.11 checks it only against a Content-Length.
    const size_t max_body = impl_->options.max_body_bytes;
    impl_->svr.Post(
        path, [serve, gate, max_body](const httplib::Request& req, httplib::Response& res,
                                      const httplib::ContentReader& reader) {
          if (gate) {
            if (auto out = gate(head_of(req))) return send_gated(res, *out);
          }
          std::string body;
          // A Content-Length within the limit is trusted for one allocation (no doubling copies).
          if (req.has_header("Content-Length")) {
            const uint64_t announced = req.get_header_value<uint64_t>("Content-Length");
            if (announced <= max_body) body.reserve(static_cast<size_t>(announced));
          }
          bool too_large = false;
          const bool ok = reader([&body, &too_large, max_body](const char* data, size_t size) {
            if (size > max_body - body.size()) {
              too_large = true;
              return false;
            }
            body.append(data, size);
            return true;
          });
          if (!ok || too_large) {  // 413, 408 or 400; the error handler writes the body
            if (too_large) {
              res.status = 413;
            } else if (t_connection && t_connection->timed_out) {
              res.status = 408;  // the body did not arrive within the request's deadline
            }
            if (res.status < 400) res.status = 400;
            close_after_answer(res);  // the rest of the body is never read
            const bool large = body.capacity() >= kTrimAfterBodyBytes;
            std::string().swap(body);
            if (large) malloc_trim(0);
            return;
          }
          const bool large = body.size() >= kTrimAfterBodyBytes;
          serve(req, res, &body);
          // The request's body and what was parsed from it are freed by now, but glibc keeps freed
          // memory in the worker thread's arena (one per thread, up to 8 per core), where
          // hundreds of MiB of large prompts stayed resident; hand it back to the system.
          if (large) malloc_trim(0);
        });
  } else {
    throw std::invalid_argument("HttpServer::route: unsupported method " + method);
  }
}

int HttpServer::start(const std::string& host, int port) {
  // A client that disconnects makes the next write raise SIGPIPE, which would kill the process.
  std::signal(SIGPIPE, SIG_IGN);
  auto& svr = impl_->svr;
  int bound = port;
  if (port == 0) {
    bound = svr.bind_to_any_port(host);
    if (bound < 0) throw std::runtime_error("cannot bind an HTTP port on " + host);
  } else if (!svr.bind_to_port(host, port)) {
    throw std::runtime_error("cannot bind " + host + ":" + std::to_string(port) +
                             " (in use, or not a local address)");
  }
  port_ = bound;
  // httplib listens with a backlog of 5: bursts of new connections (64 clients without
  // keep-alive) overflow it and the kernel drops them, which clients see as reset connections.
  // listen() again on the bound socket only raises the backlog.
  if (impl_->listen_fd >= 0) ::listen(impl_->listen_fd, SOMAXCONN);
  impl_->running = true;
  impl_->listener = std::thread([this] { impl_->svr.listen_after_bind(); });
  // httplib's stop() is a no-op until the listen loop runs: wait for it so stop() always works.
  while (!svr.is_running()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  return bound;
}

void HttpServer::stop() {
  if (!impl_) return;
  if (impl_->running.exchange(false)) {
    impl_->svr.begin_stop();
    impl_->svr.stop();
  }
  if (impl_->listener.joinable()) impl_->listener.join();
}

bool HttpServer::running() const { return impl_->running; }

}  // namespace crl::server
