// The HTTP server against hostile clients (issue 49), over raw sockets: a chunked body is counted
// against --max-body-bytes as it arrives (httplib checks only a Content-Length), a keyed server
// answers 401 on the headers without reading the body, requests that trickle in meet a deadline,
// one address cannot hold every connection, pipelined requests are answered, and the smaller
// items.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <spdlog/sinks/ostream_sink.h>
#include <spdlog/spdlog.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <memory>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "tests/engine/test_model.h"
#include "tests/server/server_test_util.h"

namespace crl::test {
namespace {

int connect_loopback(int port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    ::close(fd);
    return -1;
  }
  return fd;
}

// Connects to 127.0.0.1:port, sends `head` then up to `body_bytes` more bytes of `fill` (as far
// as the server takes them within a second), and returns the server's response (what came before
// it closed or `wait_s` seconds passed without a byte, if that was less).
std::string exchange(int port, const std::string& head, size_t body_bytes, const std::string& fill,
                     double wait_s) {
  const int fd = connect_loopback(port);
  if (fd < 0) return "connect failed";
  timeval snd{1, 0};
  ::setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &snd, sizeof(snd));
  (void)::send(fd, head.data(), head.size(), MSG_NOSIGNAL);
  for (size_t sent = 0; sent < body_bytes;) {
    const ssize_t n =
        ::send(fd, fill.data(), std::min(fill.size(), body_bytes - sent), MSG_NOSIGNAL);
    if (n <= 0) break;  // the server stopped reading (or closed): what it answered is below
    sent += static_cast<size_t>(n);
  }
  timeval rcv{static_cast<time_t>(wait_s), 0};
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &rcv, sizeof(rcv));
  std::string out;
  char buf[4096];
  for (;;) {  // one response: its headers and Content-Length bytes
    const size_t end = out.find("\r\n\r\n");
    if (end != std::string::npos) {
      const size_t cl = out.find("Content-Length: ");
      if (cl != std::string::npos && cl < end &&
          out.size() >= end + 4 + std::stoul(out.substr(cl + 16))) {
        break;
      }
    }
    const ssize_t n = ::recv(fd, buf, sizeof(buf), 0);
    if (n <= 0) break;
    out.append(buf, static_cast<size_t>(n));
  }
  ::close(fd);
  return out;
}

void send_all(int fd, const std::string& s) { (void)::send(fd, s.data(), s.size(), MSG_NOSIGNAL); }

// Reads until the server closes the connection or `wait_s` passes; `closed` says which.
std::string read_until_closed(int fd, double wait_s, bool* closed) {
  const auto until = std::chrono::steady_clock::now() + std::chrono::duration<double>(wait_s);
  timeval rcv{0, 100000};
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &rcv, sizeof(rcv));
  std::string out;
  char buf[4096];
  *closed = false;
  while (std::chrono::steady_clock::now() < until) {
    const ssize_t n = ::recv(fd, buf, sizeof(buf), 0);
    if (n > 0) {
      out.append(buf, static_cast<size_t>(n));
    } else if (n == 0 || (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)) {
      *closed = true;
      break;
    }
  }
  return out;
}

double seconds_since(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
}

size_t count_of(const std::string& s, const std::string& what) {
  size_t n = 0;
  for (size_t at = s.find(what); at != std::string::npos; at = s.find(what, at + 1)) ++n;
  return n;
}

TEST(ServerLimitsTest, AChunkedBodyPastTheLimitIs413) {
  server::ServerOptions o;
  o.max_body_bytes = 64 << 10;
  ServedModel served(test_engine_config("llama"), o);
  // 16 chunks of 16 KiB: 256 KiB against a 64 KiB limit, no Content-Length.
  std::string chunked;
  const std::string piece(16 << 10, ' ');
  char size_line[32];
  std::snprintf(size_line, sizeof(size_line), "%zx\r\n", piece.size());
  for (int i = 0; i < 16; ++i) chunked += size_line + piece + "\r\n";
  chunked += "0\r\n\r\n";
  const std::string head =
      "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
      "Transfer-Encoding: chunked\r\n\r\n";
  const std::string reply = exchange(served.port, head + chunked, 0, "", 5);
  EXPECT_EQ(reply.rfind("HTTP/1.1 413", 0), 0u) << reply.substr(0, 300);
  // A chunked body within the limit is read whole and answered.
  const std::string body = R"({"prompt": "hi", "max_tokens": 2})";
  char small[32];
  std::snprintf(small, sizeof(small), "%zx\r\n", body.size());
  const std::string ok = exchange(served.port, head + small + body + "\r\n0\r\n\r\n", 0, "", 10);
  EXPECT_EQ(ok.rfind("HTTP/1.1 200", 0), 0u) << ok.substr(0, 300);
}

