// BpeModel: Hugging Face's BPE model (tokenizers/src/models/bpe) re-done for speed in C++17.
//
// The results match the Rust code id for id, quirks included: the merge loop is word.rs's merge_all
// (a min-heap of (rank, position) over a linked list of symbols, an entry is stale unless the pair
// now at its position still merges into the same id), unknown characters go through byte_fallback
// and then unk_token exactly as model.rs's merge_word does (a pending unk is flushed only by a
// known character), and a merge is (a, b) -> a + b[len(continuing_subword_prefix):].
//
// What is ours: open-addressing hash tables for the vocab (string keys) and the merges (one 64-bit
// key per pair of ids), a direct table for the ids of one-character tokens below U+0800 (every
// byte-level alphabet), per-thread scratch buffers so that tokenize() does not allocate, and a
// cache of words shorter than 256 bytes split in mutex-guarded shards (a shard is emptied when
// full) instead of Rust's per-thread caches.
#include "text/hf/bpe_model.h"

#include <algorithm>
#include <cstring>
#include <mutex>

namespace crl::text::hf {

namespace {

// Words this long or longer are not cached (tokenizers' utils::cache::MAX_LENGTH).
constexpr size_t kMaxCachedWordBytes = 256;
constexpr int kCacheShardBits = 6;
constexpr size_t kCacheShards = size_t{1} << kCacheShardBits;
constexpr size_t kCacheSlotsPerShard = 4096;                       // a power of two
constexpr size_t kCacheEntriesPerShard = kCacheSlotsPerShard / 2;  // 131072 words in all
// Code points below this have their one-character token id in a direct table.
constexpr uint32_t kCharTableSize = 0x800;

uint64_t mix(uint64_t h) {
  h ^= h >> 32;
  h *= 0xd6e8feb86659fd93ull;
  h ^= h >> 32;
  return h;
}

uint64_t hash_bytes(std::string_view s) {
  const char* p = s.data();
  size_t n = s.size();
  uint64_t h = 0x9e3779b97f4a7c15ull ^ (n * 0xff51afd7ed558ccdull);
  while (n >= 8) {
    uint64_t v;
    std::memcpy(&v, p, 8);
    h = (h ^ v) * 0xbf58476d1ce4e5b9ull;
    h ^= h >> 29;
    p += 8;
    n -= 8;
  }
  if (n > 0) {
    uint64_t v = 0;
    std::memcpy(&v, p, n);
    h = (h ^ v) * 0xbf58476d1ce4e5b9ull;
    h ^= h >> 29;
  }
  return mix(h);
}

size_t table_size_for(size_t n) {
  size_t size = 16;
  while (size < 2 * n) size *= 2;
  return size;
}

// Length of the UTF-8 character at s[i]. Input is meant to be valid UTF-8 (Rust's &str); an invalid
// or truncated sequence counts as one byte so that every byte still reaches the vocab lookup.
size_t char_len(std::string_view s, size_t i) {
  const auto c = static_cast<uint8_t>(s[i]);
  size_t n;
  if (c < 0x80) return 1;
  if ((c & 0xe0) == 0xc0 && c >= 0xc2) {  // C0 and C1 would be overlong
    n = 2;
  } else if ((c & 0xf0) == 0xe0) {
    n = 3;
  } else if ((c & 0xf8) == 0xf0) {
    n = 4;
  } else {
    return 1;
  }
  if (i + n > s.size()) return 1;
  for (size_t k = 1; k < n; ++k) {
    if ((static_cast<uint8_t>(s[i + k]) & 0xc0) != 0x80) return 1;
  }
  return n;
}

// token -> id, open addressing with linear probing; keys live in `keys` (indexed by slot payload).
class StringIdMap {
 public:
  void build(const std::vector<std::string>& keys, const std::vector<int32_t>& ids) {
    keys_ = &keys;
    slots_.assign(table_size_for(keys.size()), Slot{0, -1, -1});
    mask_ = slots_.size() - 1;
    for (size_t k = 0; k < keys.size(); ++k) {
      const uint64_t h = hash_bytes(keys[k]);
      size_t i = h & mask_;
      while (slots_[i].key_index >= 0) {
        // A token listed twice (JSON objects should not, but may): the last one wins.
        if (slots_[i].hash == static_cast<uint32_t>(h >> 32) &&
            keys[slots_[i].key_index] == keys[k])
          break;
        i = (i + 1) & mask_;
      }
      slots_[i] = Slot{static_cast<uint32_t>(h >> 32), static_cast<int32_t>(k), ids[k]};
    }
  }

