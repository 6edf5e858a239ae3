#include "server/sessions.h"

#include <fmt/format.h>

#include "server/api_types.h"

namespace crl::server {

SessionStore::SessionStore(SessionLimits limits) : limits_(limits) {}

SessionStore::Lease::~Lease() {
  if (entry_) store_->release(*entry_);
}

size_t SessionStore::size() const {
  std::lock_guard<std::mutex> lock(mu_);
  return sessions_.size();
}

void SessionStore::release(Entry& e) {
  std::lock_guard<std::mutex> lock(mu_);
  e.busy = false;
  e.last_used = std::chrono::steady_clock::now();
}

void SessionStore::end(std::map<std::string, std::shared_ptr<Entry>>::iterator it,
                       std::string why) {
  const size_t keep = 4 * limits_.max_sessions;  // remember this many ended ids
  ended_[it->first] = std::move(why);
  ended_order_.push_back(it->first);
  while (ended_order_.size() > keep) {
    ended_.erase(ended_order_.front());
    ended_order_.pop_front();
  }
  sessions_.erase(it);
}

void SessionStore::expire_idle(std::chrono::steady_clock::time_point now) {
  const auto timeout = std::chrono::duration<double>(limits_.idle_timeout_s);
  for (auto it = sessions_.begin(); it != sessions_.end();) {
    auto next = std::next(it);
    if (!it->second->busy && now - it->second->last_used > timeout) {
      end(it, fmt::format("it expired after {:g} s without a request", limits_.idle_timeout_s));
    }
    it = next;
  }
}

SessionStore::Lease SessionStore::acquire(const std::string& id,
                                          const std::function<std::unique_ptr<Session>()>& make) {
  std::unique_lock<std::mutex> lock(mu_);
  const auto now = std::chrono::steady_clock::now();
  expire_idle(now);
  auto it = sessions_.find(id);
  if (it != sessions_.end()) {
    if (it->second->busy) {
      throw ApiError(409, "session '" + id + "' is answering another request: one turn at a time",
                     "session_id", "session_busy");
    }
    it->second->busy = true;
    return Lease(this, it->second, false);
  }
  auto gone = ended_.find(id);
  if (gone != ended_.end()) {
    throw ApiError(410, "session '" + id + "' ended: " + gone->second + "; start a new session id",
                   "session_id", "session_ended");
  }
  if (sessions_.size() >= limits_.max_sessions) {
    auto lru = sessions_.end();
    for (auto s = sessions_.begin(); s != sessions_.end(); ++s) {
      if (!s->second->busy &&
          (lru == sessions_.end() || s->second->last_used < lru->second->last_used)) {
        lru = s;
      }
    }
    if (lru == sessions_.end()) {
      throw ApiError(503,
                     fmt::format("all {} sessions are answering requests", limits_.max_sessions),
                     "session_id");
    }
    end(lru, fmt::format("it was the least recently used when the server held its maximum of {} "
                         "sessions",
                         limits_.max_sessions));
  }
  // The session is made outside the lock (it renders a probe); the id is reserved meanwhile.
  auto entry = std::make_shared<Entry>();
  entry->busy = true;
  entry->last_used = now;
  sessions_.emplace(id, entry);
  lock.unlock();
  try {
    entry->session = make();
  } catch (...) {
    lock.lock();
    sessions_.erase(id);
    throw;
  }
  return Lease(this, entry, true);
}

}  // namespace crl::server
