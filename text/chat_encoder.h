// ChatEncoder: the token ids of a prompt rendered by a chat template.
//
// A template writes special tokens as text (<s>, <|im_start|>, </s>). A tokenizer.json finds them
// itself (its added tokens), so the rendered text is encoded as one. Sentencepiece would spell
// them out piece by piece, so for tokenizer.model every occurrence of a special piece written <...>
// (a control token of the vocabulary) becomes its id, the longest one where several start at the
// same place, and the text between is encoded as usual. Nothing is added but `prefix`: empty for
// the model's own template, which writes its BOS itself (vLLM encodes a rendered template without
// adding special tokens), the model's BOS for a built-in format. The server's chat endpoint and the
// trainer's "messages" rows both encode here, so both give a conversation the same ids.
//
// Thread safety: immutable after construction; encode() may run on many threads at once.
// REQUIRES: `tokenizer` outlives the encoder.
//
// SpecialLiteralMask is split_special_tokens for chats: special-token literals in the messages
// (untrusted text: "<|im_start|>" typed by a user) stay text, while the template's own special
// tokens are tokens. Before rendering, mask() replaces each literal in the messages' contents by
// a placeholder the template copies like any text; unmask() puts the literals back into the
// render and returns where they are, for encode() to leave as text.
#pragma once

#include <array>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

namespace crl::text {

class Tokenizer;

class ChatEncoder {
 public:
  ChatEncoder(const text::Tokenizer& tokenizer, std::vector<int32_t> prefix = {});

  // `prefix`, then the ids of `rendered`. Special-token literals that overlap `literal_spans`
  // (byte ranges of `rendered`, sorted and disjoint; SpecialLiteralMask::unmask) are text.
  std::vector<int32_t> encode(
      const std::string& rendered,
      const std::vector<std::pair<size_t, size_t>>* literal_spans = nullptr) const;

 private:
  const text::Tokenizer& tokenizer_;
  std::vector<int32_t> prefix_;
  std::vector<std::pair<std::string, int32_t>> specials_;  // control piece -> id
};

// The literals of a tokenizer's special tokens ("<|im_start|>", "<s>", ...).
std::vector<std::string> special_token_literals(const text::Tokenizer& tokenizer);

class SpecialLiteralMask {
 public:
  // REQUIRES: `literals` (special_token_literals) outlives the mask. One mask per chat.
  explicit SpecialLiteralMask(const std::vector<std::string>& literals);

  // `messages` with every special-token literal in each message's "content" (a string, or the
  // "text" of its parts) and "reasoning_content" replaced by a placeholder: a private-use
  // character, digits, another private-use character.
  nlohmann::ordered_json mask(const nlohmann::ordered_json& messages);
  // Puts the literals back into `rendered` (a render of the masked messages) and returns the
  // byte ranges they occupy there, sorted. Throws std::invalid_argument when the template
  // dropped or rewrote a placeholder (so a literal's place is unknown).
  std::vector<std::pair<size_t, size_t>> unmask(std::string& rendered) const;

 private:
  std::string mask_text(const std::string& text);

  std::array<std::vector<const std::string*>, 256> by_first_byte_;  // the literals, longest first
  std::string tag_;                  // digits unique to this mask, in every placeholder
  std::vector<std::string> masked_;  // placeholder i stands for masked_[i]
};

}  // namespace crl::text
