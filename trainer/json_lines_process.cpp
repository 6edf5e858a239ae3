#include "trainer/json_lines_process.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spdlog/spdlog.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <stdexcept>

#include "common/json_depth.h"

namespace crl::trainer {
namespace {

using ojson = nlohmann::ordered_json;

constexpr size_t kMaxLineBytes = size_t{64} << 20;  // one reply line

std::string describe_status(int status) {
  if (WIFEXITED(status)) return "exit status " + std::to_string(WEXITSTATUS(status));
  if (WIFSIGNALED(status)) return std::string("signal ") + strsignal(WTERMSIG(status));
  return "status " + std::to_string(status);
}

// The environment a program starts with: the variables a program needs to run and the ones the
// user passes, from this process's own.
std::vector<std::string> clean_environment(const std::vector<std::string>& pass) {
  static const char* kKept[] = {"PATH",       "HOME",        "USER",         "LOGNAME",
                                "SHELL",      "LANG",        "LANGUAGE",     "LC_*",
                                "TZ",         "TMPDIR",      "TERM",         "PYTHONPATH",
                                "PYTHONHOME", "VIRTUAL_ENV", "CONDA_PREFIX", "LD_LIBRARY_PATH"};
  auto matches = [](const std::string& name, const std::string& pattern) {
    if (!pattern.empty() && pattern.back() == '*') {
      return name.compare(0, pattern.size() - 1, pattern, 0, pattern.size() - 1) == 0;
    }
    return name == pattern;
  };
  std::vector<std::string> out;
  for (char** e = environ; e != nullptr && *e != nullptr; ++e) {
    const std::string entry = *e;
    const std::string name = entry.substr(0, entry.find('='));
    bool keep = std::any_of(std::begin(kKept), std::end(kKept),
                            [&](const char* k) { return matches(name, k); });
    keep = keep || std::any_of(pass.begin(), pass.end(),
                               [&](const std::string& p) { return matches(name, p); });
    if (keep) out.push_back(entry);
  }
  return out;
}

}  // namespace

std::string program_output_excerpt(const std::string& s) {
  size_t cut = s.size();
  if (s.size() > 120) {
    cut = 117;
    while (cut > 0 && (static_cast<unsigned char>(s[cut]) & 0xC0) == 0x80) --cut;
  }
  std::string out;
  out.reserve(cut + 8);
  static const char* kHex = "0123456789abcdef";
  for (size_t i = 0; i < cut; ++i) {
    const auto c = static_cast<unsigned char>(s[i]);
    if (c < 0x20 || c == 0x7f) {
      out += "\\x";
      out += kHex[c >> 4];
      out += kHex[c & 15];
    } else {
      out += static_cast<char>(c);
    }
  }
  return cut < s.size() ? out + "..." : out;
}

JsonLinesProcess::JsonLinesProcess(std::string command, std::chrono::milliseconds timeout,
                                   const std::vector<std::string>& pass_env, Names names)
    : command_(std::move(command)),
      timeout_(timeout),
      env_(clean_environment(pass_env)),
      names_(std::move(names)) {
  if (timeout_.count() <= 0) {
    throw std::invalid_argument("the " + names_.noun + " timeout must be > 0");
  }
}

JsonLinesProcess::~JsonLinesProcess() { stop(); }

std::string JsonLinesProcess::error(const char* what, const std::string& text) const {
  return names_.kind + "_" + what + ": " + text;
}

void JsonLinesProcess::start() {
  int sv[2];
  if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) != 0) {
    throw std::runtime_error(names_.noun + ": socketpair: " + std::strerror(errno));
  }
  // The exec's arguments and environment, made before the fork (the child only execs).
  std::vector<char*> envp;
  for (const std::string& e : env_) envp.push_back(const_cast<char*>(e.c_str()));
  envp.push_back(nullptr);
  const char* argv[] = {"sh", "-c", command_.c_str(), nullptr};
  const pid_t parent = ::getpid();
  const pid_t pid = ::fork();
  if (pid < 0) {
    ::close(sv[0]);
    ::close(sv[1]);
    throw std::runtime_error(names_.noun + ": fork: " + std::strerror(errno));
  }
  if (pid == 0) {
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (::getppid() != parent) ::_exit(127);
    ::setpgid(0, 0);  // its own group: stop() ends what the shell started too
    ::dup2(sv[1], 0);
    ::dup2(sv[1], 1);
    ::execve("/bin/sh", const_cast<char* const*>(argv), envp.data());
    ::_exit(127);
  }
  ::setpgid(pid, pid);  // as the child does: whichever runs first
  ::close(sv[1]);
  fd_ = sv[0];
  pid_ = pid;
  buffer_.clear();
  ++starts_;
}

