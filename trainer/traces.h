// --traces FILE: one JSON line per rollout sample of the traced groups, what a user opens to see
// what the model learned and why a step's numbers are what they are: the step, the prompt and the
// completion (text and ids), the reward and the advantage it trained with, and per token the raw
// log-prob the engine sampled it at and the weight version that sampled it (multi-turn: the loss
// mask, 0 on tool and environment text). A dropped group (too stale) is traced too, marked.
//
// Which groups: all at rate 1; else those whose hash of (seed, step, prompt index) falls below the
// rate, the same groups in any run of the same seed. Every infer rank of a node appends to the same
// file, a whole group in one write (O_APPEND on a local file system: groups of concurrent writers
// do not mix; several nodes writing one file on a network file system may). A fresh run empties
// the file first (TraceOptions::truncate, the node's first infer rank); a resumed run appends.
//
// Thread safety: write() from one thread at a time (an infer rank's producer thread).
// REQUIRES: `tokenizer` outlives the writer.
#pragma once

#include <cstdint>
#include <string>

#include "text/tokenizer.h"
#include "trainer/micro_batch.h"

namespace crl::trainer {

struct TraceOptions {
  std::string path;       // "": no traces
  double rate = 1.0;      // share of groups traced, in (0, 1]
  uint64_t seed = 1;      // the job's --seed
  bool truncate = false;  // empty the file when opening it (a fresh run's first writer)
};

class TraceWriter {
 public:
  // Opens `o.path` for appending (created when missing); throws std::runtime_error naming it.
  TraceWriter(const TraceOptions& o, const text::Tokenizer& tokenizer);
  ~TraceWriter();
  TraceWriter(const TraceWriter&) = delete;
  TraceWriter& operator=(const TraceWriter&) = delete;

  // Whether step `step`'s group of prompt `prompt_index` is traced (a pure function of both and
  // the options).
  bool traced(int64_t step, int64_t prompt_index) const;
  // Appends the group's samples when traced, each line with `group`: the writer's running count
  // of the groups it was given (traced or not), so the lines of one group share it. `step` is
  // 1-based (the --metrics row's step).
  void write(int64_t step, int infer_rank, const SampleGroup& group, bool dropped);
  int64_t lines_written() const { return lines_; }

 private:
  TraceOptions o_;
  const text::Tokenizer& tokenizer_;
  int fd_ = -1;
  int64_t lines_ = 0;
  int64_t groups_ = 0;
};

}  // namespace crl::trainer
