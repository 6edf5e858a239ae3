// Coordinator: the control plane of a job's ranks over the rendezvous store (docs/design.md §5):
// barriers, shared counters, and publish/collect of per-step reports and of named results. It is
// the one place that spells the store keys of these; callers name barriers, counters and results,
// never keys.
//
// Keys: every key is `scope` + a name this class builds, inside the store it was given (which
// carries the job's store prefix: World::store, or connect() below):
//   barrier  NAME          scope/bar/NAME/n, scope/bar/NAME/done
//   counter  GROUP s NAME  scope/GROUP/sS/NAME
//   report   s R           scope/m/sS/rR   (deleted by collect)
//   result   TOPIC NAME    scope/TOPIC/NAME (kept)
//
// Every wait has a deadline and throws std::runtime_error naming what it waited for. Requests go
// through sync/store.h's helpers, so store_traffic() counts them.
//
// Thread safety: none; a second thread uses a Coordinator of its own (connect()).
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "sync/dist_env.h"
#include "sync/store.h"

namespace crl::sync {

class Coordinator {
 public:
  // REQUIRES: `store` is already scoped to the job (World::store is).
  Coordinator(StorePtr store, std::string scope);
  // A store connection of its own to env's store, under env.store_prefix (for a second thread).
  static std::unique_ptr<Coordinator> connect(const RankEnv& env, std::chrono::milliseconds timeout,
                                              std::string scope);
  Coordinator(const Coordinator&) = delete;
  Coordinator& operator=(const Coordinator&) = delete;

  // The job-scoped store, for the classes that keep their own keys (WeightSync, RolloutSender,
  // RolloutReceiver).
  const StorePtr& store() const { return store_; }
  // This process's store requests so far (every connection): the control plane's cost.
  static StoreCounters store_traffic() { return store_counters(); }

  // A barrier of `count` ranks: one add per rank and one key to wait for, so its cost grows with
  // the ranks, not their square. The last rank to arrive deletes the keys of the `previous`
  // barrier (which every rank of this one passed). Throws "only N of COUNT ranks reached 'NAME'
  // before the deadline" at `deadline`.
  void barrier(const std::string& name, int count, Clock::time_point deadline,
               const std::string& previous = "");

  // Counters: integers shared by the ranks, created at 0, one set per (group, step).
  // add() returns the new value; read() is add(0); remove() deletes one (it reads 0 again).
  int64_t add(const std::string& group, int64_t step, const std::string& counter, int64_t delta);
  int64_t read(const std::string& group, int64_t step, const std::string& counter);
  void remove(const std::string& group, int64_t step, const std::string& counter);

  // Step reports: each rank publishes one payload per step; one reader collects them.
  void publish(int64_t step, int rank, const std::string& payload);
  // The reports of ranks 0..ranks-1 for `step`, in rank order, each deleted once read. Waits up
  // to `timeout` for each; throws "step S metrics of rank R: ..." (S 1-based) naming the key.
  std::vector<std::string> collect(int64_t step, int ranks, std::chrono::milliseconds timeout);

  // Results: a named payload published once (e.g. an evaluation) and read by anyone; kept.
  void publish_result(const std::string& topic, const std::string& name,
                      const std::string& payload);
  // Throws "WHAT: store key ... was not set in time" at `deadline`.
  std::string wait_result(const std::string& topic, const std::string& name,
                          Clock::time_point deadline, const std::string& what);

 private:
  std::string barrier_key(const std::string& name, const char* part) const;
  std::string counter_key(const std::string& group, int64_t step, const std::string& counter) const;
  std::string report_key(int64_t step, int rank) const;
  std::string result_key(const std::string& topic, const std::string& name) const;

  StorePtr store_;
  std::string scope_;
};

}  // namespace crl::sync