  int32_t find(std::string_view key) const {
    const uint64_t h = hash_bytes(key);
    const auto tag = static_cast<uint32_t>(h >> 32);
    for (size_t i = h & mask_;; i = (i + 1) & mask_) {
      const Slot& s = slots_[i];
      if (s.key_index < 0) return -1;
      if (s.hash == tag && (*keys_)[s.key_index] == key) return s.id;
    }
  }

 private:
  struct Slot {
    uint32_t hash;
    int32_t key_index;  // -1: empty
    int32_t id;
  };
  const std::vector<std::string>* keys_ = nullptr;
  std::vector<Slot> slots_;
  size_t mask_ = 0;
};

struct MergeInfo {
  uint32_t rank;
  int32_t new_id;
};

// (left id, right id) -> (rank, merged id), open addressing with linear probing.
class PairMap {
 public:
  static uint64_t key(int32_t left, int32_t right) {
    return (static_cast<uint64_t>(static_cast<uint32_t>(left)) << 32) |
           static_cast<uint32_t>(right);
  }

  void reserve(size_t n) {
    slots_.assign(table_size_for(n), Slot{kEmpty, {0, 0}});
    mask_ = slots_.size() - 1;
  }

  // Inserts or overwrites (a pair merged twice keeps its last rank, as collecting into a map does).
  void put(uint64_t k, MergeInfo v) {
    for (size_t i = mix(k) & mask_;; i = (i + 1) & mask_) {
      if (slots_[i].key == kEmpty || slots_[i].key == k) {
        slots_[i] = Slot{k, v};
        return;
      }
    }
  }

  const MergeInfo* find(int32_t left, int32_t right) const {
    const uint64_t k = key(left, right);
    for (size_t i = mix(k) & mask_;; i = (i + 1) & mask_) {
      const Slot& s = slots_[i];
      if (s.key == k) return &s.value;
      if (s.key == kEmpty) return nullptr;
    }
  }

 private:
  // Ids are below 2^31, so no pair has this key.
  static constexpr uint64_t kEmpty = ~uint64_t{0};
  struct Slot {
    uint64_t key;
    MergeInfo value;
  };
  std::vector<Slot> slots_;
  size_t mask_ = 0;
};

// Word -> ids for words shorter than kMaxCachedWordBytes, split into shards by hash, each guarded
// by a mutex; a full shard is emptied (the next words refill it).
class WordCache {
 public:
  bool lookup(std::string_view word, uint64_t h, std::vector<int32_t>& out) {
    Shard& shard = shards_[h >> (64 - kCacheShardBits)];
    const auto tag = static_cast<uint32_t>(h);
    std::lock_guard<std::mutex> lock(shard.mu);
    if (shard.slots.empty()) return false;
    for (size_t i = (h >> 8) & (kCacheSlotsPerShard - 1);;
         i = (i + 1) & (kCacheSlotsPerShard - 1)) {
      const Slot& s = shard.slots[i];
      if (s.key_len == kEmptyLen) return false;
      if (s.hash == tag && s.key_len == word.size() &&
          std::memcmp(shard.keys.data() + s.key_off, word.data(), word.size()) == 0) {
        const int32_t* ids = shard.ids.data() + s.ids_off;
        out.insert(out.end(), ids, ids + s.ids_len);
        return true;
      }
    }
  }

