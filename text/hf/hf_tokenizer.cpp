#include "text/hf/hf_tokenizer.h"

#include <utf8proc.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <limits>
#include <sstream>
#include <stdexcept>
#include <unordered_map>

#include "text/hf/bpe_model.h"
#include "text/hf/decoder.h"
#include "text/hf/json_path.h"
#include "text/hf/normalizer.h"
#include "text/hf/pre_tokenizer.h"

namespace crl::text::hf {

using json = nlohmann::json;

namespace {

json read_json(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw TokenizerFileError(path + ": cannot open");
  std::stringstream ss;
  ss << in.rdbuf();
  try {
    return json::parse(ss.str());
  } catch (const json::exception& e) {
    throw TokenizerFileError(path + ": not valid JSON: " + e.what());
  }
}

// The code point before byte `end` of `s` (-1 at the start).
int32_t last_code_point(std::string_view s, size_t end) {
  if (end == 0) return -1;
  size_t i = end - 1;
  while (i > 0 && (static_cast<uint8_t>(s[i]) & 0xC0) == 0x80) --i;
  utf8proc_int32_t cp = -1;
  utf8proc_iterate(reinterpret_cast<const utf8proc_uint8_t*>(s.data() + i),
                   static_cast<utf8proc_ssize_t>(end - i), &cp);
  return cp;
}

// The code point at byte `at` of `s` and its length (cp -1 at the end).
int32_t code_point_at(std::string_view s, size_t at, size_t* len) {
  if (at >= s.size()) {
    *len = 0;
    return -1;
  }
  utf8proc_int32_t cp = -1;
  const auto n = utf8proc_iterate(reinterpret_cast<const utf8proc_uint8_t*>(s.data() + at),
                                  static_cast<utf8proc_ssize_t>(s.size() - at), &cp);
  *len = n > 0 ? static_cast<size_t>(n) : 1;
  return cp;
}

// Rust regex's \w (Unicode word characters).
bool is_word_char(int32_t cp) {
  if (cp < 0) return false;
  if (cp < 128) return std::isalnum(cp) || cp == '_';
  switch (utf8proc_category(cp)) {
    case UTF8PROC_CATEGORY_LU:
    case UTF8PROC_CATEGORY_LL:
    case UTF8PROC_CATEGORY_LT:
    case UTF8PROC_CATEGORY_LM:
    case UTF8PROC_CATEGORY_LO:
    case UTF8PROC_CATEGORY_MN:
    case UTF8PROC_CATEGORY_MC:
    case UTF8PROC_CATEGORY_ME:
    case UTF8PROC_CATEGORY_ND:
    case UTF8PROC_CATEGORY_NL:
    case UTF8PROC_CATEGORY_PC:
      return true;
    default:
      return cp == 0x200C || cp == 0x200D;
  }
}

// Unicode White_Space (Rust regex's \s).
bool is_space_char(int32_t cp) {
  if (cp < 0) return false;
  if ((cp >= 0x09 && cp <= 0x0D) || cp == 0x20 || cp == 0x85 || cp == 0xA0 || cp == 0x1680 ||
      (cp >= 0x2000 && cp <= 0x200A) || cp == 0x2028 || cp == 0x2029 || cp == 0x202F ||
      cp == 0x205F || cp == 0x3000)
    return true;
  return false;
}

// A token added on top of the model's vocabulary (tokenizer.json "added_tokens").
struct AddedToken {
  std::string content;
  std::string normalized_content;  // content after the normalizer, for `normalized` tokens
  int32_t id = -1;
  bool single_word = false;
  bool lstrip = false;
  bool rstrip = false;
  bool normalized = false;
  bool special = false;
};

// Leftmost-longest literal matching over a byte trie (what tokenizers does with Aho-Corasick).
class LiteralMatcher {
 public:
  void add(const std::string& pattern, int32_t value) {
    if (pattern.empty()) return;
    if (nodes_.empty()) nodes_.emplace_back();
    int32_t node = 0;
    for (unsigned char c : pattern) {
      auto it = nodes_[node].next.find(c);
      if (it == nodes_[node].next.end()) {
        nodes_.emplace_back();
        const int32_t child = static_cast<int32_t>(nodes_.size() - 1);
        nodes_[node].next.emplace(c, child);
        node = child;
      } else {
        node = it->second;
      }
    }
    nodes_[node].value = value;
    first_bytes_[static_cast<unsigned char>(pattern[0])] = true;
  }
  bool empty() const { return nodes_.empty(); }

