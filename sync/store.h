// The rendezvous store (libtorch c10d TCPStore) and deadline-bound helpers around it.
//
// c10d's blocking Store::wait/get leave a TCPStore client out of step after a timeout, so every
// wait here polls check() until its deadline and throws an error that names what was missing.
#pragma once

#include <chrono>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <torch/csrc/distributed/c10d/Store.hpp>
#include <vector>

namespace crl::sync {

using StorePtr = c10::intrusive_ptr<c10d::Store>;
using Clock = std::chrono::steady_clock;

// A TCPStore server on `port` (0: any free port) on all interfaces; the caller is a client too.
StorePtr host_store(int port, std::chrono::milliseconds timeout);
// Ties the listening socket of a store from host_store() to the loopback device
// (SO_BINDTODEVICE): libtorch 1.13's TCPStore listens on every interface and takes no address, and
// it has no authentication, so a one-node job's store would be open to the network. The kernel
// then takes connections to loopback addresses only: not from other hosts, and not to the host's
// own network address either (so only for ranks that connect through 127.0.0.1). False, with the
// reason in `why`, when it could not be done.
bool bind_store_to_loopback(const StorePtr& store, std::string* why);
// The port a store from host_store() listens on.
int store_port(const StorePtr& store);
// A client of the store at addr:port; throws std::runtime_error naming the address when it cannot
// connect within `timeout`.
StorePtr connect_store(const std::string& addr, int port, std::chrono::milliseconds timeout);

// The job-wide failure key. A launcher sets it (in the job's prefixed store) when one of its
// ranks fails or it is stopped, its value naming the rank and how it failed. Every store poll
// (store_has, and through it wait_keys and store_get; Coordinator::read) looks at it at most every
// 200 ms per thread and throws JobFailed with that value: a rank waiting on a peer that died fails
// within a fraction of a second, naming the peer, instead of at its deadline (--rollout-timeout: 30
// min).
inline constexpr const char* kJobFailedKey = "job/failed";
struct JobFailed : std::runtime_error {
  using std::runtime_error::runtime_error;
};
// Sets the failure key unless it is set already (the first failure stays the one named).
void report_job_failure(const StorePtr& store, const std::string& what);
// Throws JobFailed when the failure key is set; looks at most every 200 ms per thread (cheap to
// call from any polling loop; store_has calls it when its key is absent).
void throw_if_job_failed(const StorePtr& store);
// The failure key's value, empty while it is not set.
std::string job_failure(const StorePtr& store);

void store_set(const StorePtr& store, const std::string& key, const std::string& value);
// Returns the missing keys (empty when all are present by the deadline).
std::vector<std::string> wait_keys(const StorePtr& store, const std::vector<std::string>& keys,
                                   Clock::time_point deadline);
// Gets `key` once it exists; throws std::runtime_error "<what>: key ... not set after N ms".
std::string store_get(const StorePtr& store, const std::string& key, Clock::time_point deadline,
                      const std::string& what);
bool store_has(const StorePtr& store, const std::string& key);
void store_delete(const StorePtr& store, const std::string& key);
// Adds `delta` to the integer at `key` (created at 0) and returns the new value.
int64_t store_add(const StorePtr& store, const std::string& key, int64_t delta);

// Store requests this process made through the helpers above, and the key + value bytes they
// carried (each poll of a wait counts): the control plane's cost, reported per RL step.
struct StoreCounters {
  int64_t ops = 0;
  int64_t bytes = 0;
};
StoreCounters store_counters();

}  // namespace crl::sync
