#include "engine/model/model_writer.h"

#include <ATen/CPUGeneratorImpl.h>
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>
#include <stdexcept>

#include "common/check.h"
#include "common/file_util.h"
#include "text/tokenizer.h"

namespace crl::engine {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() &&
         s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// splitmix64: a fully specified generator, so the corpus is the same on every platform
// (std:: distributions are implementation-defined).
class Rng {
 public:
  explicit Rng(uint64_t seed) : state_(seed) {}
  uint64_t next() {
    uint64_t z = (state_ += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  }
  // Uniform in [lo, hi] (the modulo bias is irrelevant here).
  int64_t range(int64_t lo, int64_t hi) {
    return lo + static_cast<int64_t>(next() % static_cast<uint64_t>(hi - lo + 1));
  }
  template <size_t N>
  const char* pick(const char* const (&items)[N]) {
    return items[next() % N];
  }

 private:
  uint64_t state_;
};

const char* const kNames[] = {"Alice", "Bob",   "Carol", "David", "Emma", "Frank",
                              "Grace", "Henry", "Ivy",   "Jack",  "Kate", "Leo"};
const char* const kAdjectives[] = {"small", "big",   "red",   "quiet", "happy",  "old",
                                   "young", "green", "quick", "lazy",  "bright", "dark"};
const char* const kNouns[] = {"cat",  "dog",   "bird", "tree",  "house", "river",
                              "book", "apple", "car",  "child", "table", "garden"};
const char* const kVerbs[] = {"sees",  "likes", "finds", "follows", "watches", "helps",
                              "holds", "moves", "reads", "paints",  "visits",  "builds"};
const char* const kPlaces[] = {"in the park", "at home",     "near the river", "on the hill",
                               "in the city", "by the door", "under the tree", "at school"};
const char* const kTimes[] = {"Today",     "Yesterday", "In the morning", "At night",
                              "On Monday", "Every day", "Later",          "Once upon a time"};
const char* const kItems[] = {"apples", "books", "coins", "pencils", "cookies", "stones"};

std::string sentence(Rng& rng) {
  std::ostringstream os;
  switch (rng.range(0, 5)) {
    case 0:
      os << "The " << rng.pick(kAdjectives) << " " << rng.pick(kNouns) << " " << rng.pick(kVerbs)
         << " the " << rng.pick(kNouns) << " " << rng.pick(kPlaces) << ".";
      break;
    case 1:
      os << rng.pick(kTimes) << ", " << rng.pick(kNames) << " " << rng.pick(kVerbs) << " a "
         << rng.pick(kAdjectives) << " " << rng.pick(kNouns) << ".";
      break;
    case 2: {
      const int64_t a = rng.range(1, 20), b = rng.range(1, 20);
      const char* item = rng.pick(kItems);
      os << rng.pick(kNames) << " has " << a << " " << item << " and gets " << b
         << " more. Now there are " << a + b << " " << item << ".";
      break;
    }
    case 3:
      os << "Is the " << rng.pick(kNouns) << " " << rng.pick(kAdjectives) << "? Yes, it is "
         << rng.pick(kAdjectives) << "!";
      break;
    case 4:
      os << "\"I like the " << rng.pick(kNouns) << ",\" said " << rng.pick(kNames) << "; \"it is "
         << rng.pick(kAdjectives) << " (and " << rng.pick(kAdjectives) << ").\"";
      break;
    default:
      os << rng.pick(kNames) << " and " << rng.pick(kNames) << " went " << rng.pick(kPlaces)
         << " with " << rng.range(2, 9) << " friends.";
      break;
  }
  return os.str();
}

std::string arithmetic(Rng& rng) {
  std::ostringstream os;
  const int64_t a = rng.range(0, 99), b = rng.range(0, 99);
  const int64_t x = rng.range(0, 12), y = rng.range(0, 12);
  switch (rng.range(0, 6)) {
    case 0:
      os << a << " + " << b << " = " << a + b;
      break;
    case 1:
      os << std::max(a, b) << " - " << std::min(a, b) << " = " << std::max(a, b) - std::min(a, b);
      break;
    case 2:
      os << x << " * " << y << " = " << x * y;
      break;
    case 3:
      os << "Question: what is " << a << " plus " << b << "? Answer: " << a + b;
      break;
    case 4:
      os << "Question: what is " << std::max(a, b) << " minus " << std::min(a, b)
         << "? Answer: " << std::max(a, b) - std::min(a, b);
      break;
    case 5:
      os << "Question: what is " << x << " times " << y << "? Answer: " << x * y;
      break;
    default: {
      const int64_t start = rng.range(1, 90);
      os << "Count:";
      for (int64_t i = 0; i < 6; ++i) os << " " << start + i << (i < 5 ? "," : ".");
      break;
    }
  }
  return os.str();
}

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::runtime_error("cannot open " + path + " for reading");
  std::ostringstream os;
  os << in.rdbuf();
  return os.str();
}

json token_or_null(const text::Tokenizer& tok, int32_t id) {
  return id >= 0 ? json(tok.id_to_piece(id)) : json(nullptr);
}

}  // namespace