  // The leftmost match at or after `from`, longest among those starting there.
  bool find(std::string_view s, size_t from, size_t* begin, size_t* end, int32_t* value) const {
    for (size_t i = from; i < s.size(); ++i) {
      if (!first_bytes_[static_cast<unsigned char>(s[i])]) continue;
      int32_t node = 0;
      int32_t best = -1;
      size_t best_end = 0;
      for (size_t j = i; j < s.size(); ++j) {
        auto it = nodes_[node].next.find(static_cast<unsigned char>(s[j]));
        if (it == nodes_[node].next.end()) break;
        node = it->second;
        if (nodes_[node].value >= 0) {
          best = nodes_[node].value;
          best_end = j + 1;
        }
      }
      if (best >= 0) {
        *begin = i;
        *end = best_end;
        *value = best;
        return true;
      }
    }
    return false;
  }

 private:
  struct Node {
    std::unordered_map<unsigned char, int32_t> next;
    int32_t value = -1;
  };
  std::vector<Node> nodes_;
  bool first_bytes_[256] = {};
};

// One part of the input: an added token (token >= 0) or text still to tokenize.
struct Segment {
  std::string text;
  int32_t token = -1;  // index into added tokens
  bool at_start = false;
  size_t offset = 0;  // where `text` starts in the input (first pass only)
};

using Spans = std::vector<std::pair<size_t, size_t>>;

// Whether [begin, end) overlaps one of the sorted, disjoint `spans`.
bool overlaps(const Spans* spans, size_t begin, size_t end) {
  if (!spans) return false;
  auto it = std::upper_bound(spans->begin(), spans->end(),
                             std::make_pair(begin, std::numeric_limits<size_t>::max()));
  if (it != spans->begin() && std::prev(it)->second > begin) return true;
  return it != spans->end() && it->first < end;
}

// Post-processing of a single sequence: ids around the encoded text.
struct PostProcessor {
  std::vector<int32_t> prefix;
  std::vector<int32_t> suffix;
};

}  // namespace

struct HfTokenizer::Impl {
  std::string file;
  std::unique_ptr<Normalizer> normalizer;
  std::unique_ptr<PreTokenizer> pre_tokenizer;
  std::unique_ptr<BpeModel> model;
  std::unique_ptr<Decoder> decoder;
  PostProcessor post;
  std::vector<AddedToken> added;                       // in file order
  std::unordered_map<int32_t, size_t> added_by_id;     // id -> index in added
  std::unordered_map<std::string, int32_t> added_ids;  // content -> id
  LiteralMatcher raw_matcher;                          // tokens with normalized == false
  LiteralMatcher normalized_matcher;                   // tokens with normalized == true
  int32_t vocab_size = 0;

