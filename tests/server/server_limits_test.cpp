// The HTTP transport's limits against hostile clients (issue 49), over raw sockets: a chunked body
// is counted against --max-body-bytes as it arrives (httplib checks only a Content-Length), and a
// keyed server answers 401 on the headers without reading the body.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
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

}  // namespace
}  // namespace crl::test
