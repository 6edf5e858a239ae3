// BpeModel: the "model": {"type": "BPE", ...} of Hugging Face tokenizer.json.
//
// vocab (token -> id), merges ("a b" strings or ["a", "b"] pairs; the rank is the position),
// unk_token, fuse_unk, byte_fallback (<0xAB> tokens for bytes not in the vocab),
// ignore_merges (a word that is itself in the vocab is one token), continuing_subword_prefix,
// end_of_word_suffix. dropout must be null or 0 (inference is deterministic). A merge naming a
// token missing from the vocab, or a merged token missing from it, fails naming the JSON path.
//
// Speed: merges are a hash map from the pair of ids to (rank, new id); a word is merged with a
// priority queue over adjacent pairs (O(n log n)); results for words up to 256 bytes are kept in a
// bounded cache shared by all threads.
//
// Thread safety: tokenize() may run on many threads at once (the cache is internally locked).
#pragma once

#include <cstdint>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <vector>

#include "text/hf/json_path.h"

namespace crl::text::hf {

class BpeModel {
 public:
  // `model` is tokenizer.json's "model" object (found at `at`); its type must be "BPE".
  BpeModel(const nlohmann::json& model, const JsonPath& at);
  ~BpeModel();
  BpeModel(const BpeModel&) = delete;
  BpeModel& operator=(const BpeModel&) = delete;

  // Appends the ids of one pre-tokenized word (normalized, byte-level mapped where the
  // pre-tokenizer does so) to `out`, as Hugging Face's BPE::tokenize does.
  void tokenize(std::string_view word, std::vector<int32_t>& out) const;

  // The id of a vocabulary token, or -1.
  int32_t token_to_id(std::string_view token) const;
  // The token of an id; nullptr when the model's vocab has no such id.
  const std::string* id_to_token(int32_t id) const;
  // 1 + the largest id of the model's vocab (added tokens may lie beyond it).
  int32_t vocab_size() const;
  int32_t unk_id() const;  // -1 when unk_token is null or not in the vocab

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace crl::text::hf