TEST(ServerLimitsTest, AKeyedServerAnswers401BeforeReadingTheBody) {
  server::ServerOptions o;
  o.api_key = "sk-limits";
  ServedModel served(test_engine_config("llama"), o);
  // Headers that announce 50 MB, and only 10 bytes of it: a server that read the body first would
  // wait for the rest (its 5 s read timeout); the key check answers at once.
  const std::string head =
      "POST /v1/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer wrong\r\n"
      "Content-Type: application/json\r\nContent-Length: 50000000\r\n\r\n0123456789";
  // (Within the 3 s this client waits: a reply after the body's timeout would come too late.)
  const std::string reply = exchange(served.port, head, 0, "", 3);
  EXPECT_EQ(reply.rfind("HTTP/1.1 401", 0), 0u) << reply.substr(0, 300);
  EXPECT_NE(reply.find("invalid_api_key"), std::string::npos) << reply.substr(0, 300);
  // The right key still works.
  const std::string body = R"({"prompt": "hi", "max_tokens": 2})";
  const std::string good =
      "POST /v1/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer "
      "sk-limits\r\nContent-Type: application/json\r\nContent-Length: " +
      std::to_string(body.size()) + "\r\nConnection: close\r\n\r\n" + body;
  const std::string ok = exchange(served.port, good, 0, "", 10);
  EXPECT_EQ(ok.rfind("HTTP/1.1 200", 0), 0u) << ok.substr(0, 300);
}

// A prompt far past the context is refused before it is encoded whole (issue 49: a 7.9 MB prompt
// took 1.8 GB and 5.9 s to be refused): a completion and a chat of 4 MB against the test model's
// 512-token context are 400s naming the context length.
TEST(ServerLimitsTest, APromptFarPastTheContextIsRefusedBeforeItIsEncoded) {
  server::ServerOptions o;
  o.max_body_bytes = 16 << 20;
  ServedModel served(test_engine_config("llama"), o);
  std::string words;
  while (words.size() < (4u << 20)) words += "copy the red box and the big dog ";
  auto [ps, pb] = served.post("/v1/completions", {{"prompt", words}, {"max_tokens", 2}});
  EXPECT_EQ(ps, 400) << pb.substr(0, 300);
  EXPECT_NE(pb.find("exceeds the context length 512 tokens"), std::string::npos)
      << pb.substr(0, 300);
  auto [cs, cb] =
      served.post("/v1/chat/completions", {{"messages", {{{"role", "user"}, {"content", words}}}}});
  EXPECT_EQ(cs, 400) << cb.substr(0, 300);
  EXPECT_NE(cb.find("exceeds the context length 512 tokens"), std::string::npos)
      << cb.substr(0, 300);
}

// Smaller items of issue 49, one request each on one served model: a NUL no longer ends a body
// (nlohmann's parser stopped there and took what came before), the auth scheme is
// case-insensitive, max_completion_tokens is checked beside max_tokens (and wins, as in vLLM), a
// session id may not hold control characters (it is echoed in X-Session-Id), and unknown field
// names reach the log as JSON strings (a newline in one forged a log line).
TEST(ServerLimitsTest, SmallerHostileInputsAreRefusedOrEscaped) {
  server::ServerOptions o;
  o.api_key = "sk-small";
  ServedModel served(test_engine_config("llama"), o);
  auto post = [&](const std::string& path, const std::string& body,
                  const std::string& auth = "Bearer sk-small") {
    const std::string req =
        "POST " + path + " HTTP/1.1\r\nHost: x\r\nAuthorization: " + auth +
        "\r\nContent-Type: application/json\r\nContent-Length: " + std::to_string(body.size()) +
        "\r\nConnection: close\r\n\r\n" + body;
    return exchange(served.port, req, 0, "", 10);
  };
  const std::string nul =
      post("/v1/completions", std::string(R"({"prompt": "hi", "max_tokens": 2})") + '\0' + "junk");
  EXPECT_EQ(nul.rfind("HTTP/1.1 400", 0), 0u) << nul.substr(0, 300);
  EXPECT_NE(nul.find("invalid_json"), std::string::npos) << nul;
  const std::string lower =
      post("/v1/completions", R"({"prompt": "hi", "max_tokens": 2})", "bearer sk-small");
  EXPECT_EQ(lower.rfind("HTTP/1.1 200", 0), 0u) << lower.substr(0, 300);
  const std::string chat_mct = post(
      "/v1/chat/completions", R"({"messages": [{"role": "user", "content": "x"}], "max_tokens": 2,)"
                              R"( "max_completion_tokens": -3})");
  EXPECT_EQ(chat_mct.rfind("HTTP/1.1 400", 0), 0u) << chat_mct.substr(0, 300);
  EXPECT_NE(chat_mct.find("max_completion_tokens"), std::string::npos) << chat_mct;
  const std::string control = post(
      "/v1/chat/completions", R"({"messages": [{"role": "user", "content": "x"}], "max_tokens": 2,)"
                              R"( "session_id": "a\u0001b"})");
  EXPECT_EQ(control.rfind("HTTP/1.1 400", 0), 0u) << control.substr(0, 300);
  EXPECT_NE(control.find("control character"), std::string::npos) << control;

  std::ostringstream log;
  const auto before = spdlog::default_logger();
  spdlog::set_default_logger(std::make_shared<spdlog::logger>(
      "capture", std::make_shared<spdlog::sinks::ostream_sink_mt>(log)));
  const std::string forged =
      post("/v1/completions", R"({"prompt": "hi", "max_tokens": 1, "x\n[error] forged": 1})");
  spdlog::set_default_logger(before);
  EXPECT_EQ(forged.rfind("HTTP/1.1 200", 0), 0u) << forged.substr(0, 300);
  EXPECT_NE(log.str().find(R"("x\n[error] forged")"), std::string::npos) << log.str();
  EXPECT_EQ(log.str().find("\n[error] forged"), std::string::npos) << log.str();
}