  // Splits `s` at the added tokens `matcher` finds (tokenizers' AddedVocabulary::find_matches).
  // Special tokens are skipped with `split_special`, and where they overlap `literal_spans`.
  void split_added(const std::string& s, bool at_start, const LiteralMatcher& matcher,
                   bool split_special, std::vector<Segment>& out,
                   const Spans* literal_spans = nullptr) const {
    if (matcher.empty() || s.empty()) {
      out.push_back({s, -1, at_start, 0});
      return;
    }
    size_t start_offset = 0;
    size_t from = 0;
    size_t begin = 0, end = 0;
    int32_t which = -1;
    while (matcher.find(s, from, &begin, &end, &which)) {
      from = end;
      const AddedToken& tok = added[static_cast<size_t>(which)];
      if (tok.special && (split_special || overlaps(literal_spans, begin, end))) continue;
      if (tok.single_word) {
        size_t len = 0;
        const bool start_space = begin == 0 || !is_word_char(last_code_point(s, begin));
        const bool stop_space = end == s.size() || !is_word_char(code_point_at(s, end, &len));
        if (!start_space || !stop_space) continue;
      }
      if (tok.lstrip) {
        size_t b = begin;
        while (b > 0 && is_space_char(last_code_point(s, b))) {
          --b;
          while (b > 0 && (static_cast<uint8_t>(s[b]) & 0xC0) == 0x80) --b;
        }
        begin = std::max(b, start_offset);
      }
      if (tok.rstrip) {
        size_t len = 0;
        while (end < s.size() && is_space_char(code_point_at(s, end, &len))) end += len;
      }
      if (start_offset < begin) {
        out.push_back({s.substr(start_offset, begin - start_offset), -1,
                       at_start && start_offset == 0, start_offset});
      }
      out.push_back({s.substr(begin, end - begin), which, at_start && begin == 0, begin});
      start_offset = end;
    }
    if (start_offset != s.size()) {
      out.push_back({s.substr(start_offset), -1, at_start && start_offset == 0, start_offset});
    }
  }

  void load_added_tokens(const json& root, const JsonPath& at) {
    auto it = root.find("added_tokens");
    if (it == root.end() || it->is_null()) return;
    const JsonPath list = at.at("added_tokens");
    if (!it->is_array()) list.fail("expected a list");
    for (size_t i = 0; i < it->size(); ++i) {
      const json& t = (*it)[i];
      const JsonPath p = list.at(i);
      AddedToken a;
      const json& id = require(t, "id", p);
      if (!id.is_number_integer() || id.get<int64_t>() < 0 || id.get<int64_t>() >= INT32_MAX)
        p.at("id").fail("expected a non-negative 32-bit integer");
      a.id = id.get<int32_t>();
      const json& content = require(t, "content", p);
      if (!content.is_string() || content.get<std::string>().empty())
        p.at("content").fail("expected a non-empty string");
      a.content = content.get<std::string>();
      a.single_word = get_bool(t, "single_word", p, false);
      a.lstrip = get_bool(t, "lstrip", p, false);
      a.rstrip = get_bool(t, "rstrip", p, false);
      a.special = get_bool(t, "special", p, false);
      a.normalized = get_bool(t, "normalized", p, !a.special);
      // tokenizers' add_tokens gives a token the model already has that id, not the file's.
      if (const int32_t in_model = model->token_to_id(a.content); in_model >= 0) a.id = in_model;
      a.normalized_content = a.content;
      if (a.normalized && normalizer) normalizer->normalize(a.normalized_content);
      added_by_id[a.id] = added.size();
      added_ids[a.content] = a.id;
      added.push_back(std::move(a));
    }
    for (size_t i = 0; i < added.size(); ++i) {
      const AddedToken& a = added[i];
      if (a.normalized)
        normalized_matcher.add(a.normalized_content, static_cast<int32_t>(i));
      else
        raw_matcher.add(a.content, static_cast<int32_t>(i));
    }
  }

  int32_t id_of(const std::string& token) const {
    auto it = added_ids.find(token);
    if (it != added_ids.end()) return it->second;
    return model->token_to_id(token);
  }

