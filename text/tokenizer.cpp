#include "text/tokenizer.h"

// Why sentencepiece is loaded with dlopen: Debian's libsentencepiece.so.0 carries its own copy of
// protobuf-lite 3.14 and exports those symbols, while libtorch_cpu loads the system
// libprotobuf.so.32 (3.21). When both sit in the global symbol scope, one of them binds to the
// other's protobuf internals: linked normally, libprotobuf's static initializers call into
// sentencepiece's copy and every binary segfaults before main(); with libprotobuf first,
// sentencepiece aborts in its own protobuf CHECKs. So no binary may link sentencepiece; this file
// dlopens it with RTLD_LOCAL | RTLD_DEEPBIND (its symbols stay private and it binds to its own
// protobuf first). Every call goes through virtual functions or dlsym'd pointers, except the small
// util::Status class, whose out-of-line members are defined below to match the library.
#include <dlfcn.h>
#include <fcntl.h>
#include <sentencepiece_processor.h>
#include <sentencepiece_trainer.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <nlohmann/json.hpp>
#include <sstream>
#include <stdexcept>
#include <thread>
#include <unordered_map>

#include "common/file_util.h"
#include "text/hf/hf_tokenizer.h"
#include "text/hf/json_path.h"

// util::Status as sentencepiece 0.1.97 defines it (src/common.h / util.cc): a null Rep means OK.
// Only what this file uses is defined; the library binds to its own definitions.
namespace sentencepiece::util {
struct Status::Rep {
  StatusCode code;
  std::string error_message;
};
Status::Status() {}
Status::~Status() {}
std::string Status::ToString() const {
  return rep_ == nullptr
             ? "OK"
             : "code " + std::to_string(static_cast<int>(rep_->code)) + ": " + rep_->error_message;
}
}  // namespace sentencepiece::util

namespace crl::text {
namespace {

// The dlopen'ed sentencepiece libraries (process-wide, never unloaded).
class SpmLibrary {
 public:
  using TrainFn =
      sentencepiece::util::Status (*)(const std::unordered_map<std::string, std::string>&,
                                      sentencepiece::SentenceIterator*, std::string*);

  static SpmLibrary& get() {
    static SpmLibrary lib;
    return lib;
  }

  // A new processor; delete it (virtual destructor) when done.
  std::unique_ptr<sentencepiece::SentencePieceProcessor> new_processor() {
    using CtorFn = void (*)(void*);
    static CtorFn ctor = reinterpret_cast<CtorFn>(
        symbol(processor_handle(), "_ZN13sentencepiece22SentencePieceProcessorC1Ev"));
    void* mem = ::operator new(sizeof(sentencepiece::SentencePieceProcessor));
    ctor(mem);
    return std::unique_ptr<sentencepiece::SentencePieceProcessor>(
        static_cast<sentencepiece::SentencePieceProcessor*>(mem));
  }

  TrainFn train_fn() {
    std::lock_guard<std::mutex> lock(mu_);
    if (train_ == nullptr) {
      processor_handle();  // libsentencepiece_train depends on it: load it with DEEPBIND first
      void* h = open("libsentencepiece_train.so.0");
      train_ = reinterpret_cast<TrainFn>(symbol(
          h,
          "_ZN13sentencepiece20SentencePieceTrainer5TrainERKSt13unordered_mapINSt7__cxx1112basic_"
          "stringIcSt11char_traitsIcESaIcEEES7_St4hashIS7_ESt8equal_toIS7_ESaISt4pairIKS7_S7_"
          "EEEPNS_"
          "16SentenceIteratorEPS7_"));
    }
    return train_;
  }

 private:
  void* processor_handle() {
    static void* handle = open("libsentencepiece.so.0");
    return handle;
  }
  static void* open(const char* name) {
    void* h = ::dlopen(name, RTLD_NOW | RTLD_LOCAL | RTLD_DEEPBIND);
    if (h == nullptr)
      throw std::runtime_error(std::string("cannot load ") + name + ": " + ::dlerror());
    return h;
  }
  static void* symbol(void* handle, const char* name) {
    void* p = ::dlsym(handle, name);
    if (p == nullptr)
      throw std::runtime_error(std::string("sentencepiece symbol missing: ") + name);
    return p;
  }
  std::mutex mu_;
  TrainFn train_ = nullptr;
};

// Feeds the lines of a text file to the trainer, so that no file path ends up in the trained model.
class LineIterator : public sentencepiece::SentenceIterator {
 public:
  explicit LineIterator(const std::string& path) : in_(path, std::ios::binary) { Next(); }
  bool done() const override { return done_; }
  void Next() override {
    done_ = !std::getline(in_, line_);
    if (!done_ && !line_.empty() && line_.back() == '\r') line_.pop_back();
  }
  const std::string& value() const override { return line_; }
  // Read errors are reported through failed() rather than a non-OK Status (see the note above).
  sentencepiece::util::Status status() const override { return sentencepiece::util::Status(); }
  bool failed() const { return in_.bad(); }