  void insert(std::string_view word, uint64_t h, const int32_t* ids, size_t n_ids) {
    if (n_ids > 0xffff) return;
    Shard& shard = shards_[h >> (64 - kCacheShardBits)];
    const auto tag = static_cast<uint32_t>(h);
    std::lock_guard<std::mutex> lock(shard.mu);
    if (shard.slots.empty() || shard.size >= kCacheEntriesPerShard) {
      shard.slots.assign(kCacheSlotsPerShard, Slot{0, 0, 0, kEmptyLen, 0});
      shard.keys.clear();
      shard.ids.clear();
      shard.size = 0;
    }
    size_t i = (h >> 8) & (kCacheSlotsPerShard - 1);
    for (;; i = (i + 1) & (kCacheSlotsPerShard - 1)) {
      const Slot& s = shard.slots[i];
      if (s.key_len == kEmptyLen) break;
      if (s.hash == tag && s.key_len == word.size() &&
          std::memcmp(shard.keys.data() + s.key_off, word.data(), word.size()) == 0) {
        return;  // another thread got there first
      }
    }
    shard.slots[i] =
        Slot{tag, static_cast<uint32_t>(shard.keys.size()), static_cast<uint32_t>(shard.ids.size()),
             static_cast<uint16_t>(word.size()), static_cast<uint16_t>(n_ids)};
    shard.keys.append(word.data(), word.size());
    shard.ids.insert(shard.ids.end(), ids, ids + n_ids);
    ++shard.size;
  }

 private:
  static constexpr uint16_t kEmptyLen = 0xffff;
  struct Slot {
    uint32_t hash;
    uint32_t key_off;
    uint32_t ids_off;
    uint16_t key_len;  // kEmptyLen: empty slot
    uint16_t ids_len;
  };
  struct Shard {
    std::mutex mu;
    std::vector<Slot> slots;  // allocated on the first insert
    std::string keys;
    std::vector<int32_t> ids;
    size_t size = 0;
  };
  Shard shards_[kCacheShards];
};

struct Symbol {
  int32_t id;
  int32_t prev;  // -1: none
  int32_t next;  // -1: none
  uint32_t len;  // bytes of the word it covers; 0 once merged into its left neighbour
};

struct QueuedMerge {
  uint64_t order;  // rank << 32 | position: smaller merges first, leftmost first on a tie
  int32_t new_id;
};

struct LaterMerge {
  bool operator()(const QueuedMerge& a, const QueuedMerge& b) const { return a.order > b.order; }
};

// Per-thread buffers reused by every tokenize() call.
struct Scratch {
  std::vector<Symbol> symbols;
  std::vector<QueuedMerge> heap;
  std::string piece;
};

Scratch& scratch() {
  static thread_local Scratch s;
  return s;
}

}  // namespace

struct BpeModel::Impl {
  JsonPath at;
  std::vector<std::string> keys;   // vocab tokens, in the order of the JSON object
  std::vector<int32_t> key_ids;    // their ids
  std::vector<int32_t> id_to_key;  // id -> index into keys, -1 when no token has the id
  StringIdMap vocab;
  PairMap merges;
  size_t num_merges = 0;
  std::vector<int32_t> char_ids;  // code point < kCharTableSize -> id of that one-char token, or -1
  int32_t byte_ids[256];          // byte -> id of "<0xAB>", or -1
  bool has_unk = false;
  std::string unk_token;
  int32_t unk_id = -1;
  std::string prefix;  // continuing_subword_prefix
  std::string suffix;  // end_of_word_suffix
  bool fuse_unk = false;
  bool byte_fallback = false;
  bool ignore_merges = false;
  mutable WordCache cache;

