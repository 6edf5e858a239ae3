// Decoders of Hugging Face tokenizer.json ("decoder": {...}): token strings -> text. Supported:
// ByteLevel, Metaspace, Replace, ByteFallback, Fuse, Strip, WordPiece, Sequence. Anything else
// fails naming the type and the JSON path.
//
// The output is bytes as Hugging Face produces them: ByteLevel and ByteFallback turn byte sequences
// that are not valid UTF-8 into U+FFFD exactly as Rust's String::from_utf8_lossy /
// the ByteFallback decoder do, so decode() equals Hugging Face's decode() byte for byte.
//
// Thread safety: immutable after construction; decode_chain() may run on many threads at once.
#pragma once

#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "text/hf/json_path.h"

namespace crl::text::hf {

class Decoder {
 public:
  // kLossy: byte sequences that are not valid UTF-8 become U+FFFD as in Hugging Face (above).
  // kRaw: the bytes the tokens stand for, unchecked (a token may end inside a character): what
  // the exact per-token bytes of log-probs are cut from.
  enum class Bytes { kLossy, kRaw };

  virtual ~Decoder() = default;
  // Hugging Face's decode_chain: rewrites the token strings; the caller joins the result.
  void decode_chain(std::vector<std::string>& tokens) const { decode_chain(tokens, Bytes::kLossy); }
  virtual void decode_chain(std::vector<std::string>& tokens, Bytes mode) const = 0;
};

// The decoder described by `j` (tokenizer.json's "decoder", found at `at`); nullptr for JSON null
// (tokens are joined as they are).
std::unique_ptr<Decoder> make_decoder(const nlohmann::json& j, const JsonPath& at);

}  // namespace crl::text::hf