 private:
  std::ifstream in_;
  std::string line_;
  bool done_ = false;
};

}  // namespace

// The loaded tokenizer: sentencepiece here, tokenizer.json in text/hf/.
class Tokenizer::Impl {
 public:
  virtual ~Impl() = default;
  virtual std::vector<int32_t> encode(const std::string& text, const EncodeOptions& o) const = 0;
  virtual std::string decode(const std::vector<int32_t>& ids, bool skip_special) const = 0;
  virtual std::string decode_bytes(const std::vector<int32_t>& ids, bool skip_special) const = 0;
  virtual std::vector<int32_t> special_prefix() const = 0;
  virtual std::string id_to_piece(int32_t id) const = 0;
  virtual int32_t piece_to_id(const std::string& piece) const = 0;
  virtual int32_t vocab_size() const = 0;
  virtual int32_t bos_id() const = 0;
  virtual int32_t eos_id() const = 0;
  virtual int32_t pad_id() const = 0;
  virtual bool is_special(int32_t id) const = 0;
  virtual std::string kind() const = 0;
  std::string path;
};

namespace {

// tokenizer_config.json's add_bos_token / add_eos_token (absent: BOS yes, EOS no, as
// transformers' LlamaTokenizer).
void read_add_flags(const std::string& config_path, bool* add_bos, bool* add_eos) {
  *add_bos = true;
  *add_eos = false;
  std::ifstream in(config_path);
  if (!in) return;
  auto j = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object())
    throw std::runtime_error(config_path + ": not a JSON object");
  for (auto [key, flag] : {std::pair<const char*, bool*>{"add_bos_token", add_bos},
                           std::pair<const char*, bool*>{"add_eos_token", add_eos}}) {
    auto it = j.find(key);
    if (it == j.end() || it->is_null()) continue;
    if (!it->is_boolean())
      throw std::runtime_error(config_path + ": " + key + ": expected true or false");
    *flag = it->get<bool>();
  }
}

void check_id(int32_t id, int32_t vocab) {
  if (id < 0 || id >= vocab) {
    throw std::invalid_argument("token id " + std::to_string(id) + " is out of range [0, " +
                                std::to_string(vocab) + ")");
  }
}

class SentencePieceImpl final : public Tokenizer::Impl {
 public:
  SentencePieceImpl(const std::string& model_path, const std::string& config_path) {
    path = model_path;
    sp_ = SpmLibrary::get().new_processor();
    const auto status = sp_->Load(model_path);
    if (!status.ok()) {
      throw std::runtime_error("cannot load tokenizer model " + model_path + ": " +
                               status.ToString());
    }
    read_add_flags(config_path, &add_bos_, &add_eos_);
  }

  std::vector<int32_t> encode(const std::string& text, const EncodeOptions& o) const override {
    std::vector<int> ids;
    const auto status = sp_->Encode(text, &ids);
    if (!status.ok()) throw std::runtime_error("tokenizer encode failed: " + status.ToString());
    std::vector<int32_t> out;
    out.reserve(ids.size() + 2);
    if (o.add_special_tokens && add_bos_ && bos_id() >= 0) out.push_back(bos_id());
    out.insert(out.end(), ids.begin(), ids.end());
    if (o.add_special_tokens && add_eos_ && eos_id() >= 0) out.push_back(eos_id());
    return out;
  }

  std::vector<int32_t> special_prefix() const override {
    if (add_bos_ && bos_id() >= 0) return {bos_id()};
    return {};
  }
  std::string decode(const std::vector<int32_t>& ids, bool skip_special) const override {
    return decode_as(ids, skip_special, /*raw_bytes=*/false);
  }
  std::string decode_bytes(const std::vector<int32_t>& ids, bool skip_special) const override {
    return decode_as(ids, skip_special, /*raw_bytes=*/true);
  }

