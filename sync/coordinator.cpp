#include "sync/coordinator.h"

#include <fmt/format.h>

#include <stdexcept>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <utility>

namespace crl::sync {

Coordinator::Coordinator(StorePtr store, std::string scope)
    : store_(std::move(store)), scope_(std::move(scope)) {}

std::unique_ptr<Coordinator> Coordinator::connect(const RankEnv& env,
                                                  std::chrono::milliseconds timeout,
                                                  std::string scope) {
  StorePtr store = connect_store(env.master_addr, env.master_port, timeout);
  if (!env.store_prefix.empty()) {
    store = c10::make_intrusive<c10d::PrefixStore>(env.store_prefix, store);
  }
  return std::make_unique<Coordinator>(std::move(store), std::move(scope));
}

std::string Coordinator::barrier_key(const std::string& name, const char* part) const {
  return scope_ + "bar/" + name + "/" + part;
}

std::string Coordinator::counter_key(const std::string& group, int64_t step,
                                     const std::string& counter) const {
  return fmt::format("{}{}/s{}/{}", scope_, group, step, counter);
}

std::string Coordinator::result_key(const std::string& topic, const std::string& name) const {
  return scope_ + topic + "/" + name;
}

void Coordinator::barrier(const std::string& name, int count, Clock::time_point deadline,
                          const std::string& previous) {
  const std::string done = barrier_key(name, "done");
  if (store_add(store_, barrier_key(name, "n"), 1) == count) {
    // Everyone passed `previous` before reaching this one: its keys can go.
    if (!previous.empty()) {
      store_delete(store_, barrier_key(previous, "n"));
      store_delete(store_, barrier_key(previous, "done"));
    }
    store_set(store_, done, "1");
  }
  if (!wait_keys(store_, {done}, deadline).empty()) {
    auto v = store_->get(barrier_key(name, "n"));
    throw std::runtime_error(fmt::format("only {} of {} ranks reached '{}' before the deadline",
                                         std::string(v.begin(), v.end()), count, name));
  }
}

int64_t Coordinator::add(const std::string& group, int64_t step, const std::string& counter,
                         int64_t delta) {
  return store_add(store_, counter_key(group, step, counter), delta);
}

int64_t Coordinator::read(const std::string& group, int64_t step, const std::string& counter) {
  throw_if_job_failed(store_);  // counters are polled: a peer that died will not move them
  return add(group, step, counter, 0);
}

void Coordinator::remove(const std::string& group, int64_t step, const std::string& counter) {
  store_delete(store_, counter_key(group, step, counter));
}

std::string Coordinator::report_key(int64_t step, int rank) const {
  return fmt::format("{}m/s{}/r{}", scope_, step, rank);
}

void Coordinator::publish(int64_t step, int rank, const std::string& payload) {
  store_set(store_, report_key(step, rank), payload);
}

std::vector<std::string> Coordinator::collect(int64_t step, int ranks,
                                              std::chrono::milliseconds timeout) {
  std::vector<std::string> out;
  for (int r = 0; r < ranks; ++r) {
    const std::string key = report_key(step, r);
    out.push_back(store_get(store_, key, Clock::now() + timeout,
                            fmt::format("step {} metrics of rank {}", step + 1, r)));
    store_delete(store_, key);
  }
  return out;
}

void Coordinator::publish_result(const std::string& topic, const std::string& name,
                                 const std::string& payload) {
  store_set(store_, result_key(topic, name), payload);
}

std::string Coordinator::wait_result(const std::string& topic, const std::string& name,
                                     Clock::time_point deadline, const std::string& what) {
  return store_get(store_, result_key(topic, name), deadline, what);
}

}  // namespace crl::sync
