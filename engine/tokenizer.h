// Tokenizer: a sentencepiece tokenizer.model behind a pimpl (sentencepiece headers stay in the .cpp).
//
// Thread safety: encode/decode are const and safe to call from several threads.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace crl::engine {

class Tokenizer {
 public:
  // Loads <path> (a sentencepiece model). Throws std::runtime_error naming the file.
  explicit Tokenizer(const std::string& model_path);
  ~Tokenizer();
  Tokenizer(const Tokenizer&) = delete;
  Tokenizer& operator=(const Tokenizer&) = delete;

  // Text to ids; no BOS is added here (the engine adds bos_id() when the model config asks).
  std::vector<int32_t> encode(const std::string& text) const;
  // Ids to text; ids outside the vocabulary throw std::invalid_argument naming the id.
  std::string decode(const std::vector<int32_t>& ids, bool skip_special_tokens = true) const;
  // The text of one piece (e.g. "▁the"), for debugging and top-logprob display.
  std::string id_to_piece(int32_t id) const;

  int32_t vocab_size() const;
  int32_t bos_id() const;  // -1 when the model has none
  int32_t eos_id() const;  // -1 when the model has none
  int32_t pad_id() const;  // -1 when the model has none
  bool is_special(int32_t id) const;  // control / unknown pieces

  // Trains a BPE sentencepiece model on the lines of `corpus_path`, writing `<model_prefix>.model`
  // (and .vocab). Ids: pad 0, unk 1, bos 2, eos 3; byte fallback on, so any UTF-8 text encodes.
  static void train(const std::string& corpus_path, const std::string& model_prefix,
                    int32_t vocab_size);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace crl::engine