  std::string id_to_piece(int32_t id) const override {
    check_id(id, vocab_size());
    return sp_->IdToPiece(id);
  }
  int32_t piece_to_id(const std::string& piece) const override {
    const int id = sp_->PieceToId(piece);
    // sentencepiece answers unk for unknown pieces.
    return (id == sp_->unk_id() && sp_->IdToPiece(id) != piece) ? -1 : id;
  }
  int32_t vocab_size() const override { return sp_->GetPieceSize(); }
  int32_t bos_id() const override { return sp_->bos_id(); }
  int32_t eos_id() const override { return sp_->eos_id(); }
  int32_t pad_id() const override { return sp_->pad_id(); }
  bool is_special(int32_t id) const override {
    if (id < 0 || id >= vocab_size()) return false;
    return sp_->IsControl(id) || sp_->IsUnknown(id);
  }
  std::string kind() const override { return "sentencepiece"; }

 private:
  // Runs of ordinary ids are decoded together (so merges and byte pieces join up); special ids
  // are dropped, or rendered as their piece text when skip_special is false.
  std::string decode_as(const std::vector<int32_t>& ids, bool skip_special, bool raw_bytes) const {
    const int32_t vocab = vocab_size();
    for (int32_t id : ids) check_id(id, vocab);
    std::string text;
    std::vector<int> run;
    auto flush = [&] {
      if (run.empty()) return;
      if (raw_bytes) {
        text += run_bytes(run);
      } else {
        std::string part;
        const auto status = sp_->Decode(run, &part);
        if (!status.ok()) throw std::runtime_error("tokenizer decode failed: " + status.ToString());
        text += part;
      }
      run.clear();
    };
    for (int32_t id : ids) {
      if (is_special(id)) {
        if (skip_special) continue;
        flush();
        text += sp_->IdToPiece(id);
      } else {
        run.push_back(id);
      }
    }
    flush();
    return text;
  }

  // The bytes of a run of ordinary pieces as sentencepiece's Decode joins them, without its UTF-8
  // repair: "<0xAB>" pieces are their byte, "▁" is a space, and the leading spaces Decode drops
  // from a run's first piece (the dummy prefix) are dropped.
  std::string run_bytes(const std::vector<int>& run) const {
    static const std::string kSpace = "\xE2\x96\x81";  // "▁"
    std::string out;
    for (size_t k = 0; k < run.size(); ++k) {
      const int id = run[k];
      if (sp_->IsByte(id)) {
        const std::string piece = sp_->IdToPiece(id);  // "<0xAB>"
        out.push_back(static_cast<char>(std::stoi(piece.substr(3, 2), nullptr, 16)));
        continue;
      }
      std::string piece = sp_->IdToPiece(id);
      std::string mapped;
      for (size_t i = 0; i < piece.size();) {
        if (piece.compare(i, kSpace.size(), kSpace) == 0) {
          mapped += ' ';
          i += kSpace.size();
        } else {
          mapped += piece[i++];
        }
      }
      if (k == 0) {
        std::string alone;
        const auto status = sp_->Decode(std::vector<int>{id}, &alone);
        if (!status.ok()) throw std::runtime_error("tokenizer decode failed: " + status.ToString());
        size_t drop = 0;
        while (drop < mapped.size() && mapped.size() - drop > alone.size() && mapped[drop] == ' ')
          ++drop;
        mapped.erase(0, drop);
      }
      out += mapped;
    }
    return out;
  }

  std::unique_ptr<sentencepiece::SentencePieceProcessor> sp_;
  bool add_bos_ = true;
  bool add_eos_ = false;
};

class HfJsonImpl final : public Tokenizer::Impl {
 public:
  HfJsonImpl(const std::string& json_path, const std::string& config_path)
      : tok_(json_path, config_path) {
    path = json_path;
  }
  std::vector<int32_t> encode(const std::string& text, const EncodeOptions& o) const override {
    return tok_.encode(text, o.add_special_tokens, o.split_special_tokens, o.literal_spans);
  }
  std::string decode(const std::vector<int32_t>& ids, bool skip_special) const override {
    return tok_.decode(ids, skip_special);
  }
  std::string decode_bytes(const std::vector<int32_t>& ids, bool skip_special) const override {
    return tok_.decode_bytes(ids, skip_special);
  }
  std::vector<int32_t> special_prefix() const override { return tok_.special_prefix(); }
  std::string id_to_piece(int32_t id) const override {
    check_id(id, vocab_size());
    return tok_.id_to_token(id);
  }
  int32_t piece_to_id(const std::string& piece) const override { return tok_.token_to_id(piece); }
  int32_t vocab_size() const override { return tok_.vocab_size(); }
  int32_t bos_id() const override { return tok_.bos_id(); }
  int32_t eos_id() const override { return tok_.eos_id(); }
  int32_t pad_id() const override { return tok_.pad_id(); }
  bool is_special(int32_t id) const override { return tok_.is_special(id); }
  std::string kind() const override { return "tokenizer.json"; }

