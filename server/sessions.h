// Chat sessions (issue 28): a conversation's token trajectory (text::ChatTrajectory) kept by the
// server between turns, so the ids of a multi-turn conversation are the ids the engine sampled,
// and each turn prefills only what it adds (the earlier turns' full KV blocks are in the prefix
// cache, keyed by weight version, so blocks from older weights are never reused).
//
// A chat request names its session with the body field "session_id" or the X-Session-Id header
// (both: they must agree). The first request with a new id creates the session; later requests
// send the whole conversation as usual (OpenAI's form) and must extend it (409 otherwise, naming
// the first message that differs; a retry of the last turn rewinds it). One request at a time
// per session (409 while one runs). Sessions end after `idle_timeout_s` without a request, or
// when the store is full (the least recently used idle one goes); a request naming an ended
// session gets 410 saying why. Sessions live in the server that created them: a client keeps
// talking to one engine rank.
//
// Thread safety: every method may run on any server thread.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>

#include "text/chat_trajectory.h"

namespace crl::server {

struct SessionLimits {
  double idle_timeout_s = 600;
  size_t max_sessions = 1024;
  int64_t max_tokens = int64_t{1} << 20;  // ids a session may hold (prompts and replies)
};

struct Session {
  Session(text::ChatTrajectory t, std::string k)
      : trajectory(std::move(t)), options_key(std::move(k)) {}
  text::ChatTrajectory trajectory;
  std::string options_key;  // the tools and chat_template_kwargs every turn must repeat (JSON)
};

class SessionStore {
  struct Entry {
    std::unique_ptr<Session> session;
    bool busy = false;
    std::chrono::steady_clock::time_point last_used;
  };

 public:
  explicit SessionStore(SessionLimits limits = {});

  // A session held for one request; released (and its idle clock started) when destroyed.
  class Lease {
   public:
    Lease(SessionStore* store, std::shared_ptr<Entry> entry, bool created)
        : store_(store), entry_(std::move(entry)), created_(created) {}
    Lease(Lease&&) = default;
    Lease& operator=(Lease&&) = delete;  // would drop a held session without releasing it
    ~Lease();
    Session& operator*() const { return *entry_->session; }
    Session* operator->() const { return entry_->session.get(); }
    bool created() const { return created_; }

   private:
    SessionStore* store_;
    std::shared_ptr<Entry> entry_;
    bool created_;
  };

  // The session `id`, made by `make` when the id is new. Throws ApiError: 409 while another
  // request holds it, 410 when it ended (expired or evicted), 503 when the store is full of busy
  // sessions.
  Lease acquire(const std::string& id, const std::function<std::unique_ptr<Session>()>& make);

  size_t size() const;
  const SessionLimits& limits() const { return limits_; }

 private:
  void release(Entry& e);
  // Ends sessions idle for longer than the timeout (under mu_).
  void expire_idle(std::chrono::steady_clock::time_point now);
  void end(std::map<std::string, std::shared_ptr<Entry>>::iterator it, std::string why);

  SessionLimits limits_;
  mutable std::mutex mu_;
  std::map<std::string, std::shared_ptr<Entry>> sessions_;
  std::map<std::string, std::string> ended_;  // id -> why, the most recent ones
  std::deque<std::string> ended_order_;
};

}  // namespace crl::server
