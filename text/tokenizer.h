// Tokenizer: the model's tokenizer, whichever file the model directory carries.
//
//   tokenizer.json   Hugging Face tokenizers format (byte-level BPE as in Llama-3, Qwen2.5/3,
//                    DeepSeek; sentencepiece-style BPE as in Llama-2, Mistral): text/hf/.
//   tokenizer.model  sentencepiece (dlopen'ed, see tokenizer.cpp).
// A directory holding both loads tokenizer.json, as Hugging Face's AutoTokenizer does;
// tokenizer_config.json beside it supplies bos/eos/pad tokens and add_bos_token/add_eos_token.
//
// Thread safety: every const member may be called from several threads at once.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace crl::text {

struct EncodeOptions {
  // Add the model's special tokens as Hugging Face's tokenizer(text) does: the post-processor of
  // tokenizer.json (e.g. Llama-3's <|begin_of_text|>), with tokenizer_config.json's
  // add_bos_token/add_eos_token applied; for tokenizer.model, BOS when add_bos_token (default true
  // when the model has a BOS) and EOS when add_eos_token.
  bool add_special_tokens = false;
  // Treat special-token literals in the text ("<|im_start|>") as plain text instead of their ids
  // (Hugging Face's split_special_tokens): for untrusted text. Off by default, as in Hugging Face.
  bool split_special_tokens = false;
  // Byte ranges [begin, end) of the text where special-token literals are text, as with
  // split_special_tokens but only there: the untrusted parts of a text (message contents in a
  // rendered chat; text::SpecialLiteralMask). Sorted, disjoint; nullptr: none.
  const std::vector<std::pair<size_t, size_t>>* literal_spans = nullptr;
};

class Tokenizer {
 public:
  // Loads `path`: a model directory (see above), a tokenizer.json or a tokenizer.model file.
  // Throws std::runtime_error naming the file (and, for JSON, the path inside it) when it is
  // missing, malformed or uses something unsupported.
  explicit Tokenizer(const std::string& path);
  ~Tokenizer();
  Tokenizer(const Tokenizer&) = delete;
  Tokenizer& operator=(const Tokenizer&) = delete;

  // True when `dir` holds tokenizer.json or tokenizer.model.
  static bool dir_has_tokenizer(const std::string& dir);
  // The file a directory's tokenizer loads from ("" when it has none).
  static std::string tokenizer_file_in(const std::string& dir);

  // Text to ids. With default options: no special tokens are added (the engine adds BOS itself),
  // and special-token literals in the text become their ids (tokenizer.json only; sentencepiece
  // spells them out).
  std::vector<int32_t> encode(const std::string& text, const EncodeOptions& options = {}) const;
  // Whether `text` certainly encodes to more than `limit` tokens, found without encoding it whole:
  // a text over kCountPieceBytes is encoded a piece at a time (cut before whitespace where one is
  // near, else at a character boundary), the pieces' counts summed, until the sum passes `limit`
  // plus kCountCutMargin tokens for each cut so far (what a cut can change). False when the text
  // may fit: encode it to know. Memory and time: one piece at a time, so a megabytes-long prompt
  // against a short context is refused after its first pieces.
  bool exceeds_tokens(const std::string& text, int64_t limit,
                      const EncodeOptions& options = {}) const;
  static constexpr size_t kCountPieceBytes = 64 << 10;
  static constexpr int64_t kCountCutMargin = 16;
  // Several texts, on up to `num_threads` threads (0: all cores); result i is encode(texts[i]).
  std::vector<std::vector<int32_t>> encode_batch(const std::vector<std::string>& texts,
                                                 const EncodeOptions& options = {},
                                                 int num_threads = 0) const;
  // The ids encode(text, {add_special_tokens=true}) puts before the text (BOS, or nothing): what
  // goes in front of ids that are joined to it (a chat encoded piecewise, SFT prompts).
  std::vector<int32_t> special_prefix() const;
  // Ids to text, as Hugging Face's decode(ids, skip_special_tokens); ids outside the vocabulary
  // throw std::invalid_argument naming the id.
  std::string decode(const std::vector<int32_t>& ids, bool skip_special_tokens = true) const;
  // As decode, for what a model generated: ids outside the vocabulary (a model's padded embedding
  // rows, which a sampler can draw) have no text and are left out, as appended_bytes does.
  std::string decode_generated(const std::vector<int32_t>& ids,
                               bool skip_special_tokens = true) const;
  // As decode, but the bytes the tokens stand for, without the UTF-8 repair: where decode shows an
  // incomplete or invalid byte sequence as U+FFFD, this keeps the bytes. For valid text the two
  // are equal.
  std::string decode_bytes(const std::vector<int32_t>& ids, bool skip_special_tokens = true) const;
  // The exact bytes token `id` adds to the text when it follows ids[0..end):
  // decode_bytes(ids[0..end]
  // + {id}) less decode_bytes(ids[0..end]), computed from the last few ids only. The bytes of a
  // token that ends inside a multi-byte character are not valid UTF-8 alone; over a sequence the
  // pieces concatenate to decode_bytes of the whole. What log-probs report as a token's "bytes".
  // Ids outside the vocabulary (a model's padded embedding rows) add nothing and are skipped as
  // context.
  std::string appended_bytes(const std::vector<int32_t>& ids, size_t end, int32_t id,
                             bool skip_special_tokens = true) const;
  // The vocabulary string of one token (e.g. "▁the", "Ġthe", "<|im_start|>").
  std::string id_to_piece(int32_t id) const;
  // The id of a vocabulary string (including added tokens), or -1.
  int32_t piece_to_id(const std::string& piece) const;

  int32_t vocab_size() const;         // 1 + the largest id, added tokens included
  int32_t bos_id() const;             // -1 when the model has none
  int32_t eos_id() const;             // -1 when the model has none
  int32_t pad_id() const;             // -1 when the model has none
  bool is_special(int32_t id) const;  // special added tokens / sentencepiece control and unknown
  // "tokenizer.json" or "sentencepiece".
  std::string kind() const;
  // The file loaded.
  const std::string& path() const;

  // Trains a BPE sentencepiece model on the lines of `corpus_path`, writing `<model_prefix>.model`
  // (and .vocab). Ids: pad 0, unk 1, bos 2, eos 3; byte fallback on, so any UTF-8 text encodes.
  static void train(const std::string& corpus_path, const std::string& model_prefix,
                    int32_t vocab_size);

  // The loaded tokenizer, whichever kind (text/tokenizer.cpp and text/hf/).
  class Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

// Incremental detokenization for streams: feed ids one at a time; each step returns the text they
// add, never a partial UTF-8 character (held back until the bytes that complete it arrive), and
// the concatenation of all steps plus flush() equals decode(all ids).
class DecodeStream {
 public:
  DecodeStream(const Tokenizer& tokenizer, bool skip_special_tokens = true);
  std::string step(int32_t id);
  // Whatever is held back (an incomplete character at the end becomes U+FFFD, as decode gives).
  std::string flush();

 private:
  const Tokenizer& tokenizer_;
  bool skip_special_;
  std::vector<int32_t> ids_;
  size_t prefix_start_ = 0;  // ids_[prefix_start_..] are decoded together each step
  std::string prefix_text_;  // decode of ids_[prefix_start_..read_]
  size_t read_ = 0;
};

}  // namespace crl::text