 private:
  text::hf::HfTokenizer tok_;
};

}  // namespace

std::string Tokenizer::tokenizer_file_in(const std::string& dir) {
  for (const char* name : {"tokenizer.json", "tokenizer.model"}) {
    const std::filesystem::path p = std::filesystem::path(dir) / name;
    if (std::filesystem::is_regular_file(p)) return p.string();
  }
  return "";
}

bool Tokenizer::dir_has_tokenizer(const std::string& dir) {
  return !tokenizer_file_in(dir).empty();
}

Tokenizer::Tokenizer(const std::string& path) {
  namespace fs = std::filesystem;
  std::string file = path;
  if (fs::is_directory(path)) {
    file = tokenizer_file_in(path);
    if (file.empty()) {
      throw std::runtime_error("no tokenizer in " + path +
                               " (expected tokenizer.json or tokenizer.model)");
    }
  } else if (!fs::is_regular_file(path)) {
    throw std::runtime_error("tokenizer model " + path + " does not exist");
  }
  const std::string config = (fs::path(file).parent_path() / "tokenizer_config.json").string();
  const bool is_json = fs::path(file).extension() == ".json";
  try {
    if (is_json)
      impl_ = std::make_unique<HfJsonImpl>(file, config);
    else
      impl_ = std::make_unique<SentencePieceImpl>(file, config);
  } catch (const text::hf::TokenizerFileError& e) {
    throw std::runtime_error(std::string("cannot load tokenizer: ") + e.what());
  } catch (const std::bad_alloc&) {
    throw std::runtime_error("cannot load tokenizer " + file + ": out of memory");
  } catch (const nlohmann::json::exception& e) {
    throw std::runtime_error("cannot load tokenizer " + file + ": " + e.what());
  }
}

Tokenizer::~Tokenizer() = default;

std::vector<int32_t> Tokenizer::encode(const std::string& text,
                                       const EncodeOptions& options) const {
  return impl_->encode(text, options);
}

bool Tokenizer::exceeds_tokens(const std::string& text, int64_t limit,
                               const EncodeOptions& options) const {
  if (text.size() <= kCountPieceBytes) return false;  // encoding it whole is cheap
  int64_t count = 0, cuts = 0;
  EncodeOptions piece_options = options;
  for (size_t start = 0; start < text.size();) {
    size_t end = std::min(text.size(), start + kCountPieceBytes);
    if (end < text.size()) {
      // Before a space or newline in the piece's last quarter (a word then starts the next piece
      // as it would in the whole text), else at a character boundary.
      const size_t ws = text.find_last_of(" \n\t", end);
      if (ws != std::string::npos && ws > start + kCountPieceBytes * 3 / 4) {
        end = ws;
      } else {
        while (end > start + 1 && (static_cast<unsigned char>(text[end]) & 0xC0) == 0x80) --end;
      }
      ++cuts;
    }
    count +=
        static_cast<int64_t>(impl_->encode(text.substr(start, end - start), piece_options).size());
    piece_options.add_special_tokens = false;  // BOS/EOS once, with the first piece
    if (count > limit + kCountCutMargin * cuts) return true;
    start = end;
  }
  return false;
}

