#include "engine/stop_checker.h"

#include "text/tokenizer.h"

namespace crl::engine {

StopChecker::StopChecker(const text::Tokenizer* tokenizer, std::vector<int32_t> eos_ids,
                         int64_t max_model_len)
    : tokenizer_(tokenizer), eos_ids_(std::move(eos_ids)), max_model_len_(max_model_len) {}

std::string StopChecker::detokenize(const std::vector<int32_t>& ids, bool skip_special) const {
  return tokenizer_->decode_generated(ids, skip_special);
}

FinishReason StopChecker::check(Sequence* seq, int32_t token) const {
  if (check_stop(seq, token)) return FinishReason::kStop;
  if (seq->num_generated() >= seq->request->params.max_tokens ||
      static_cast<int64_t>(seq->tokens.size()) >= max_model_len_) {
    return FinishReason::kLength;
  }
  return FinishReason::kNone;
}

bool StopChecker::check_stop(Sequence* seq, int32_t token) const {
  const SamplingParams& p = seq->request->params;
  const int64_t generated = seq->num_generated();
  if (generated > p.min_tokens || p.min_tokens == 0) {
    for (int32_t id : p.stop_token_ids) {
      if (id == token) {
        seq->stop_token = token;
        return true;
      }
    }
    if (!p.ignore_eos) {
      for (int32_t id : eos_ids_) {
        if (id == token) {
          seq->stop_token = token;
          return true;
        }
      }
    }
  }
  if (!p.stop.empty() && tokenizer_) {
    std::vector<int32_t> gen(seq->tokens.begin() + seq->prompt_len(), seq->tokens.end());
    std::string text = detokenize(gen, p.skip_special_tokens);
    // Only text new since the last check can hold a stop string (with lookback for one that
    // straddles tokens); text generated before min_tokens can never stop the sample.
    const size_t checked = seq->stop_checked_chars;
    seq->stop_checked_chars = text.size();
    if (generated <= p.min_tokens && p.min_tokens > 0) return false;
    size_t best = std::string::npos;
    const std::string* which = nullptr;
    for (const auto& stop : p.stop) {
      const size_t from = checked >= stop.size() ? checked - (stop.size() - 1) : 0;
      const size_t at = text.find(stop, from);
      if (at != std::string::npos && at < best) {
        best = at;
        which = &stop;
      }
    }
    if (which) {
      seq->stop_string = *which;
      seq->text = text.substr(0, best);
      return true;
    }
  }
  return false;
}

}  // namespace crl::engine