  // tokenizer.json's "post_processor" (single sequences only: what encode needs).
  PostProcessor parse_post_processor(const json& j, const JsonPath& at) const {
    PostProcessor p;
    if (j.is_null()) return p;
    const std::string type = get_type(j, at);
    if (type == "ByteLevel") return p;  // only trims offsets
    if (type == "TemplateProcessing") {
      const JsonPath single_at = at.at("single");
      const json& single = require(j, "single", at);
      if (!single.is_array()) single_at.fail("expected a list");
      const json& specials = require(j, "special_tokens", at);
      bool seen_sequence = false;
      for (size_t i = 0; i < single.size(); ++i) {
        const json& piece = single[i];
        const JsonPath pa = single_at.at(i);
        if (piece.is_object() && piece.contains("Sequence")) {
          seen_sequence = true;
          continue;
        }
        if (!piece.is_object() || !piece.contains("SpecialToken"))
          pa.fail("expected {\"Sequence\": ...} or {\"SpecialToken\": ...}");
        const JsonPath sa = pa.at("SpecialToken");
        const std::string name = get_string(piece["SpecialToken"], "id", sa, "");
        auto st = specials.find(name);
        if (st == specials.end())
          sa.at("id").fail("special token \"" + name + "\" is not in special_tokens");
        const JsonPath ids_at = at.at("special_tokens").at(name).at("ids");
        const json& ids = require(*st, "ids", at.at("special_tokens").at(name));
        if (!ids.is_array()) ids_at.fail("expected a list of ids");
        for (const json& id : ids) {
          if (!id.is_number_integer() || id.get<int64_t>() < 0 || id.get<int64_t>() >= INT32_MAX)
            ids_at.fail("expected a list of non-negative ids, found " + id.dump());
          (seen_sequence ? p.suffix : p.prefix).push_back(id.get<int32_t>());
        }
      }
      if (!seen_sequence) single_at.fail("the template has no {\"Sequence\": {\"id\": \"A\"}}");
      return p;
    }
    if (type == "RobertaProcessing" || type == "BertProcessing") {
      auto pair_id = [&](const char* key) {
        const json& v = require(j, key, at);
        if (!v.is_array() || v.size() != 2 || !v[1].is_number_integer() ||
            v[1].get<int64_t>() < 0 || v[1].get<int64_t>() >= INT32_MAX)
          at.at(key).fail("expected [token, id]");
        return v[1].get<int32_t>();
      };
      p.prefix = {pair_id("cls")};
      p.suffix = {pair_id("sep")};
      return p;
    }
    if (type == "Sequence") {
      const json& list = require(j, "processors", at);
      if (!list.is_array()) at.at("processors").fail("expected a list");
      for (size_t i = 0; i < list.size(); ++i) {
        PostProcessor inner = parse_post_processor(list[i], at.at("processors").at(i));
        p.prefix.insert(p.prefix.begin(), inner.prefix.begin(), inner.prefix.end());
        p.suffix.insert(p.suffix.end(), inner.suffix.begin(), inner.suffix.end());
      }
      return p;
    }
    at.at("type").fail("unsupported post-processor type \"" + type + "\"");
  }
};

namespace {

// bos_token / eos_token / pad_token of tokenizer_config.json: a string or {"content": ...}.
std::string config_token(const json& config, const char* key, const JsonPath& at) {
  auto it = config.find(key);
  if (it == config.end() || it->is_null()) return "";
  if (it->is_string()) return it->get<std::string>();
  if (it->is_object()) return get_string(*it, "content", at.at(key), "");
  at.at(key).fail("expected a string or {\"content\": ...}");
}

}  // namespace

HfTokenizer::HfTokenizer(const std::string& tokenizer_json, const std::string& tokenizer_config)
    : impl_(std::make_unique<Impl>()) {
  Impl& m = *impl_;
  m.file = tokenizer_json;
  const json root = read_json(tokenizer_json);
  const JsonPath at{tokenizer_json, ""};
  if (!root.is_object()) at.fail("expected an object");
  m.normalizer = make_normalizer(root.value("normalizer", json()), at.at("normalizer"));
  m.pre_tokenizer = make_pre_tokenizer(root.value("pre_tokenizer", json()), at.at("pre_tokenizer"));
  const json& model = require(root, "model", at);
  const std::string model_type = model.is_object() && model.contains("type")
                                     ? get_type(model, at.at("model"))
                                     : std::string("BPE");  // old files omit it
  if (model_type != "BPE") {
    at.at("model").at("type").fail("unsupported model type \"" + model_type +
                                   "\" (only BPE is supported)");
  }
  m.model = std::make_unique<BpeModel>(model, at.at("model"));
  m.decoder = make_decoder(root.value("decoder", json()), at.at("decoder"));
  m.load_added_tokens(root, at);
  m.post = m.parse_post_processor(root.value("post_processor", json()), at.at("post_processor"));

  m.vocab_size = m.model->vocab_size();
  for (const AddedToken& a : m.added) m.vocab_size = std::max(m.vocab_size, a.id + 1);
  for (const std::vector<int32_t>* ids : {&m.post.prefix, &m.post.suffix}) {
    for (int32_t id : *ids) {
      if (id >= m.vocab_size) {
        at.at("post_processor")
            .fail("special token id " + std::to_string(id) + " is outside the vocabulary [0, " +
                  std::to_string(m.vocab_size) + ")");
      }
    }
  }

  if (tokenizer_config.empty()) return;
  // tokenizer_config.json, with special_tokens_map.json beside it for tokens it does not name
  // (as transformers reads them).
  json config = json::object();
  const JsonPath cat{tokenizer_config, ""};
  if (std::ifstream(tokenizer_config)) {
    config = read_json(tokenizer_config);
    if (!config.is_object()) cat.fail("expected an object");
  }
  const std::string map_path =
      (std::filesystem::path(tokenizer_config).parent_path() / "special_tokens_map.json").string();
  json map = json::object();
  if (std::ifstream(map_path)) {
    map = read_json(map_path);
    if (!map.is_object()) JsonPath{map_path, ""}.fail("expected an object");
  }
  auto resolve = [&](const char* key, bool required) {
    const bool in_config = config.contains(key);
    const json& source = in_config ? config : map;
    const JsonPath at = in_config ? cat : JsonPath{map_path, ""};
    const std::string token = config_token(source, key, at);
    if (token.empty()) return -1;
    const int32_t id = m.id_of(token);
    // transformers adds an unknown pad token to the vocabulary; the engine never needs it.
    if (id < 0 && required) at.at(key).fail("token \"" + token + "\" is not in the vocabulary");
    return id;
  };
  bos_id_ = resolve("bos_token", true);
  eos_id_ = resolve("eos_token", true);
  pad_id_ = resolve("pad_token", false);
  // transformers' fast tokenizers rebuild the post-processor from these flags (a flag whose token
  // is missing is off).
  const bool has_bos_flag = config.contains("add_bos_token") && !config["add_bos_token"].is_null();
  const bool has_eos_flag = config.contains("add_eos_token") && !config["add_eos_token"].is_null();
  if (has_bos_flag || has_eos_flag) {
    const bool add_bos = get_bool(config, "add_bos_token", cat, false) && bos_id_ >= 0;
    const bool add_eos = get_bool(config, "add_eos_token", cat, false) && eos_id_ >= 0;
    m.post = PostProcessor{};
    if (add_bos) m.post.prefix.push_back(bos_id_);
    if (add_eos) m.post.suffix.push_back(eos_id_);
  }
}

const std::vector<int32_t>& HfTokenizer::special_prefix() const { return impl_->post.prefix; }

HfTokenizer::~HfTokenizer() = default;

std::vector<int32_t> HfTokenizer::encode(std::string_view text, bool add_special_tokens,
                                         bool split_special_tokens,
                                         const Spans* literal_spans) const {
  const Impl& m = *impl_;
  std::vector<int32_t> ids;
  if (add_special_tokens) ids = m.post.prefix;
  const std::string input(text);
  std::vector<Segment> raw;
  m.split_added(input, /*at_start=*/true, m.raw_matcher, split_special_tokens, raw, literal_spans);
  std::vector<Segment> parts;
  std::vector<Piece> pieces;
  for (Segment& seg : raw) {
    if (seg.token >= 0) {
      ids.push_back(m.added[static_cast<size_t>(seg.token)].id);
      continue;
    }
    parts.clear();
    // Normalizing moves offsets: a part with an untrusted range splits its normalized literals.
    const bool split_here =
        split_special_tokens || overlaps(literal_spans, seg.offset, seg.offset + seg.text.size());
    if (m.normalizer) m.normalizer->normalize(seg.text);
    m.split_added(seg.text, seg.at_start, m.normalized_matcher, split_here, parts);
    for (Segment& part : parts) {
      if (part.token >= 0) {
        ids.push_back(m.added[static_cast<size_t>(part.token)].id);
        continue;
      }
      pieces.clear();
      pieces.push_back(Piece{std::move(part.text), part.at_start});
      if (m.pre_tokenizer) m.pre_tokenizer->split(pieces);
      for (const Piece& p : pieces) {
        if (!p.text.empty()) m.model->tokenize(p.text, ids);
      }
    }
  }
  if (add_special_tokens) ids.insert(ids.end(), m.post.suffix.begin(), m.post.suffix.end());
  return ids;
}

std::string HfTokenizer::id_to_token(int32_t id) const {
  const Impl& m = *impl_;
  auto it = m.added_by_id.find(id);
  if (it != m.added_by_id.end()) return m.added[it->second].normalized_content;
  const std::string* t = m.model->id_to_token(id);
  return t ? *t : std::string();
}

std::string HfTokenizer::decode(const std::vector<int32_t>& ids, bool skip_special_tokens) const {
  return decode_as(ids, skip_special_tokens, /*raw_bytes=*/false);
}

std::string HfTokenizer::decode_bytes(const std::vector<int32_t>& ids,
                                      bool skip_special_tokens) const {
  return decode_as(ids, skip_special_tokens, /*raw_bytes=*/true);
}

std::string HfTokenizer::decode_as(const std::vector<int32_t>& ids, bool skip_special_tokens,
                                   bool raw_bytes) const {
  const Impl& m = *impl_;
  std::vector<std::string> tokens;
  tokens.reserve(ids.size());
  for (int32_t id : ids) {
    if (id < 0 || id >= m.vocab_size) {
      throw std::invalid_argument("token id " + std::to_string(id) + " is out of range [0, " +
                                  std::to_string(m.vocab_size) + ")");
    }
    auto it = m.added_by_id.find(id);
    if (it != m.added_by_id.end()) {
      const AddedToken& a = m.added[it->second];
      if (skip_special_tokens && a.special) continue;
      tokens.push_back(a.normalized_content);
      continue;
    }
    const std::string* t = m.model->id_to_token(id);
    if (t == nullptr) continue;
    // tokenizers drops a model token whose string is also a special added token's.
    if (skip_special_tokens) {
      auto a = m.added_ids.find(*t);
      if (a != m.added_ids.end() && m.added[m.added_by_id.at(a->second)].special) continue;
    }
    tokens.push_back(*t);
  }
  if (!m.decoder) {
    std::string out;
    for (size_t i = 0; i < tokens.size(); ++i) {
      if (i) out += ' ';
      out += tokens[i];
    }
    return out;
  }
  m.decoder->decode_chain(tokens, raw_bytes ? Decoder::Bytes::kRaw : Decoder::Bytes::kLossy);
  std::string out;
  for (const std::string& t : tokens) out += t;
  return out;
}

int32_t HfTokenizer::token_to_id(std::string_view token) const {
  return impl_->id_of(std::string(token));
}

int32_t HfTokenizer::vocab_size() const { return impl_->vocab_size; }

bool HfTokenizer::is_special(int32_t id) const {
  auto it = impl_->added_by_id.find(id);
  return it != impl_->added_by_id.end() && impl_->added[it->second].special;
}

}  // namespace crl::text::hf
