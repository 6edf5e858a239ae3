#include "engine/sequence.h"

namespace crl::engine {

const char* finish_reason_name(FinishReason reason) {
  switch (reason) {
    case FinishReason::kStop: return "stop";
    case FinishReason::kLength: return "length";
    case FinishReason::kAbort: return "abort";
    case FinishReason::kNone: break;
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

}  // namespace crl::engine
