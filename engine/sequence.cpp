#include "engine/sequence.h"

namespace crl::engine {

const char* finish_reason_name(FinishReason reason) {
  switch (reason) {
    case FinishReason::kStop:
      return "stop";
    case FinishReason::kLength:
      return "length";
    case FinishReason::kAbort:
      return "abort";
    case FinishReason::kNone:
      break;
  }
  return "";
}

int64_t Sequence::prompt_len() const { return static_cast<int64_t>(request->prompt.size()); }

bool Request::is_finished() const {
  if (seqs.empty()) return true;
  for (const auto& s : seqs) {
    if (!s->is_finished()) return false;
  }
  return true;
}

void Sequence::clear_generated() {
  tokens.resize(static_cast<size_t>(prompt_len()));
  raw_logprobs.clear();
  processed_logprobs.clear();
  top_logprobs.clear();
  token_versions.clear();
  finish_reason = FinishReason::kNone;
  stop_token.reset();
  stop_string.reset();
  text.clear();
  stop_checked_chars = 0;
}

}  // namespace crl::engine