// A client that sends its headers or its body a byte at a time meets the request's deadline: 408
// and a closed connection (issue 49: one byte every 2 s held a worker for ever, and four such
// sockets against four worker threads kept /health waiting). Here four of them against four
// threads: /health is answered once their 2 s deadline has passed.
TEST(ServerLimitsTest, RequestsThatTrickleInMeetTheirDeadline) {
  server::ServerOptions o;
  o.http_threads = 4;
  o.request_timeout_s = 2;
  ServedModel served(test_engine_config("llama"), o);
  const auto t0 = std::chrono::steady_clock::now();
  std::vector<int> slow;
  for (int i = 0; i < 4; ++i) {
    const int fd = connect_loopback(served.port);
    ASSERT_GE(fd, 0);
    // Two trickle their headers, two a body their headers announced.
    send_all(fd,
             i < 2 ? std::string("GET /health HTTP/1.1\r\nHost: x\r\n")
                   : std::string("POST /v1/completions HTTP/1.1\r\nHost: x\r\n"
                                 "Content-Type: application/json\r\nContent-Length: 100\r\n\r\n"));
    slow.push_back(fd);
  }
  std::atomic<bool> done{false};
  std::thread trickle([&] {
    while (!done) {
      for (int fd : slow) send_all(fd, "x");
      std::this_thread::sleep_for(std::chrono::milliseconds(200));
    }
  });
  auto client = served.client(10000);
  auto health = client->Get("/health");
  const double health_s = seconds_since(t0);
  std::vector<std::string> replies;
  for (int fd : slow) {
    bool closed = false;
    replies.push_back(read_until_closed(fd, 3, &closed));
    EXPECT_TRUE(closed) << "a trickling client was not disconnected";
  }
  done = true;
  trickle.join();
  for (int fd : slow) ::close(fd);
  ASSERT_TRUE(health);
  EXPECT_EQ(health->status, 200);
  EXPECT_LT(health_s, 8.0) << "/health waited behind the trickling clients";
  for (const auto& r : replies) {
    EXPECT_EQ(r.rfind("HTTP/1.1 408", 0), 0u) << r.substr(0, 300);
    EXPECT_NE(r.find("timeout"), std::string::npos) << r;
  }
}

