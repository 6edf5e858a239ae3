#include "text/chat_encoder.h"

#include <algorithm>
#include <atomic>
#include <random>
#include <stdexcept>

#include "text/tokenizer.h"

namespace crl::text {

namespace {

using Spans = std::vector<std::pair<size_t, size_t>>;

bool overlaps(const Spans* spans, size_t begin, size_t end) {
  if (!spans) return false;
  for (const auto& [b, e] : *spans) {
    if (b < end && begin < e) return true;
  }
  return false;
}

}  // namespace

ChatEncoder::ChatEncoder(const text::Tokenizer& tokenizer, std::vector<int32_t> prefix)
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

std::vector<int32_t> ChatEncoder::encode(const std::string& rendered,
                                         const Spans* literal_spans) const {
  std::vector<int32_t> ids = prefix_;
  if (specials_.empty()) {  // tokenizer.json: one text, the untrusted ranges passed on
    text::EncodeOptions options;
    options.literal_spans = literal_spans;
    const std::vector<int32_t> all = tokenizer_.encode(rendered, options);
    ids.insert(ids.end(), all.begin(), all.end());
    return ids;
  }
  size_t at = 0;
  size_t text_from = 0;  // start of the text not yet encoded
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
    if (which && overlaps(literal_spans, best, best + which->first.size())) {
      at = best + 1;  // a literal from a message: sentencepiece spells it out with the text
      continue;
    }
    const size_t end = which ? best : rendered.size();
    if (end > text_from) {
      const std::vector<int32_t> part =
          tokenizer_.encode(rendered.substr(text_from, end - text_from));
      ids.insert(ids.end(), part.begin(), part.end());
    }
    if (!which) break;
    ids.push_back(which->second);
    at = text_from = best + which->first.size();
  }
  return ids;
}

std::vector<std::string> special_token_literals(const text::Tokenizer& tokenizer) {
  std::vector<std::string> out;
  for (int32_t id = 0; id < tokenizer.vocab_size(); ++id) {
    if (!tokenizer.is_special(id)) continue;
    std::string piece = tokenizer.id_to_piece(id);
    if (!piece.empty()) out.push_back(std::move(piece));
  }
  // Longest first: where two start at one place, the longer is the token.
  std::sort(out.begin(), out.end(), [](const std::string& a, const std::string& b) {
    return a.size() != b.size() ? a.size() > b.size() : a < b;
  });
  out.erase(std::unique(out.begin(), out.end()), out.end());
  return out;
}

namespace {

const std::string kOpen = "\xEE\x80\x80";   // U+E000
const std::string kClose = "\xEE\x80\x81";  // U+E001

}  // namespace

SpecialLiteralMask::SpecialLiteralMask(const std::vector<std::string>& literals) {
  for (const std::string& lit : literals) {  // kept longest first
    if (!lit.empty()) by_first_byte_[static_cast<unsigned char>(lit[0])].push_back(&lit);
  }
  static std::atomic<uint64_t> serial{0};
  std::random_device rd;
  tag_ = std::to_string(rd() % 1000000000u) + std::to_string(serial++);
}

std::string SpecialLiteralMask::mask_text(const std::string& text) {
  std::string out;
  size_t i = 0;
  while (i < text.size()) {
    const std::string* hit = nullptr;
    for (const std::string* lit : by_first_byte_[static_cast<unsigned char>(text[i])]) {
      if (text.compare(i, lit->size(), *lit) == 0) {
        hit = lit;
        break;
      }
    }
    if (!hit) {
      out += text[i++];
      continue;
    }
    out += kOpen + tag_ + "-" + std::to_string(masked_.size()) + kClose;
    masked_.push_back(*hit);
    i += hit->size();
  }
  return out;
}

nlohmann::ordered_json SpecialLiteralMask::mask(const nlohmann::ordered_json& messages) {
  nlohmann::ordered_json out = messages;
  if (!out.is_array()) return out;
  for (auto& m : out) {
    if (!m.is_object()) continue;
    for (const char* key : {"content", "reasoning_content"}) {
      if (!m.contains(key)) continue;
      auto& c = m[key];
      if (c.is_string()) {
        c = mask_text(c.get<std::string>());
      } else if (c.is_array()) {
        for (auto& part : c) {
          if (part.is_object() && part.contains("text") && part["text"].is_string()) {
            part["text"] = mask_text(part["text"].get<std::string>());
          }
        }
      }
    }
  }
  return out;
}

std::vector<std::pair<size_t, size_t>> SpecialLiteralMask::unmask(std::string& rendered) const {
  std::vector<std::pair<size_t, size_t>> spans;
  const std::string prefix = kOpen + tag_ + "-";
  std::string out;
  size_t i = 0;
  while (i < rendered.size()) {
    const size_t at = rendered.find(prefix, i);
    if (at == std::string::npos) break;
    out.append(rendered, i, at - i);
    size_t k = at + prefix.size();
    size_t index = 0;
    const size_t digits_from = k;
    while (k < rendered.size() && rendered[k] >= '0' && rendered[k] <= '9' && k - digits_from < 9) {
      index = index * 10 + static_cast<size_t>(rendered[k++] - '0');
    }
    if (k == digits_from || rendered.compare(k, kClose.size(), kClose) != 0 ||
        index >= masked_.size()) {
      throw std::invalid_argument(
          "split_special_tokens: the chat template rewrote a message's text around a special-token "
          "literal, so it cannot be kept as text");
    }
    spans.emplace_back(out.size(), out.size() + masked_[index].size());
    out += masked_[index];
    i = k + kClose.size();
  }
  out.append(rendered, i, std::string::npos);
  // A message the template does not render (an earlier turn's reasoning) drops its placeholders:
  // nothing to put back.
  rendered.swap(out);
  return spans;
}

}  // namespace crl::text
