#include "engine/tokenizer.h"

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

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <sstream>
#include <stdexcept>
#include <unordered_map>

#include "common/file_util.h"

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

namespace crl::engine {
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

struct Tokenizer::Impl {
  std::unique_ptr<sentencepiece::SentencePieceProcessor> sp;
  std::string path;
};

Tokenizer::Tokenizer(const std::string& model_path) : impl_(std::make_unique<Impl>()) {
  impl_->path = model_path;
  if (!std::filesystem::is_regular_file(model_path)) {
    throw std::runtime_error("tokenizer model " + model_path + " does not exist");
  }
  impl_->sp = SpmLibrary::get().new_processor();
  const auto status = impl_->sp->Load(model_path);
  if (!status.ok()) {
    throw std::runtime_error("cannot load tokenizer model " + model_path + ": " +
                             status.ToString());
  }
}

Tokenizer::~Tokenizer() = default;

std::vector<int32_t> Tokenizer::encode(const std::string& text) const {
  std::vector<int> ids;
  const auto status = impl_->sp->Encode(text, &ids);
  if (!status.ok()) throw std::runtime_error("tokenizer encode failed: " + status.ToString());
  return std::vector<int32_t>(ids.begin(), ids.end());
}

std::string Tokenizer::decode(const std::vector<int32_t>& ids, bool skip_special_tokens) const {
  const int32_t vocab = vocab_size();
  for (int32_t id : ids) {
    if (id < 0 || id >= vocab) {
      throw std::invalid_argument("token id " + std::to_string(id) + " is out of range [0, " +
                                  std::to_string(vocab) + ")");
    }
  }
  // Runs of ordinary ids are decoded together (so merges and byte pieces join up); special ids
  // are dropped, or rendered as their piece text when skip_special_tokens is false.
  std::string text;
  std::vector<int> run;
  auto flush = [&] {
    if (run.empty()) return;
    std::string part;
    const auto status = impl_->sp->Decode(run, &part);
    if (!status.ok()) throw std::runtime_error("tokenizer decode failed: " + status.ToString());
    text += part;
    run.clear();
  };
  for (int32_t id : ids) {
    if (is_special(id)) {
      if (skip_special_tokens) continue;
      flush();
      text += impl_->sp->IdToPiece(id);
    } else {
      run.push_back(id);
    }
  }
  flush();
  return text;
}

std::string Tokenizer::id_to_piece(int32_t id) const {
  if (id < 0 || id >= vocab_size()) {
    throw std::invalid_argument("token id " + std::to_string(id) + " is out of range [0, " +
                                std::to_string(vocab_size()) + ")");
  }
  return impl_->sp->IdToPiece(id);
}

int32_t Tokenizer::vocab_size() const { return impl_->sp->GetPieceSize(); }
int32_t Tokenizer::bos_id() const { return impl_->sp->bos_id(); }
int32_t Tokenizer::eos_id() const { return impl_->sp->eos_id(); }
int32_t Tokenizer::pad_id() const { return impl_->sp->pad_id(); }

bool Tokenizer::is_special(int32_t id) const {
  if (id < 0 || id >= vocab_size()) return false;
  return impl_->sp->IsControl(id) || impl_->sp->IsUnknown(id);
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

}  // namespace crl::engine