NamedTensors random_init_weights(const ModelConfig& config, uint64_t seed, at::ScalarType dtype) {
  config.validate();
  at::Generator gen = at::detail::createCPUGenerator(seed);
  const double std_dev = 0.02;
  const double out_std = std_dev / std::sqrt(2.0 * static_cast<double>(config.num_layers));
  NamedTensors weights;
  for (const ParamSpec& spec : model_param_specs(config)) {
    const auto opts = at::TensorOptions().dtype(at::kFloat);
    at::Tensor t;
    if (ends_with(spec.name, "norm.weight")) {
      t = at::ones(spec.shape, opts);
    } else if (ends_with(spec.name, ".bias")) {
      t = at::zeros(spec.shape, opts);
    } else {
      const bool out_proj =
          ends_with(spec.name, "o_proj.weight") || ends_with(spec.name, "down_proj.weight");
      t = at::empty(spec.shape, opts).normal_(0.0, out_proj ? out_std : std_dev, gen);
    }
    weights.emplace_back(spec.name, t.to(dtype));
  }
  return weights;
}

std::string default_corpus_text() {
  Rng rng(20240601);
  std::string text;
  text.reserve(200 * 1024);
  // Every printable ASCII character, so that none of them needs byte fallback.
  std::string ascii;
  for (char c = ' '; c <= '~'; ++c) ascii += c;
  for (int i = 0; i < 4; ++i) text += ascii + "\n";
  int64_t line = 0;
  while (text.size() < 180 * 1024) {
    text += (line % 2 == 0) ? sentence(rng) : arithmetic(rng);
    text += '\n';
    ++line;
  }
  return text;
}

