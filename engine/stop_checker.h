// StopChecker: when a sample ends (docs/design.md §4: stop tokens, EOS, stop strings, max_tokens,
// the context length), for Scheduler::postprocess, and the detokenizer the engine's outputs share.
//
// Thread safety: const methods read immutable state; check() writes only the sequence it is given.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "engine/sequence.h"

namespace crl::text {
class Tokenizer;
}

namespace crl::engine {

class StopChecker {
 public:
  // tokenizer: may be null (no stop strings, no text). REQUIRES: it outlives this object.
  StopChecker(const text::Tokenizer* tokenizer, std::vector<int32_t> eos_ids,
              int64_t max_model_len);

  // Why `seq` ends now that `token` was appended to it: kStop (a stop token, EOS unless
  // ignore_eos, or a stop string in its text; recorded on the sequence), kLength (max_tokens or
  // the context length), or kNone.
  FinishReason check(Sequence* seq, int32_t token) const;

  // Text of `ids`; ids beyond the tokenizer's vocabulary (padded embeddings) have none.
  // REQUIRES: a tokenizer.
  std::string detokenize(const std::vector<int32_t>& ids, bool skip_special) const;

  const text::Tokenizer* tokenizer() const { return tokenizer_; }
  const std::vector<int32_t>& eos_ids() const { return eos_ids_; }
  int64_t max_model_len() const { return max_model_len_; }

 private:
  bool check_stop(Sequence* seq, int32_t token) const;

  const text::Tokenizer* tokenizer_;
  std::vector<int32_t> eos_ids_;
  int64_t max_model_len_;
};

}  // namespace crl::engine