  int32_t char_id(std::string_view word, size_t pos, size_t len, bool first, bool last,
                  std::string& piece) const;
  // The symbols of `word` before merging (merge_word in model.rs, up to merge_all).
  void split_word(std::string_view word, Scratch& s) const;
  // Applies the merges to s.symbols and appends the surviving ids to `out` (word.rs merge_all).
  void merge_all(Scratch& s, std::vector<int32_t>& out) const;
};

int32_t BpeModel::Impl::char_id(std::string_view word, size_t pos, size_t len, bool first,
                                bool last, std::string& piece) const {
  const bool add_prefix = !first && !prefix.empty();
  const bool add_suffix = last && !suffix.empty();
  if (!add_prefix && !add_suffix) {
    const auto c0 = static_cast<uint8_t>(word[pos]);
    if (len == 1) return c0 < 0x80 ? char_ids[c0] : vocab.find(word.substr(pos, 1));
    if (len == 2)
      return char_ids[((c0 & 0x1f) << 6) | (static_cast<uint8_t>(word[pos + 1]) & 0x3f)];
    return vocab.find(word.substr(pos, len));
  }
  piece.clear();
  if (add_prefix) piece += prefix;
  piece.append(word.data() + pos, len);
  if (add_suffix) piece += suffix;
  return vocab.find(piece);
}

void BpeModel::Impl::split_word(std::string_view word, Scratch& s) const {
  std::vector<Symbol>& symbols = s.symbols;
  symbols.clear();
  auto add = [&symbols](int32_t id, uint32_t len) {
    const auto n = static_cast<int32_t>(symbols.size());
    if (n > 0) symbols.back().next = n;
    symbols.push_back(Symbol{id, n - 1, -1, len});
  };
  // A pending unk: flushed by the next known character (not by byte-fallback bytes) or at the end.
  bool unk_pending = false;
  uint32_t unk_len = 0;
  auto unk_token_id = [this]() {
    if (unk_id < 0) {
      throw TokenizerFileError(at.file + ": " + at.at("unk_token").path + ": unk_token \"" +
                               unk_token + "\" is not in the vocab");
    }
    return unk_id;
  };
  for (size_t pos = 0; pos < word.size();) {
    const size_t len = char_len(word, pos);
    const bool first = pos == 0;
    const bool last = pos + len == word.size();
    const int32_t id = char_id(word, pos, len, first, last, s.piece);
    if (id >= 0) {
      if (unk_pending) {
        add(unk_id, unk_len);
        unk_pending = false;
      }
      add(id, static_cast<uint32_t>(len));
      pos += len;
      continue;
    }
    if (byte_fallback) {
      // The bytes of the piece as looked up: continuing_subword_prefix and end_of_word_suffix
      // included.
      std::string_view piece = word.substr(pos, len);
      if ((!first && !prefix.empty()) || (last && !suffix.empty())) {
        s.piece.clear();
        if (!first) s.piece += prefix;
        s.piece.append(word.data() + pos, len);
        if (last) s.piece += suffix;
        piece = s.piece;
      }
      bool all = true;
      for (char b : piece) all = all && byte_ids[static_cast<uint8_t>(b)] >= 0;
      if (all) {
        for (char b : piece) add(byte_ids[static_cast<uint8_t>(b)], 1);
        pos += len;
        continue;
      }
    }
    if (has_unk) {
      if (unk_pending && fuse_unk) {
        unk_len += static_cast<uint32_t>(len);
      } else {
        if (unk_pending) add(unk_id, unk_len);
        unk_token_id();
        unk_pending = true;
        unk_len = static_cast<uint32_t>(len);
      }
    }
    // Without an unk_token the character is dropped.
    pos += len;
  }
  if (unk_pending) add(unk_id, unk_len);
}

void BpeModel::Impl::merge_all(Scratch& s, std::vector<int32_t>& out) const {
  std::vector<Symbol>& sym = s.symbols;
  const auto n = static_cast<int32_t>(sym.size());
  if (n >= 2) {
    std::vector<QueuedMerge>& heap = s.heap;
    heap.clear();
    for (int32_t i = 0; i + 1 < n; ++i) {
      if (const MergeInfo* m = merges.find(sym[i].id, sym[i + 1].id)) {
        heap.push_back(
            QueuedMerge{(uint64_t{m->rank} << 32) | static_cast<uint32_t>(i), m->new_id});
      }
    }
    std::make_heap(heap.begin(), heap.end(), LaterMerge());
    while (!heap.empty()) {
      std::pop_heap(heap.begin(), heap.end(), LaterMerge());
      const QueuedMerge top = heap.back();
      heap.pop_back();
      const auto pos = static_cast<int32_t>(top.order & 0xffffffffu);
      Symbol& cur = sym[pos];
      if (cur.len == 0 || cur.next == -1) continue;
      const int32_t next_pos = cur.next;
      const Symbol right = sym[next_pos];
      // A stale entry: the pair now at `pos` no longer merges into the same id.
      const MergeInfo* now = merges.find(cur.id, right.id);
      if (now == nullptr || now->new_id != top.new_id) continue;
      cur.id = top.new_id;
      cur.len += right.len;
      cur.next = right.next;
      sym[next_pos].len = 0;
      if (right.next >= 0) sym[right.next].prev = pos;
      if (cur.prev >= 0) {
        if (const MergeInfo* m = merges.find(sym[cur.prev].id, cur.id)) {
          heap.push_back(
              QueuedMerge{(uint64_t{m->rank} << 32) | static_cast<uint32_t>(cur.prev), m->new_id});
          std::push_heap(heap.begin(), heap.end(), LaterMerge());
        }
      }
      if (cur.next >= 0) {
        if (const MergeInfo* m = merges.find(cur.id, sym[cur.next].id)) {
          heap.push_back(
              QueuedMerge{(uint64_t{m->rank} << 32) | static_cast<uint32_t>(pos), m->new_id});
          std::push_heap(heap.begin(), heap.end(), LaterMerge());
        }
      }
    }
  }
  for (const Symbol& x : sym) {
    if (x.len != 0) out.push_back(x.id);
  }
}

BpeModel::BpeModel(const nlohmann::json& model, const JsonPath& at)
    : impl_(std::make_unique<Impl>()) {
  Impl& m = *impl_;
  m.at = at;
  if (!model.is_object()) at.fail(std::string("expected an object, found ") + model.type_name());
  // A model without "type" is read as BPE first by Hugging Face (the legacy untagged format).
  if (model.contains("type")) {
    const std::string type = get_type(model, at);
    if (type != "BPE") {
      at.at("type").fail("model type \"" + type + "\" is not supported (only BPE is)");
    }
  }
  if (auto it = model.find("dropout"); it != model.end() && !it->is_null()) {
    if (!it->is_number())
      at.at("dropout").fail(std::string("expected a number, found ") + it->type_name());
    const double p = it->get<double>();
    if (p < 0.0 || p > 1.0) at.at("dropout").fail("must lie in [0, 1]");
    if (p > 0.0)
      at.at("dropout").fail("BPE dropout is not supported (tokenization here is deterministic)");
  }
  m.has_unk = model.contains("unk_token") && !model["unk_token"].is_null();
  m.unk_token = get_string(model, "unk_token", at, "");
  m.prefix = get_string(model, "continuing_subword_prefix", at, "");
  m.suffix = get_string(model, "end_of_word_suffix", at, "");
  m.fuse_unk = get_bool(model, "fuse_unk", at, false);
  m.byte_fallback = get_bool(model, "byte_fallback", at, false);
  m.ignore_merges = get_bool(model, "ignore_merges", at, false);

  // vocab
  const JsonPath vocab_at = at.at("vocab");
  const nlohmann::json& vocab = require(model, "vocab", at);
  if (!vocab.is_object())
    vocab_at.fail(std::string("expected an object, found ") + vocab.type_name());
  m.keys.reserve(vocab.size());
  m.key_ids.reserve(vocab.size());
  int32_t max_id = -1;
  for (auto it = vocab.begin(); it != vocab.end(); ++it) {
    const nlohmann::json& v = it.value();
    // Ids index a table: far beyond the number of entries is a broken file, not a sparse vocab.
    const int64_t limit = static_cast<int64_t>(vocab.size()) + (int64_t{1} << 20);
    if (!v.is_number_integer() || v.get<int64_t>() < 0 || v.get<int64_t>() >= limit) {
      vocab_at.at(it.key()).fail("expected an id (an integer in [0, " + std::to_string(limit) +
                                 ")), found " + v.dump());
    }
    m.keys.push_back(it.key());
    m.key_ids.push_back(static_cast<int32_t>(v.get<int64_t>()));
    max_id = std::max(max_id, m.key_ids.back());
  }
  m.vocab.build(m.keys, m.key_ids);
  m.id_to_key.assign(static_cast<size_t>(max_id + 1), -1);
  for (size_t k = 0; k < m.keys.size(); ++k) m.id_to_key[m.key_ids[k]] = static_cast<int32_t>(k);
  m.unk_id = m.has_unk ? m.vocab.find(m.unk_token) : -1;

  m.char_ids.assign(kCharTableSize, -1);
  for (uint32_t cp = 0; cp < kCharTableSize; ++cp) {
    char buf[2];
    size_t n = 1;
    if (cp < 0x80) {
      buf[0] = static_cast<char>(cp);
    } else {
      buf[0] = static_cast<char>(0xc0 | (cp >> 6));
      buf[1] = static_cast<char>(0x80 | (cp & 0x3f));
      n = 2;
    }
    m.char_ids[cp] = m.vocab.find(std::string_view(buf, n));
  }
  for (int b = 0; b < 256; ++b) {
    static const char* kHex = "0123456789ABCDEF";
    const char token[] = {'<', '0', 'x', kHex[b >> 4], kHex[b & 15], '>'};
    m.byte_ids[b] = m.vocab.find(std::string_view(token, sizeof(token)));
  }

  // merges
  const JsonPath merges_at = at.at("merges");
  const nlohmann::json& merges = require(model, "merges", at);
  if (!merges.is_array())
    merges_at.fail(std::string("expected an array, found ") + merges.type_name());
  m.merges.reserve(merges.size());
  const bool pairs = !merges.empty() && merges[0].is_array();
  uint32_t rank = 0;
  std::string merged;
  for (size_t i = 0; i < merges.size(); ++i) {
    const nlohmann::json& e = merges[i];
    const JsonPath e_at = merges_at.at(i);
    std::string_view a, b;
    if (pairs) {
      if (!e.is_array() || e.size() != 2 || !e[0].is_string() || !e[1].is_string()) {
        e_at.fail("expected a pair of strings [\"a\", \"b\"] like the merges before it, found " +
                  e.dump());
      }
      a = e[0].get_ref<const std::string&>();
      b = e[1].get_ref<const std::string&>();
    } else {
      if (!e.is_string())
        e_at.fail("expected a string \"a b\" like the merges before it, found " + e.dump());
      const std::string& line = e.get_ref<const std::string&>();
      if (line.rfind("#version", 0) == 0) continue;  // a merges.txt header; it takes no rank
      const size_t space = line.find(' ');
      if (space == std::string::npos || line.find(' ', space + 1) != std::string::npos) {
        e_at.fail("expected two tokens separated by one space, found \"" + line + "\"");
      }
      a = std::string_view(line).substr(0, space);
      b = std::string_view(line).substr(space + 1);
    }
    const int32_t a_id = m.vocab.find(a);
    if (a_id < 0) e_at.fail("merge token \"" + std::string(a) + "\" is not in the vocab");
    const int32_t b_id = m.vocab.find(b);
    if (b_id < 0) e_at.fail("merge token \"" + std::string(b) + "\" is not in the vocab");
    if (b.size() < m.prefix.size()) {
      e_at.fail("merge token \"" + std::string(b) + "\" is shorter than continuing_subword_prefix");
    }
    merged.assign(a.data(), a.size());
    merged.append(b.data() + m.prefix.size(), b.size() - m.prefix.size());
    const int32_t new_id = m.vocab.find(merged);
    if (new_id < 0) e_at.fail("merged token \"" + merged + "\" is not in the vocab");
    m.merges.put(PairMap::key(a_id, b_id), MergeInfo{rank, new_id});
    ++rank;
  }
  m.num_merges = rank;
}

BpeModel::~BpeModel() = default;

void BpeModel::tokenize(std::string_view word, std::vector<int32_t>& out) const {
  if (word.empty()) return;
  const Impl& m = *impl_;
  if (m.ignore_merges) {
    const int32_t id = m.vocab.find(word);
    if (id >= 0) {
      out.push_back(id);
      return;
    }
  }
  const bool cacheable = word.size() < kMaxCachedWordBytes;
  uint64_t h = 0;
  if (cacheable) {
    h = hash_bytes(word);
    if (m.cache.lookup(word, h, out)) return;
  }
  Scratch& s = scratch();
  m.split_word(word, s);
  const size_t start = out.size();
  m.merge_all(s, out);
  if (cacheable) m.cache.insert(word, h, out.data() + start, out.size() - start);
}

int32_t BpeModel::token_to_id(std::string_view token) const { return impl_->vocab.find(token); }

const std::string* BpeModel::id_to_token(int32_t id) const {
  if (id < 0 || static_cast<size_t>(id) >= impl_->id_to_key.size()) return nullptr;
  const int32_t k = impl_->id_to_key[id];
  return k < 0 ? nullptr : &impl_->keys[k];
}

int32_t BpeModel::vocab_size() const { return static_cast<int32_t>(impl_->id_to_key.size()); }

int32_t BpeModel::unk_id() const { return impl_->unk_id; }

}  // namespace crl::text::hf