void write_model_dir(const std::string& dir, const ModelConfig& config, const NamedTensors& weights,
                     const std::string& tokenizer_source) {
  config.validate();
  std::map<std::string, std::vector<int64_t>> expected;
  for (const ParamSpec& spec : model_param_specs(config)) expected[spec.name] = spec.shape;
  std::map<std::string, bool> seen;
  for (const auto& [name, t] : weights) {
    auto it = expected.find(name);
    if (it == expected.end())
      CRL_INVALID("write_model_dir: '", name, "' is not a weight of this model");
    if (t.sizes().vec() != it->second) {
      CRL_INVALID("write_model_dir: weight '", name, "' has shape ", t.sizes(), ", expected ",
                  at::IntArrayRef(it->second));
    }
    if (seen[name]) CRL_INVALID("write_model_dir: weight '", name, "' appears twice");
    seen[name] = true;
  }
  for (const auto& kv : expected) {
    if (!seen[kv.first]) CRL_INVALID("write_model_dir: weight '", kv.first, "' is missing");
  }

  const text::Tokenizer tok(tokenizer_source);
  if (tok.vocab_size() > config.vocab_size) {
    CRL_INVALID("write_model_dir: tokenizer ", tok.path(), " has ", tok.vocab_size(),
                " pieces but the config's vocab_size is ", config.vocab_size);
  }
  // A real tokenizer directory is copied as it is: its config may name a BOS the tokenizer does
  // not add (Qwen: bos_token_id 151643, bos_token null) or an EOS list the tokenizer's eos_token
  // is not in (Llama-3-Instruct's first releases), so only the vocabulary size is checked.
  const bool copied_as_is = fs::is_directory(tokenizer_source);
  if (!copied_as_is && config.bos_token_id >= 0 && config.bos_token_id != tok.bos_id()) {
    CRL_INVALID("write_model_dir: config bos_token_id ", config.bos_token_id,
                " differs from the tokenizer's bos id ", tok.bos_id());
  }
  if (!copied_as_is && !config.eos_token_ids.empty() && tok.eos_id() >= 0 &&
      std::find(config.eos_token_ids.begin(), config.eos_token_ids.end(), tok.eos_id()) ==
          config.eos_token_ids.end()) {
    CRL_INVALID("write_model_dir: config eos_token_id does not include the tokenizer's eos id ",
                tok.eos_id());
  }

  fs::create_directories(dir);
  const fs::path root(dir);
  crl::write_file_atomic((root / "config.json").string(), model_config_to_json(config));

  json gen = {{"_from_model_config", true}};
  gen["bos_token_id"] = config.bos_token_id >= 0 ? json(config.bos_token_id) : json(nullptr);
  if (config.eos_token_ids.empty())
    gen["eos_token_id"] = nullptr;
  else if (config.eos_token_ids.size() == 1)
    gen["eos_token_id"] = config.eos_token_ids[0];
  else
    gen["eos_token_id"] = config.eos_token_ids;
  if (tok.pad_id() >= 0) gen["pad_token_id"] = tok.pad_id();
  crl::write_file_atomic((root / "generation_config.json").string(), gen.dump(2) + "\n");

  save_checkpoint(dir, weights);
  if (fs::is_directory(tokenizer_source)) {
    // A real tokenizer directory: its files as they are (template, added tokens, flags).
    const fs::path tok_file(tok.path());
    crl::write_file_atomic((root / tok_file.filename()).string(), read_file(tok.path()));
    for (const char* name : {"tokenizer_config.json", "special_tokens_map.json",
                             "chat_template.jinja", "generation_config.json"}) {
      const fs::path src = fs::path(tokenizer_source) / name;
      if (fs::is_regular_file(src))
        crl::write_file_atomic((root / name).string(), read_file(src.string()));
    }
    return;
  }
  crl::write_file_atomic((root / "tokenizer.model").string(), read_file(tokenizer_source));

  int32_t unk_id = -1;
  for (int32_t id = 0; id < tok.vocab_size() && unk_id < 0; ++id) {
    if (tok.is_special(id) && id != tok.bos_id() && id != tok.eos_id() && id != tok.pad_id()) {
      unk_id = id;
    }
  }
  json tok_config = {
      {"tokenizer_class", "LlamaTokenizer"},
      {"add_bos_token", config.bos_token_id >= 0},
      {"add_eos_token", false},
      {"bos_token", token_or_null(tok, tok.bos_id())},
      {"eos_token", token_or_null(tok, tok.eos_id())},
      {"pad_token", token_or_null(tok, tok.pad_id())},
      {"unk_token", token_or_null(tok, unk_id)},
      {"model_max_length", config.max_position_embeddings},
      {"clean_up_tokenization_spaces", false},
  };
  crl::write_file_atomic((root / "tokenizer_config.json").string(), tok_config.dump(2) + "\n");
}

}  // namespace crl::engine
