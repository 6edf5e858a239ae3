// The HTTP server against hostile clients (issue 49), over raw sockets: a chunked body is counted
// against --max-body-bytes as it arrives (httplib checks only a Content-Length), a keyed server
// answers 401 on the headers without reading the body, and the smaller items.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <spdlog/sinks/ostream_sink.h>
#include <spdlog/spdlog.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <memory>
#include <sstream>
#include <string>

#include "tests/engine/test_model.h"
#include "tests/server/server_test_util.h"

namespace crl::test {
namespace {

// Connects to 127.0.0.1:port, sends `head` then up to `body_bytes` more bytes of `fill` (as far
// as the server takes them within a second), and returns the server's response (what came before
// it closed or `wait_s` seconds passed without a byte, if that was less).
std::string exchange(int port, const std::string& head, size_t body_bytes, const std::string& fill,
                     double wait_s) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    ::close(fd);
    return "connect failed";
  }
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

}  // namespace
}  // namespace crl::test