void JsonLinesProcess::finish() {
  if (fd_ >= 0) ::shutdown(fd_, SHUT_WR);
  stop();
}

std::string JsonLinesProcess::stop() {
  std::string how = "not running";
  if (pid_ > 0) {
    int status = 0;
    pid_t got = ::waitpid(pid_, &status, WNOHANG);
    ::kill(-pid_, SIGKILL);  // the shell's group: a command it forked rather than exec'ed too
    if (got == 0) {
      ::kill(pid_, SIGKILL);
      ::waitpid(pid_, &status, 0);
      how = "killed";
    } else if (got == pid_) {
      how = describe_status(status);
    }
  }
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
  pid_ = -1;
  buffer_.clear();
  return how;
}

std::string JsonLinesProcess::exchange(const ojson& request, bool expect_reply,
                                       const std::string& what, ojson* reply, std::string* line) {
  if (pid_ < 0) {
    try {
      start();
    } catch (const std::exception& e) {
      return error("died", e.what());
    }
  }
  drop_stray_output();
  const auto deadline = Clock::now() + timeout_;
  const std::string text =
      request.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) + "\n";
  if (auto err = send_line(text, deadline, what)) return *err;
  if (!expect_reply) return "";
  if (auto err = read_reply_object(deadline, what, line, reply)) return *err;
  return "";
}

std::string JsonLinesProcess::died(const std::string& doing, const std::string& what) {
  // Give a dying process a moment to be reaped, so the error says how it ended.
  for (int i = 0; i < 50; ++i) {
    siginfo_t info{};
    if (::waitid(P_PID, static_cast<id_t>(pid_), &info, WEXITED | WNOHANG | WNOWAIT) != 0 ||
        info.si_pid != 0) {
      break;
    }
    ::usleep(2000);
  }
  const std::string how = stop();
  return error("died", "the " + names_.noun + " process (" + command_ + ") " + doing + " at the " +
                           what + " (" + how + ")");
}

std::optional<std::string> JsonLinesProcess::send_line(const std::string& line,
                                                       Clock::time_point deadline,
                                                       const std::string& what) {
  for (size_t sent = 0; sent < line.size();) {
    const ssize_t n =
        ::send(fd_, line.data() + sent, line.size() - sent, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      const auto left =
          std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
      if (left.count() <= 0) {
        stop();  // the rest of the line must not reach a later request's reader
        return error("timeout", "the " + names_.noun + " (" + command_ + ") did not read the " +
                                    what + " within " + std::to_string(timeout_.count()) + " ms (" +
                                    std::to_string(sent) + " of " + std::to_string(line.size()) +
                                    " bytes taken)");
      }
      pollfd p{fd_, POLLOUT, 0};
      if (::poll(&p, 1, static_cast<int>(std::min<int64_t>(left.count(), 1000))) < 0 &&
          errno != EINTR) {
        return died("failed a poll", what);
      }
      continue;
    }
    if (n <= 0) return died("stopped reading its stdin", what);
    sent += static_cast<size_t>(n);
  }
  return std::nullopt;
}

