#include "sync/store.h"

#include <arpa/inet.h>
#include <dirent.h>
#include <fmt/format.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/stat.h>

#include <atomic>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <thread>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

namespace crl::sync {

namespace {
std::atomic<int64_t> g_ops{0};
std::atomic<int64_t> g_bytes{0};
}  // namespace

StoreCounters store_counters() { return {g_ops.load(), g_bytes.load()}; }

StorePtr host_store(int port, std::chrono::milliseconds timeout) {
  c10d::TCPStoreOptions opts;
  opts.port = static_cast<uint16_t>(port);
  opts.isServer = true;
  opts.waitWorkers = false;
  // The server's own client connects with a timeout counted in whole seconds.
  opts.timeout = std::max(timeout, std::chrono::milliseconds(1000));
  try {
    return c10::make_intrusive<c10d::TCPStore>("0.0.0.0", opts);
  } catch (const std::exception& e) {
    throw std::runtime_error(
        fmt::format("cannot host the rendezvous store on port {}: {}", port, e.what()));
  }
}

bool bind_store_to_loopback(const StorePtr& store, std::string* why) {
  const int port = store_port(store);
  DIR* dir = opendir("/proc/self/fd");
  if (!dir || port <= 0) {
    if (dir) closedir(dir);
    *why = port <= 0 ? "not a TCPStore" : "cannot list /proc/self/fd";
    return false;
  }
  int bound = 0;
  *why = fmt::format("no listening socket on port {}", port);
  while (dirent* e = readdir(dir)) {
    char* end = nullptr;
    const long fd = std::strtol(e->d_name, &end, 10);
    if (end == e->d_name || *end != '\0') continue;
    struct stat st;
    if (fstat(static_cast<int>(fd), &st) != 0 || !S_ISSOCK(st.st_mode)) continue;
    int listening = 0;
    socklen_t len = sizeof(listening);
    if (getsockopt(static_cast<int>(fd), SOL_SOCKET, SO_ACCEPTCONN, &listening, &len) != 0 ||
        !listening) {
      continue;
    }
    sockaddr_storage a{};
    len = sizeof(a);
    if (getsockname(static_cast<int>(fd), reinterpret_cast<sockaddr*>(&a), &len) != 0) continue;
    int p = -1;
    if (a.ss_family == AF_INET) p = ntohs(reinterpret_cast<sockaddr_in&>(a).sin_port);
    if (a.ss_family == AF_INET6) p = ntohs(reinterpret_cast<sockaddr_in6&>(a).sin6_port);
    if (p != port) continue;
    if (setsockopt(static_cast<int>(fd), SOL_SOCKET, SO_BINDTODEVICE, "lo", 3) != 0) {
      *why = fmt::format("SO_BINDTODEVICE: {}", std::strerror(errno));
      closedir(dir);
      return false;
    }
    ++bound;
  }
  closedir(dir);
  return bound > 0;
}

int store_port(const StorePtr& store) {
  auto* tcp = dynamic_cast<c10d::TCPStore*>(store.get());
  return tcp ? tcp->getPort() : 0;
}

StorePtr connect_store(const std::string& addr, int port, std::chrono::milliseconds timeout) {
  c10d::TCPStoreOptions opts;
  opts.port = static_cast<uint16_t>(port);
  opts.isServer = false;
  opts.waitWorkers = false;
  // The client's connect retries are counted in whole seconds.
  opts.timeout = std::max(timeout, std::chrono::milliseconds(1000));
  try {
    return c10::make_intrusive<c10d::TCPStore>(addr, opts);
  } catch (const std::exception& e) {
    throw std::runtime_error(fmt::format(
        "rendezvous: cannot reach the store at {}:{} within {} ms (is MASTER_ADDR/MASTER_PORT "
        "node 0's, and is node 0 running?): {}",
        addr, port, opts.timeout.count(), e.what()));
  }
}

void store_set(const StorePtr& store, const std::string& key, const std::string& value) {
  g_ops++;
  g_bytes += static_cast<int64_t>(key.size() + value.size());
  store->set(key, std::vector<uint8_t>(value.begin(), value.end()));
}

bool store_has(const StorePtr& store, const std::string& key) {
  g_ops++;
  g_bytes += static_cast<int64_t>(key.size());
  if (store->check({key})) return true;
  throw_if_job_failed(store);  // polls come here
  return false;
}

void throw_if_job_failed(const StorePtr& store) {
  thread_local Clock::time_point next_look{};
  const auto now = Clock::now();
  if (now < next_look) return;
  next_look = now + std::chrono::milliseconds(200);
  const std::string failure = job_failure(store);
  if (!failure.empty()) throw JobFailed("the job failed elsewhere: " + failure);
}

std::string job_failure(const StorePtr& store) {
  g_ops++;
  g_bytes += static_cast<int64_t>(std::char_traits<char>::length(kJobFailedKey));
  if (!store->check({kJobFailedKey})) return "";
  const auto v = store->get(kJobFailedKey);
  return std::string(v.begin(), v.end());
}

void report_job_failure(const StorePtr& store, const std::string& what) {
  // Set only when absent, atomically in the store: two launchers failing at once cannot replace
  // the first failure with the second.
  (void)store->compareSet(kJobFailedKey, {}, std::vector<uint8_t>(what.begin(), what.end()));
}

void store_delete(const StorePtr& store, const std::string& key) {
  g_ops++;
  g_bytes += static_cast<int64_t>(key.size());
  store->deleteKey(key);
}

int64_t store_add(const StorePtr& store, const std::string& key, int64_t delta) {
  g_ops++;
  g_bytes += static_cast<int64_t>(key.size()) + 8;
  return store->add(key, delta);
}

std::vector<std::string> wait_keys(const StorePtr& store, const std::vector<std::string>& keys,
                                   Clock::time_point deadline) {
  std::vector<std::string> missing = keys;
  auto pause = std::chrono::microseconds(200);
  while (true) {
    std::vector<std::string> still;
    for (const auto& k : missing) {
      if (!store_has(store, k)) still.push_back(k);
    }
    missing.swap(still);
    if (missing.empty() || Clock::now() >= deadline) return missing;
    std::this_thread::sleep_for(pause);
    pause = std::min(pause * 2, std::chrono::microseconds(20000));
  }
}

std::string store_get(const StorePtr& store, const std::string& key, Clock::time_point deadline,
                      const std::string& what) {
  if (!wait_keys(store, {key}, deadline).empty()) {
    throw std::runtime_error(fmt::format("{}: store key '{}' was not set in time", what, key));
  }
  auto v = store->get(key);
  g_ops++;
  g_bytes += static_cast<int64_t>(key.size() + v.size());
  return std::string(v.begin(), v.end());
}

}  // namespace crl::sync
