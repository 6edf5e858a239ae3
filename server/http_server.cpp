// The only file that includes httplib.h (with the defines Debian's libcpp-httplib was built with,
// see server/CMakeLists.txt: the struct layouts depend on them).
#include "server/http_server.h"

#include <arpa/inet.h>
#include <dirent.h>
#include <httplib.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstdlib>
#include <stdexcept>
#include <thread>

namespace crl::server {

namespace {

std::string lower(std::string s) {
  for (auto& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

int port_of(const sockaddr_storage& a) {
  if (a.ss_family == AF_INET) return ntohs(reinterpret_cast<const sockaddr_in&>(a).sin_port);
  if (a.ss_family == AF_INET6) return ntohs(reinterpret_cast<const sockaddr_in6&>(a).sin6_port);
  return -1;
}

// httplib 0.11 does not hand the connection's socket to handlers. A TCP connection is named by
// its (local port, remote address, remote port), which the request carries, so the socket is
// the open fd with those ends. The fd stays ours while the handler runs (httplib closes it only
// after the handler returned), so the lookup is safe; it is done once per request.
int find_connection_fd(int local_port, const std::string& remote_addr, int remote_port) {
  DIR* dir = opendir("/proc/self/fd");
  if (!dir) return -1;
  int found = -1;
  while (dirent* e = readdir(dir)) {
    char* end = nullptr;
    long fd = std::strtol(e->d_name, &end, 10);
    if (end == e->d_name || *end != '\0') continue;
    struct stat st;
    if (fstat(static_cast<int>(fd), &st) != 0 || !S_ISSOCK(st.st_mode)) continue;
    sockaddr_storage local{}, peer{};
    socklen_t ll = sizeof(local), pl = sizeof(peer);
    if (getsockname(static_cast<int>(fd), reinterpret_cast<sockaddr*>(&local), &ll) != 0) continue;
    if (getpeername(static_cast<int>(fd), reinterpret_cast<sockaddr*>(&peer), &pl) != 0) continue;
    if (port_of(local) != local_port || port_of(peer) != remote_port) continue;
    char buf[INET6_ADDRSTRLEN] = {0};
    if (peer.ss_family == AF_INET) {
      inet_ntop(AF_INET, &reinterpret_cast<sockaddr_in&>(peer).sin_addr, buf, sizeof(buf));
    } else {
      inet_ntop(AF_INET6, &reinterpret_cast<sockaddr_in6&>(peer).sin6_addr, buf, sizeof(buf));
    }
    if (remote_addr != buf) continue;
    found = static_cast<int>(fd);
    break;
  }
  closedir(dir);
  return found;
}

// True while the peer has not closed: a non-blocking peek reads 0 bytes only after its FIN.
bool socket_alive(int fd) {
  char c;
  const ssize_t n = recv(fd, &c, 1, MSG_PEEK | MSG_DONTWAIT);
  if (n > 0) return true;
  if (n == 0) return false;
  return errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR;
}

}  // namespace

struct HttpServer::Impl {
  HttpServerOptions options;
  httplib::Server svr;
  std::thread listener;
  std::atomic<bool> running{false};
  std::atomic<int> listen_fd{-1};
};

HttpServer::HttpServer(HttpServerOptions options) : impl_(std::make_unique<Impl>()) {
  impl_->options = std::move(options);
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
    if (!res.body.empty() || res.is_chunked_content_provider_ || !error_body) {
      return httplib::Server::HandlerResponse::Unhandled;
    }
    res.set_content(error_body(res.status), "application/json");
    return httplib::Server::HandlerResponse::Handled;
  };
  svr.set_error_handler(on_error);
  // Backstop only: the API handlers catch everything themselves.
  svr.set_exception_handler(
      [error_body](const httplib::Request&, httplib::Response& res, std::exception_ptr) {
        res.status = 500;
        res.set_content(error_body ? error_body(500) : std::string("{}"), "application/json");
      });
}

HttpServer::~HttpServer() { stop(); }

namespace {

// A gate's answer, sent without reading the body. The unread bytes are never buffered: httplib
// takes what follows as the next request line, refuses it (at most its 8 KiB line limit read) and
// closes. (Closing the socket here would reset the connection and lose the answer.)
void send_gated(httplib::Response& res, const HttpResponse& out) {
  res.status = out.status;
  for (const auto& [k, v] : out.headers) res.set_header(k, v);
  res.set_header("Connection", "close");
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
  // `body` is null for GET: then req.body is used.
  auto serve = [handler = std::move(handler)](const httplib::Request& req, httplib::Response& res,
                                              std::string* body) {
    HttpRequest r = head_of(req);
    r.body = body ? std::move(*body) : req.body;
    auto fd = std::make_shared<int>(-2);  // -2: not looked up yet
    const int local_port = req.local_port;
    const std::string remote_addr = req.remote_addr;
    const int remote_port = req.remote_port;
    r.is_connection_alive = [fd, local_port, remote_addr, remote_port]() {
      if (*fd == -2) *fd = find_connection_fd(local_port, remote_addr, remote_port);
      return *fd < 0 || socket_alive(*fd);  // unknown socket: assume alive
    };
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
          bool too_large = false;
          const bool ok = reader([&body, &too_large, max_body](const char* data, size_t size) {
            if (size > max_body - body.size()) {
              too_large = true;
              return false;
            }
            body.append(data, size);
            return true;
          });
          if (!ok || too_large) {  // 413 (too large) or 400; the error handler writes the body
            if (too_large) res.status = 413;
            if (res.status < 400) res.status = 400;
            res.set_header("Connection", "close");  // the rest of the body is never read
            return;
          }
          serve(req, res, &body);
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
  if (impl_->running.exchange(false)) impl_->svr.stop();
  if (impl_->listener.joinable()) impl_->listener.join();
}

bool HttpServer::running() const { return impl_->running; }

}  // namespace crl::server