std::optional<std::string> JsonLinesProcess::read_line(Clock::time_point deadline,
                                                       const std::string& what, std::string* line) {
  size_t eol;
  size_t from = 0;  // bytes of buffer_ already searched: each byte is looked at once
  while ((eol = buffer_.find('\n', from)) == std::string::npos) {
    from = buffer_.size();
    const auto left =
        std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
    if (left.count() <= 0) {
      stop();  // a late reply must not answer a later request
      return error("timeout", "no reply from the " + names_.noun + " (" + command_ + ") within " +
                                  std::to_string(timeout_.count()) + " ms to the " + what);
    }
    if (buffer_.size() > kMaxLineBytes) {
      const std::string head = program_output_excerpt(buffer_);
      stop();
      return error("malformed", "the reply to the " + what + " is a line of over " +
                                    std::to_string(kMaxLineBytes >> 20) + " MiB: " + head);
    }
    pollfd p{fd_, POLLIN, 0};
    const int ready = ::poll(&p, 1, static_cast<int>(std::min<int64_t>(left.count(), 1000)));
    if (ready < 0 && errno != EINTR) return died("failed a poll", what);
    if (ready <= 0) continue;
    char buf[65536];
    const ssize_t n = ::recv(fd_, buf, sizeof(buf), 0);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return died("closed its stdout", what);
    buffer_.append(buf, static_cast<size_t>(n));
  }
  *line = buffer_.substr(0, eol);
  buffer_.erase(0, eol + 1);
  return std::nullopt;
}

std::optional<std::string> JsonLinesProcess::read_reply_object(Clock::time_point deadline,
                                                               const std::string& what,
                                                               std::string* line, ojson* j) {
  for (;;) {  // until a line that is meant as a reply (what is not is dropped: see below)
    if (auto err = read_line(deadline, what, line)) return err;
    // A line that does not open a JSON object (a banner, a log line) or an object without the id
    // key (an answer to a request that wants none) is no reply: dropped, so it cannot take the
    // place of this reply and shift every later one. A line that opens an object is the reply,
    // good or bad.
    const size_t b = line->find_first_not_of(" \t\r");
    if (b != std::string::npos && (*line)[b] == '{') {
      bool too_deep = false;
      *j = parse_untrusted_json<ojson>(*line, &too_deep);
      if (too_deep) {
        return error("malformed", "the reply to the " + what +
                                      " nests arrays and objects deeper than " +
                                      std::to_string(kMaxJsonDepth) +
                                      " levels: " + program_output_excerpt(*line));
      }
      if (j->is_discarded() || !j->is_object() || j->contains(names_.id_key)) break;
    }
    // The first few dropped lines in full, then a count now and then (a chatty process must not
    // fill the log).
    ++dropped_lines_;
    if (dropped_lines_ <= kLoggedDroppedLines) {
      spdlog::warn(
          "{} ({}): dropped a line that is not a reply (waiting for the {}'s): {}{}", names_.noun,
          command_, what, program_output_excerpt(*line),
          dropped_lines_ == kLoggedDroppedLines ? " (later ones are counted, not shown)" : "");
    } else if (dropped_lines_ % 10000 == 0) {
      spdlog::warn("{} ({}): {} lines dropped so far that were not replies", names_.noun, command_,
                   dropped_lines_);
    }
  }
  if (j->is_discarded() || !j->is_object()) {
    return error("malformed", "the reply to the " + what +
                                  " is not a JSON object: " + program_output_excerpt(*line));
  }
  return std::nullopt;
}

void JsonLinesProcess::drop_stray_output() {
  // One request at a time, each reply read or timed out (the process then restarted): what the
  // process wrote before this request cannot answer it (a banner, a log line, a second reply, an
  // answer to a request that wants none). What comes after the request is sorted by the reading
  // loop.
  for (;;) {
    pollfd p{fd_, POLLIN, 0};
    if (buffer_.size() > kMaxLineBytes || ::poll(&p, 1, 0) <= 0 || !(p.revents & POLLIN)) break;
    char buf[4096];
    const ssize_t n = ::recv(fd_, buf, sizeof(buf), MSG_DONTWAIT);
    if (n <= 0) break;  // death shows at the send or the read that follows
    buffer_.append(buf, static_cast<size_t>(n));
  }
  if (buffer_.empty()) return;
  spdlog::warn("{} ({}): dropped {} bytes it wrote unasked: {}", names_.noun, command_,
               buffer_.size(), program_output_excerpt(buffer_));
  buffer_.clear();
}

}  // namespace crl::trainer