std::vector<std::vector<int32_t>> Tokenizer::encode_batch(const std::vector<std::string>& texts,
                                                          const EncodeOptions& options,
                                                          int num_threads) const {
  std::vector<std::vector<int32_t>> out(texts.size());
  size_t threads = num_threads > 0 ? static_cast<size_t>(num_threads)
                                   : std::max(1u, std::thread::hardware_concurrency());
  threads = std::min(threads, texts.size());
  if (threads <= 1) {
    for (size_t i = 0; i < texts.size(); ++i) out[i] = impl_->encode(texts[i], options);
    return out;
  }
  // Texts are taken one at a time from a shared counter, so uneven lengths balance out.
  std::atomic<size_t> next{0};
  std::exception_ptr error;
  std::mutex error_mu;
  auto work = [&] {
    try {
      for (size_t i = next++; i < texts.size(); i = next++)
        out[i] = impl_->encode(texts[i], options);
    } catch (...) {
      std::lock_guard<std::mutex> lock(error_mu);
      if (!error) error = std::current_exception();
      next = texts.size();
    }
  };
  std::vector<std::thread> pool;
  try {
    for (size_t t = 1; t < threads; ++t) pool.emplace_back(work);
  } catch (...) {  // no more threads: the ones started and this one finish the work
  }
  work();
  for (auto& t : pool) t.join();
  if (error) std::rethrow_exception(error);
  return out;
}

std::string Tokenizer::decode(const std::vector<int32_t>& ids, bool skip_special_tokens) const {
  return impl_->decode(ids, skip_special_tokens);
}
std::string Tokenizer::decode_generated(const std::vector<int32_t>& ids,
                                        bool skip_special_tokens) const {
  std::vector<int32_t> known;
  known.reserve(ids.size());
  for (int32_t id : ids) {
    if (id >= 0 && id < vocab_size()) known.push_back(id);
  }
  return decode(known, skip_special_tokens);
}
std::vector<int32_t> Tokenizer::special_prefix() const { return impl_->special_prefix(); }
std::string Tokenizer::decode_bytes(const std::vector<int32_t>& ids,
                                    bool skip_special_tokens) const {
  return impl_->decode_bytes(ids, skip_special_tokens);
}

std::string Tokenizer::appended_bytes(const std::vector<int32_t>& ids, size_t end, int32_t id,
                                      bool skip_special_tokens) const {
  // Decoders look at neighbours only (a run's first piece, a byte sequence): the last few ids
  // before `id` decide its bytes. A window whose text is empty (skipped special tokens) grows
  // back until it has text or reaches the start, so a leading-space rule sees the same first token.
  // Ids outside the vocabulary (a model's padded embedding rows) have no text: they are left out.
  constexpr size_t kContext = 4;
  const int32_t vocab = vocab_size();
  if (id < 0 || id >= vocab) return "";
  end = std::min(end, ids.size());
  std::vector<int32_t> window;
  std::string before;
  size_t begin = end;
  do {
    const size_t stop = begin;
    for (size_t taken = 0; begin > 0 && taken < kContext;) {
      const int32_t prev = ids[--begin];
      if (prev >= 0 && prev < vocab) ++taken;
    }
    std::vector<int32_t> more;
    for (size_t k = begin; k < stop; ++k) {
      if (ids[k] >= 0 && ids[k] < vocab) more.push_back(ids[k]);
    }
    window.insert(window.begin(), more.begin(), more.end());
    before = impl_->decode_bytes(window, skip_special_tokens);
  } while (before.empty() && begin > 0);
  window.push_back(id);
  const std::string after = impl_->decode_bytes(window, skip_special_tokens);
  size_t common = 0;
  while (common < before.size() && common < after.size() && before[common] == after[common])
    ++common;
  return after.substr(common);
}

std::string Tokenizer::id_to_piece(int32_t id) const { return impl_->id_to_piece(id); }
int32_t Tokenizer::piece_to_id(const std::string& piece) const { return impl_->piece_to_id(piece); }
int32_t Tokenizer::vocab_size() const { return impl_->vocab_size(); }
int32_t Tokenizer::bos_id() const { return impl_->bos_id(); }
int32_t Tokenizer::eos_id() const { return impl_->eos_id(); }
int32_t Tokenizer::pad_id() const { return impl_->pad_id(); }
bool Tokenizer::is_special(int32_t id) const { return impl_->is_special(id); }
std::string Tokenizer::kind() const { return impl_->kind(); }
const std::string& Tokenizer::path() const { return impl_->path; }

// DecodeStream: as tokenizers' DecodeStream, the ids since the last emitted boundary are decoded
// together (so decoders that look at neighbours, e.g. Metaspace's leading space, stay right) and
// the new text is what extends the previous decode, held back while it ends in U+FFFD.
DecodeStream::DecodeStream(const Tokenizer& tokenizer, bool skip_special_tokens)
    : tokenizer_(tokenizer), skip_special_(skip_special_tokens) {}

