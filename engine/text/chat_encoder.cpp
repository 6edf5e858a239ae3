#include "engine/text/chat_encoder.h"

#include "engine/tokenizer.h"

namespace crl::text {

ChatEncoder::ChatEncoder(const engine::Tokenizer& tokenizer, std::vector<int32_t> prefix)
    : tokenizer_(tokenizer), prefix_(std::move(prefix)) {
  // tokenizer.json finds its added tokens itself, exactly as Hugging Face does (lstrip, rstrip,
  // ...): the rendered chat is encoded as one text, as transformers' apply_chat_template does.
  if (tokenizer_.kind() == "tokenizer.json") return;
  for (int32_t id = 0; id < tokenizer_.vocab_size(); ++id) {
    if (!tokenizer_.is_special(id)) continue;
    std::string piece = tokenizer_.id_to_piece(id);
    if (piece.size() > 2 && piece.front() == '<' && piece.back() == '>') {
      specials_.emplace_back(std::move(piece), id);
    }
  }
}

std::vector<int32_t> ChatEncoder::encode(const std::string& rendered) const {
  std::vector<int32_t> ids = prefix_;
  size_t at = 0;
  while (at < rendered.size()) {
    // The next special piece: the earliest, and the longest of those starting there.
    size_t best = std::string::npos;
    const std::pair<std::string, int32_t>* which = nullptr;
    for (const auto& s : specials_) {
      const size_t found = rendered.find(s.first, at);
      if (found == std::string::npos) continue;
      if (found < best || (found == best && s.first.size() > which->first.size())) {
        best = found;
        which = &s;
      }
    }
    const size_t end = which ? best : rendered.size();
    if (end > at) {
      const std::vector<int32_t> part = tokenizer_.encode(rendered.substr(at, end - at));
      ids.insert(ids.end(), part.begin(), part.end());
    }
    if (!which) break;
    ids.push_back(which->second);
    at = best + which->first.size();
  }
  return ids;
}

}  // namespace crl::text