// One address may hold max_connections_per_client connections; the next is answered 503 at once,
// and once one closes a new one is served. (Loopback is capped here only because the test asks.)
TEST(ServerLimitsTest, OneAddressCannotHoldEveryConnection) {
  server::ServerOptions o;
  o.max_connections_per_client = 2;
  o.cap_loopback_clients = true;
  ServedModel served(test_engine_config("llama"), o);
  // Two kept-alive connections, each answered once (so both hold a worker and count).
  const int a = connect_loopback(served.port), b = connect_loopback(served.port);
  ASSERT_GE(a, 0);
  ASSERT_GE(b, 0);
  for (int fd : {a, b}) {
    send_all(fd, "GET /health HTTP/1.1\r\nHost: x\r\n\r\n");
    bool closed = false;
    std::string got;
    const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while (got.find("\r\n\r\n") == std::string::npos && !closed &&
           std::chrono::steady_clock::now() < until) {
      got += read_until_closed(fd, 0.2, &closed);
    }
    ASSERT_EQ(got.rfind("HTTP/1.1 200", 0), 0u) << got.substr(0, 200);
  }
  const int c = connect_loopback(served.port);
  ASSERT_GE(c, 0);
  const auto t0 = std::chrono::steady_clock::now();
  bool closed = false;
  const std::string refused = read_until_closed(c, 3, &closed);
  EXPECT_TRUE(closed);
  EXPECT_LT(seconds_since(t0), 2.0);
  EXPECT_EQ(refused.rfind("HTTP/1.1 503", 0), 0u) << refused.substr(0, 300);
  EXPECT_NE(refused.find("Retry-After: 1"), std::string::npos) << refused;
  ::close(c);
  ::close(a);
  // Once a's worker has seen it close, a new connection is served (tried for up to 10 s).
  std::string ok;
  for (int tries = 0; tries < 50 && ok.rfind("HTTP/1.1 200", 0) != 0; ++tries) {
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    const int d = connect_loopback(served.port);
    ASSERT_GE(d, 0);
    send_all(d, "GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
    ok = read_until_closed(d, 5, &closed);
    ::close(d);
  }
  EXPECT_EQ(ok.rfind("HTTP/1.1 200", 0), 0u) << ok.substr(0, 300);
  ::close(b);
}

// Pipelined requests (sent before the first answer) are all answered, in order (issue 49: those
// after the first got no reply); a malformed request line gets its 400 and the connection closes
// at once instead of after the 5 s keep-alive wait.
TEST(ServerLimitsTest, PipelinedRequestsAreAnsweredAndABadRequestLineClosesAtOnce) {
  ServedModel served(test_engine_config("llama"));
  const int fd = connect_loopback(served.port);
  ASSERT_GE(fd, 0);
  const std::string body = R"({"prompt": "hi", "max_tokens": 2})";
  send_all(fd,
           "GET /health HTTP/1.1\r\nHost: x\r\n\r\n"
           "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
           "Content-Length: " +
               std::to_string(body.size()) + "\r\n\r\n" + body +
               "GET /v1/models HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
  bool closed = false;
  const std::string replies = read_until_closed(fd, 10, &closed);
  ::close(fd);
  EXPECT_TRUE(closed);
  EXPECT_EQ(count_of(replies, "HTTP/1.1 200 OK"), 3u) << replies;
  const size_t completion = replies.find("\"text_completion\"");
  const size_t models = replies.find("\"list\"");
  EXPECT_NE(completion, std::string::npos) << replies;
  EXPECT_NE(models, std::string::npos) << replies;
  EXPECT_LT(completion, models) << "answered out of order";

  const int bad = connect_loopback(served.port);
  ASSERT_GE(bad, 0);
  const auto t0 = std::chrono::steady_clock::now();
  send_all(bad, "NOT A REQUEST\r\n\r\n");
  const std::string refused = read_until_closed(bad, 4, &closed);
  ::close(bad);
  EXPECT_TRUE(closed);
  EXPECT_LT(seconds_since(t0), 1.5);
  EXPECT_EQ(refused.rfind("HTTP/1.1 400", 0), 0u) << refused.substr(0, 300);

  // A POST with neither Content-Length nor chunking has no body (httplib read it until the
  // client closed): answered at once. A chunked body to a path no route takes is refused before
  // it is read (404) and the connection closed.
  const int nolen = connect_loopback(served.port);
  ASSERT_GE(nolen, 0);
  const auto t1 = std::chrono::steady_clock::now();
  send_all(nolen, "POST /v1/completions HTTP/1.1\r\nHost: x\r\n\r\n");
  bool got_reply = false;
  std::string empty;
  while (!got_reply && seconds_since(t1) < 5) {
    empty += read_until_closed(nolen, 0.2, &closed);
    got_reply = empty.find("\r\n\r\n") != std::string::npos || closed;
  }
  ::close(nolen);
  EXPECT_LT(seconds_since(t1), 2.0);
  EXPECT_EQ(empty.rfind("HTTP/1.1 400", 0), 0u) << empty.substr(0, 300);
  const int unrouted = connect_loopback(served.port);
  ASSERT_GE(unrouted, 0);
  send_all(unrouted,
           "POST /nowhere HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
           "10\r\n0123456789abcdef\r\n");
  const std::string nowhere = read_until_closed(unrouted, 4, &closed);
  ::close(unrouted);
  EXPECT_TRUE(closed);
  EXPECT_EQ(nowhere.rfind("HTTP/1.1 404", 0), 0u) << nowhere.substr(0, 300);
}

}  // namespace
}  // namespace crl::test