std::string DecodeStream::step(int32_t id) {
  static const std::string kReplacement = "\xEF\xBF\xBD";
  auto ends_with_replacement = [](const std::string& s) {
    return s.size() >= 3 && s.compare(s.size() - 3, 3, kReplacement) == 0;
  };
  if (id < 0 || id >= tokenizer_.vocab_size()) {
    throw std::invalid_argument("token id " + std::to_string(id) + " is out of range [0, " +
                                std::to_string(tokenizer_.vocab_size()) + ")");
  }
  ids_.push_back(id);
  const std::vector<int32_t> window(ids_.begin() + static_cast<std::ptrdiff_t>(prefix_start_),
                                    ids_.end());
  const std::string text = tokenizer_.decode(window, skip_special_);
  if (text.size() <= prefix_text_.size() || ends_with_replacement(text) ||
      text.compare(0, prefix_text_.size(), prefix_text_) != 0) {
    return "";
  }
  std::string fresh = text.substr(prefix_text_.size());
  // The next window starts at the ids just consumed: keep the last read ids as context.
  prefix_start_ = read_;
  read_ = ids_.size();
  const std::vector<int32_t> context(ids_.begin() + static_cast<std::ptrdiff_t>(prefix_start_),
                                     ids_.end());
  prefix_text_ = tokenizer_.decode(context, skip_special_);
  return fresh;
}

std::string DecodeStream::flush() {
  const std::vector<int32_t> window(ids_.begin() + static_cast<std::ptrdiff_t>(prefix_start_),
                                    ids_.end());
  const std::string text = tokenizer_.decode(window, skip_special_);
  std::string rest = text.size() > prefix_text_.size() ? text.substr(prefix_text_.size()) : "";
  prefix_start_ = read_ = ids_.size();
  prefix_text_.clear();
  return rest;
}

void Tokenizer::train(const std::string& corpus_path, const std::string& model_prefix,
                      int32_t vocab_size) {
  if (!std::filesystem::is_regular_file(corpus_path)) {
    throw std::runtime_error("tokenizer training corpus " + corpus_path + " does not exist");
  }
  if (vocab_size <= 0) {
    throw std::invalid_argument("tokenizer vocab_size must be positive (got " +
                                std::to_string(vocab_size) + ")");
  }
  // Identity normalization and kept whitespace (as Llama's tokenizer.model) make
  // decode(encode(text)) == text. Single-threaded, unshuffled, unsampled: deterministic output.
  const std::unordered_map<std::string, std::string> flags = {
      {"model_type", "bpe"},
      {"vocab_size", std::to_string(vocab_size)},
      {"byte_fallback", "true"},
      {"pad_id", "0"},
      {"unk_id", "1"},
      {"bos_id", "2"},
      {"eos_id", "3"},
      {"character_coverage", "1.0"},
      {"split_digits", "true"},
      {"normalization_rule_name", "identity"},
      {"remove_extra_whitespaces", "false"},
      {"allow_whitespace_only_pieces", "true"},
      {"input_sentence_size", "0"},
      {"shuffle_input_sentence", "false"},
      {"num_threads", "1"},
      {"minloglevel", "2"},
  };
  LineIterator lines(corpus_path);
  std::string model_bytes;
  const auto status = SpmLibrary::get().train_fn()(flags, &lines, &model_bytes);
  if (!status.ok()) {
    throw std::runtime_error("tokenizer training on " + corpus_path +
                             " failed: " + status.ToString());
  }
  if (lines.failed()) throw std::runtime_error("error reading tokenizer corpus " + corpus_path);

  auto sp = SpmLibrary::get().new_processor();
  const auto load_status = sp->LoadFromSerializedProto(model_bytes);
  if (!load_status.ok()) {
    throw std::runtime_error("trained tokenizer does not load: " + load_status.ToString());
  }
  crl::write_file_atomic(model_prefix + ".model", model_bytes);
  std::ostringstream vocab;
  for (int i = 0; i < sp->GetPieceSize(); ++i) {
    vocab << sp->IdToPiece(i) << "\t" << sp->GetScore(i) << "\n";
  }
  crl::write_file_atomic(model_prefix + ".vocab", vocab.str());
}

}  // namespace crl::text
