#include "engine/sampler.h"

#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <numeric>
#include <stdexcept>
#include <string>

#include "common/check.h"
#include "engine/kernels/sampling_kernels.h"

namespace crl::engine {
namespace {

using kernels::exp_pass;
using kernels::kNegInf;
using kernels::kSampleBlock;
using kernels::MaxScan;
using kernels::scan_max;
using kernels::sum_blocks;
using kernels::zero_below;
constexpr int64_t kBlock = kSampleBlock;
constexpr size_t kMaxListDraw = 2048;  // kept sets up to this size are drawn from a sorted id list

// Candidate keys: the high word is the value's float bits made monotone, the low word ~id, so
// descending keys read (value desc, id asc), and all keys are distinct.
inline uint64_t make_key(float v, int64_t id) {
  uint32_t bits;
  std::memcpy(&bits, &v, sizeof(bits));
  bits ^= static_cast<uint32_t>(static_cast<int32_t>(bits) >> 31) | 0x80000000u;
  return (static_cast<uint64_t>(bits) << 32) | (0xFFFFFFFFu - static_cast<uint32_t>(id));
}

inline int32_t key_id(uint64_t key) {
  return static_cast<int32_t>(0xFFFFFFFFu - static_cast<uint32_t>(key));
}

// The value of a key made from a non-negative float.
inline float key_value(uint64_t key) {
  const uint32_t bits = static_cast<uint32_t>(key >> 32) & 0x7FFFFFFFu;
  float v;
  std::memcpy(&v, &bits, sizeof(v));
  return v;
}

// Sum of the values of keys[0, n) (non-negative values), with four independent accumulators.
inline double sum_key_values(const uint64_t* k, size_t n) {
  double s0 = 0, s1 = 0, s2 = 0, s3 = 0;
  size_t i = 0;
  for (; i + 4 <= n; i += 4) {
    s0 += key_value(k[i]);
    s1 += key_value(k[i + 1]);
    s2 += key_value(k[i + 2]);
    s3 += key_value(k[i + 3]);
  }
  for (; i < n; ++i) s0 += key_value(k[i]);
  return (s0 + s1) + (s2 + s3);
}

// Keys over a buffer that only grows, so per-row use needs no re-initialisation.
struct KeyList {
  std::vector<uint64_t> buf;
  size_t n = 0;
  uint64_t* begin() { return buf.data(); }
  uint64_t* end() { return buf.data() + n; }
  void reset(size_t capacity) {
    if (buf.size() < capacity) buf.resize(capacity);
    n = 0;
  }
  double mass() const { return sum_key_values(buf.data(), n); }
};

struct Scratch {
  std::vector<float> masked, probs, block_max, block_max_masked, block_max_probs, sel;
  std::vector<double> block_sum;
  std::vector<int32_t> ids;
  std::vector<std::pair<int32_t, float>> banned_saved;  // banned ids' values before the ban
  KeyList keys, tmp;
};

Scratch& scratch() {
  thread_local Scratch s;
  return s;
}

// Replaces keys with those of the elements v_i >= tau (and v_i > 0 when positive_only), looking
// only into blocks whose maximum reaches tau: a prefix of the full key order.
void collect_keys(const float* v, int64_t n, const float* block_max, float tau, bool positive_only,
                  KeyList& keys) {
  keys.reset(n);
  uint64_t* out = keys.begin();
  size_t k = 0;
  const float floor = positive_only ? 0.0f : kNegInf;
  for (int64_t b = 0, start = 0; start < n; ++b, start += kBlock) {
    if (!(block_max[b] >= tau)) continue;
    const int64_t end = std::min(n, start + kBlock);
    for (int64_t i = start; i < end; ++i) {  // branch-free compaction
      out[k] = make_key(v[i], i);
      k += static_cast<size_t>(v[i] >= tau) & static_cast<size_t>(v[i] > floor || !positive_only);
    }
  }
  keys.n = k;
}

// A tau such that at least `count` elements are >= tau and they carry at least need_mass (values
// non-negative), certified from block maxima alone; -inf when they cannot certify one.
float certified_threshold(const float* block_max, int64_t nb, int64_t count, double need_mass,
                          std::vector<float>& sel) {
  if (count > nb) return kNegInf;
  if (need_mass > 0 && std::accumulate(block_max, block_max + nb, 0.0) < need_mass) {
    return kNegInf;
  }
  sel.assign(block_max, block_max + nb);
  double mass = 0;
  for (int64_t done = 0, c = std::min(nb, std::max<int64_t>(count, 64));; c = std::min(nb, c * 4)) {
    if (c < nb) std::nth_element(sel.begin() + done, sel.begin() + c, sel.end(), std::greater<>());
    std::sort(sel.begin() + done, sel.begin() + c, std::greater<>());
    for (int64_t j = done; j < c; ++j) {
      mass += sel[j];
      if (j + 1 >= count && mass >= need_mass) return sel[j];
    }
    if (c == nb) return kNegInf;
    done = c;
  }
}

// Keeps the k largest keys, in no particular order.
void keep_top_k(KeyList& keys, int64_t k) {
  if (static_cast<int64_t>(keys.n) <= k) return;
  std::nth_element(keys.begin(), keys.begin() + k, keys.end(), std::greater<>());
  keys.n = k;
}

// Nucleus cut over keys of non-negative values: keeps, in key order, each key whose predecessors'
// mass is below target. A mass-weighted quickselect (median-of-three pivots, branch-free
// partition through tmp) finds the cut in expected linear time. Keys are reordered.
void cut_nucleus(KeyList& keys, KeyList& tmp, double target) {
  uint64_t* k = keys.begin();
  tmp.reset(keys.n);
  uint64_t* t = tmp.begin();
  size_t lo = 0;
  size_t hi = keys.n;
  double above = 0;  // mass of k[0, lo), all ranked above k[lo, hi); k[hi, n) ranks below
  while (hi - lo > 32) {
    const uint64_t a = k[lo], b = k[lo + (hi - lo) / 2], c = k[hi - 1];
    const uint64_t pivot = std::max(std::min(a, b), std::min(std::max(a, b), c));
    size_t up = lo;
    size_t down = hi;
    for (size_t i = lo; i < hi; ++i) {  // keys >= pivot to the front, the rest to the back
      const uint64_t key = k[i];
      const bool is_up = key >= pivot;
      t[up] = key;
      t[down - 1] = key;
      up += is_up;
      down -= !is_up;
    }
    std::memcpy(k + lo, t + lo, (hi - lo) * sizeof(uint64_t));
    // Keys are distinct, so the median of three leaves both sides non-empty.
    const double upper_mass = sum_key_values(k + lo, up - lo);
    if (above + upper_mass >= target) {
      hi = up;
    } else {
      above += upper_mass;
      lo = up;
    }
  }
  std::sort(k + lo, k + hi, std::greater<>());
  keys.n = hi;
  for (size_t j = lo; j < hi; ++j) {
    if (above >= target) {
      keys.n = j;
      break;
    }
    above += key_value(k[j]);
  }
}

// An estimate of the filters' cut value from a strided sample of about 4096 probabilities: half
// the smallest value of the sample's nucleus (top_p < 1) or of its share of the top `count`.
float sampled_threshold(const float* q, int64_t n, int64_t count, double top_p, Scratch& s) {
  const int64_t stride = std::max<int64_t>(1, n / 4096);
  s.keys.reset(n / stride + 1);
  double mass = 0;
  for (int64_t i = 0; i < n; i += stride) {
    if (q[i] > 0.0f) {
      s.keys.buf[s.keys.n++] = make_key(q[i], i);
      mass += q[i];
    }
  }
  if (s.keys.n == 0) return 0.0f;
  if (top_p < 1.0) {
    cut_nucleus(s.keys, s.tmp, (top_p + (1.0 - top_p) / 2) * mass);
  } else {
    keep_top_k(s.keys, 2 * count / stride + 1);
  }
  return 0.5f * key_value(*std::min_element(s.keys.begin(), s.keys.end()));
}

// Collects into s.keys a prefix (in key order) of the positive q that holds at least `count`
// tokens (or all) and mass >= need_mass, or else every q >= floor (a floor that later filters
// apply anyway; 0 for none). Block maxima certify peaked rows; flat rows start from a sampled
// estimate that is checked after collection.
void collect_candidates(const float* q, int64_t n, const float* block_max, int64_t count,
                        double need_mass, double top_p, float floor, Scratch& s) {
  const int64_t nb = (n + kBlock - 1) / kBlock;
  float tau = certified_threshold(block_max, nb, count, need_mass, s.sel);
  const bool certified = tau > kNegInf;
  if (!certified) tau = sampled_threshold(q, n, count, top_p, s);
  tau = std::max(tau, floor);
  for (int attempt = 0;; ++attempt) {
    collect_keys(q, n, block_max, tau, /*positive_only=*/true, s.keys);
    if (certified || tau <= floor || tau <= 0.0f) return;
    if (static_cast<int64_t>(s.keys.n) >= count && s.keys.mass() >= need_mass) return;
    tau = attempt == 0 ? std::max(tau * (1.0f / 64), floor) : floor;
  }
}

// Inverse-CDF draw over q[0, n) in ascending id order using the block sums (`mass` is their sum
// in order). Returns the last positive element when rounding leaves the walk short.
int64_t draw_from_blocks(const float* q, int64_t n, const double* block_sum, double mass,
                         double u) {
  const double target = u * mass;
  double cum = 0;
  int64_t last_block = -1;
  bool crossed = false;
  for (int64_t b = 0, start = 0; start < n; ++b, start += kBlock) {
    if (!(block_sum[b] > 0)) continue;
    last_block = b;
    if (cum + block_sum[b] > target) {
      crossed = true;
      break;
    }
    cum += block_sum[b];
  }
  CRL_CHECK(last_block >= 0, "empty distribution");
  int64_t last = -1;
  for (int64_t i = last_block * kBlock; i < std::min(n, (last_block + 1) * kBlock); ++i) {
    if (q[i] > 0.0f) {
      last = i;
      cum += q[i];
      if (crossed && cum > target) return i;
    }
  }
  return last;
}

// Draws from the kept set s.keys (a prefix of the key order over q, which may be zeroed below it);
// sets kept_mass to the kept set's unnormalised mass.
int64_t draw_from_keys(float* q, int64_t v, double u, Scratch& s, double* kept_mass) {
  CRL_CHECK(s.keys.n > 0, "filters removed every token");
  if (s.keys.n > kMaxListDraw) {
    const int32_t id_min = key_id(*std::min_element(s.keys.begin(), s.keys.end()));
    zero_below(q, v, q[id_min], id_min);
    *kept_mass = sum_blocks(q, v, s.block_sum.data());
    return draw_from_blocks(q, v, s.block_sum.data(), *kept_mass, u);
  }
  s.ids.clear();
  for (const uint64_t* it = s.keys.begin(); it != s.keys.end(); ++it) s.ids.push_back(key_id(*it));
  std::sort(s.ids.begin(), s.ids.end());
  double mass = 0;
  for (int32_t id : s.ids) mass += q[id];
  *kept_mass = mass;
  const double target = u * mass;
  double cum = 0;
  for (int32_t id : s.ids) {
    cum += q[id];
    if (cum > target) return id;
  }
  return s.ids.back();
}

void check_row(const MaxScan& scan, int64_t row) {
  if (scan.has_nan || !std::isfinite(scan.max)) {
    throw std::runtime_error("sampler: logits row " + std::to_string(row) +
                             (scan.has_nan ? " contains NaN" : " has no finite maximum"));
  }
}

// The k most likely tokens of a raw row, most likely first (ties by smaller id).
std::vector<std::pair<int32_t, float>> top_raw(const float* x, int64_t v, const float* block_max,
                                               double lse, int64_t k, Scratch& s) {
  std::vector<std::pair<int32_t, float>> out;
  k = std::min(k, v);
  if (k <= 0) return out;
  const float tau = certified_threshold(block_max, (v + kBlock - 1) / kBlock, k, 0.0, s.sel);
  collect_keys(x, v, block_max, tau, /*positive_only=*/false, s.keys);
  keep_top_k(s.keys, k);
  std::sort(s.keys.begin(), s.keys.end(), std::greater<>());
  out.reserve(k);
  for (const uint64_t* it = s.keys.begin(); it != s.keys.end(); ++it) {
    const int32_t id = key_id(*it);
    out.emplace_back(id, static_cast<float>(static_cast<double>(x[id]) - lse));
  }
  return out;
}

// Draws from the unnormalised processed distribution q (max 1) after top_k, top_p and min_p;
// sets kept_mass to the kept set's mass. `mass` is the sum of q (the block sums in order).
int64_t draw_filtered(float* q, int64_t v, double mass, double u, const SamplingParams& p,
                      Scratch& s, double* kept_mass) {
  const int64_t nb = (v + kBlock - 1) / kBlock;
  const bool use_top_k = p.top_k > 0 && p.top_k < v;
  const bool use_top_p = p.top_p < 1.0;
  const bool use_min_p = p.min_p > 0.0;
  *kept_mass = mass;
  if (!use_top_k && !use_top_p) {
    if (use_min_p) {
      zero_below(q, v, static_cast<float>(p.min_p), std::numeric_limits<int32_t>::max());
      *kept_mass = sum_blocks(q, v, s.block_sum.data());
    }
    return draw_from_blocks(q, v, s.block_sum.data(), *kept_mass, u);
  }
  s.block_max_probs.resize(nb);
  const float p_max = scan_max(q, v, s.block_max_probs.data()).max;
  const float thr = static_cast<float>(p.min_p * p_max);
  if (use_top_k) {
    collect_candidates(q, v, s.block_max_probs.data(), p.top_k, 0.0, 1.0, 0.0f, s);
    keep_top_k(s.keys, p.top_k);
  } else {  // only the nucleus is needed, and min_p drops everything below thr anyway
    collect_candidates(q, v, s.block_max_probs.data(), 1, p.top_p * mass, p.top_p,
                       use_min_p ? thr : 0.0f, s);
  }
  if (use_top_p) {
    // top_p renormalises over what top_k kept.
    cut_nucleus(s.keys, s.tmp, p.top_p * (use_top_k ? s.keys.mass() : mass));
  }
  if (use_min_p) {
    s.keys.n = std::remove_if(s.keys.begin(), s.keys.end(),
                              [thr](uint64_t key) { return key_value(key) < thr; }) -
               s.keys.begin();
  }
  return draw_from_keys(q, v, u, s, kept_mass);
}

SampleResult sample_row(const float* x, int64_t v, const SampleRow& row) {
  Scratch& s = scratch();
  const SamplingParams& p = *row.params;
  const int64_t nb = (v + kBlock - 1) / kBlock;
  s.block_max.resize(nb);
  const MaxScan raw = scan_max(x, v, s.block_max.data());
  check_row(raw, row.logits_row);

  // z: the row after its penalties, with banned ids at -inf unless that would leave nothing.
  const float* z = x;
  const float* z_block_max = s.block_max.data();
  float z_max = raw.max;
  const bool penalized_row = row.penalties != nullptr && !row.penalties->empty();
  if (penalized_row) {
    s.masked.assign(x, x + v);
    for (const PenaltyEntry& e : *row.penalties) {
      CRL_CHECK(e.id >= 0 && e.id < v, "penalized id ", e.id, " outside vocabulary of ", v);
      s.masked[e.id] = penalized(x[e.id], e);
    }
    s.block_max_masked.resize(nb);
    const MaxScan pen = scan_max(s.masked.data(), v, s.block_max_masked.data());
    z = s.masked.data();
    z_block_max = s.block_max_masked.data();
    z_max = pen.max;
  }
  if (row.banned != nullptr && !row.banned->empty()) {
    if (!penalized_row) s.masked.assign(x, x + v);
    s.banned_saved.clear();
    for (int32_t id : *row.banned) {
      CRL_CHECK(id >= 0 && id < v, "banned id ", id, " outside vocabulary of ", v);
      s.banned_saved.emplace_back(id, s.masked[id]);
      s.masked[id] = kNegInf;
    }
    s.block_max_masked.resize(nb);
    const MaxScan masked = scan_max(s.masked.data(), v, s.block_max_masked.data());
    if (masked.max > kNegInf) {
      z = s.masked.data();
      z_block_max = s.block_max_masked.data();
      z_max = masked.max;
    } else if (penalized_row) {  // everything banned: the penalized row, unbanned
      for (auto it = s.banned_saved.rbegin(); it != s.banned_saved.rend(); ++it) {
        s.masked[it->first] = it->second;
      }
      z_max = scan_max(s.masked.data(), v, s.block_max_masked.data()).max;
    }
  }

  const bool greedy = p.is_greedy();
  const bool fused = !greedy && p.temperature == 1.0 && z == x;  // q is the raw pass's exp
  if (!greedy) {
    s.probs.resize(v);
    s.block_sum.resize(nb);
  }
  float* q = s.probs.data();
  const double raw_sum = fused ? exp_pass(x, v, raw.max, 1.0f, q, s.block_sum.data())
                               : exp_pass(x, v, raw.max, 1.0f, nullptr, nullptr);
  const double lse = static_cast<double>(raw.max) + std::log(raw_sum);

  SampleResult res;
  if (greedy) {
    int64_t b = 0;
    while (z_block_max[b] != z_max) ++b;
    int64_t i = b * kBlock;
    while (z[i] != z_max) ++i;
    res.token = static_cast<int32_t>(i);
  } else {
    // Processed distribution q = exp((z - z_max) / T), unnormalised (its max is 1).
    const double inv_t = 1.0 / p.temperature;
    const float scale =
        static_cast<float>(std::min<double>(inv_t, std::numeric_limits<float>::max()));
    const double mass = fused ? raw_sum : exp_pass(z, v, z_max, scale, q, s.block_sum.data());
    const double u = sample_uniform(row.seed, row.sample_index, row.position);
    double kept_mass = 0;
    res.token = static_cast<int32_t>(draw_filtered(q, v, mass, u, p, s, &kept_mass));
    const double logp = (static_cast<double>(z[res.token]) - z_max) * inv_t - std::log(kept_mass);
    res.processed_logprob = static_cast<float>(std::min(0.0, logp));
  }
  res.raw_logprob = static_cast<float>(static_cast<double>(x[res.token]) - lse);
  if (p.logprobs > 0) res.top_logprobs = top_raw(x, v, s.block_max.data(), lse, p.logprobs, s);
  return res;
}

void check_logits(const at::Tensor& logits) {
  CRL_CHECK(logits.defined() && logits.dim() == 2, "logits must be [R, V]");
  CRL_CHECK(logits.scalar_type() == at::kFloat, "logits must be float32, got ",
            logits.scalar_type());
  CRL_CHECK(logits.device().is_cpu(), "logits must be on the CPU");
  CRL_CHECK(logits.size(1) > 0 && logits.size(1) < (int64_t{1} << 31),
            "vocabulary size out of range: ", logits.size(1));
}

inline uint64_t mix64(uint64_t z) {  // splitmix64 finaliser
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

}  // namespace

std::vector<PenaltyEntry> penalty_entries(const SamplingParams& p,
                                          const std::vector<int32_t>& tokens, int64_t prompt_len) {
  std::vector<PenaltyEntry> out;
  if (!p.has_penalties()) return out;
  // (id, generated count), sorted by id: prompt ids with count 0 and every generated id.
  std::vector<std::pair<int32_t, int32_t>> seen;
  seen.reserve(tokens.size());
  const int64_t n = static_cast<int64_t>(tokens.size());
  for (int64_t i = 0; i < n; ++i) seen.emplace_back(tokens[i], i >= prompt_len ? 1 : 0);
  std::sort(seen.begin(), seen.end());
  for (size_t i = 0; i < seen.size();) {
    const int32_t id = seen[i].first;
    int32_t count = 0;
    for (; i < seen.size() && seen[i].first == id; ++i) count += seen[i].second;
    PenaltyEntry e;
    e.id = id;
    e.rep = static_cast<float>(p.repetition_penalty);
    if (count > 0) {
      e.add = static_cast<float>(-(p.frequency_penalty * count + p.presence_penalty));
    }
    if (e.rep != 1.0f || e.add != 0.0f) out.push_back(e);
  }
  return out;
}

double sample_uniform(uint64_t seed, int32_t sample_index, int64_t position) {
  const uint64_t index = static_cast<uint32_t>(sample_index);
  uint64_t h = mix64(seed + 0x9E3779B97F4A7C15ull);
  h = mix64(h + 0xD1B54A32D192ED03ull * (index + 1));
  h = mix64(h + 0xAEF17502108EF2D9ull * (static_cast<uint64_t>(position) + 1));
  return static_cast<double>(h >> 11) * 0x1.0p-53;
}

std::vector<SampleResult> sample_tokens(const at::Tensor& logits,
                                        const std::vector<SampleRow>& rows) {
  check_logits(logits);
  const at::Tensor x = logits.contiguous();
  const int64_t num_rows = x.size(0);
  const int64_t v = x.size(1);
  for (const SampleRow& row : rows) {
    CRL_CHECK(row.params != nullptr, "SampleRow without params");
    CRL_CHECK(row.logits_row >= 0 && row.logits_row < num_rows, "logits_row ", row.logits_row,
              " outside [0, ", num_rows, ")");
  }
  const float* data = x.data_ptr<float>();
  std::vector<SampleResult> out(rows.size());
  at::parallel_for(0, static_cast<int64_t>(rows.size()), 1, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      out[r] = sample_row(data + rows[r].logits_row * v, v, rows[r]);
    }
  });
  return out;
}

namespace {

// Each row of `logits` ([R, V] float32) with its token, checked, its max scanned (the block maxima
// in s.block_max), rows in parallel: fn(r, row, v, scan, s).
template <typename Fn>
void for_each_token_row(const at::Tensor& logits, const std::vector<int32_t>& tokens,
                        const char* what, Fn fn) {
  check_logits(logits);
  const at::Tensor x = logits.contiguous();
  const int64_t num_rows = x.size(0);
  const int64_t v = x.size(1);
  CRL_CHECK(static_cast<int64_t>(tokens.size()) == num_rows, what, ": ", tokens.size(),
            " tokens for ", num_rows, " rows");
  for (int32_t t : tokens) CRL_CHECK(t >= 0 && t < v, "token ", t, " outside vocabulary of ", v);
  const float* data = x.data_ptr<float>();
  at::parallel_for(0, num_rows, 1, [&](int64_t begin, int64_t end) {
    Scratch& s = scratch();
    s.block_max.resize((v + kBlock - 1) / kBlock);
    for (int64_t r = begin; r < end; ++r) {
      const float* row = data + r * v;
      const MaxScan scan = scan_max(row, v, s.block_max.data());
      check_row(scan, r);
      fn(r, row, v, scan, s);
    }
  });
}

}  // namespace

std::vector<std::pair<float, std::vector<std::pair<int32_t, float>>>> token_logprobs(
    const at::Tensor& logits, const std::vector<int32_t>& tokens, int32_t k) {
  CRL_CHECK(k >= 0, "token_logprobs: k ", k);
  std::vector<std::pair<float, std::vector<std::pair<int32_t, float>>>> out(tokens.size());
  for_each_token_row(logits, tokens, "token_logprobs",
                     [&](int64_t r, const float* row, int64_t v, const MaxScan& scan, Scratch& s) {
                       const double lse =
                           scan.max + std::log(exp_pass(row, v, scan.max, 1.0f, nullptr, nullptr));
                       out[r].first = static_cast<float>(static_cast<double>(row[tokens[r]]) - lse);
                       out[r].second = top_raw(row, v, s.block_max.data(), lse, k, s);
                     });
  return out;
}

std::vector<float> tempered_logprobs(const at::Tensor& logits, const std::vector<int32_t>& tokens,
                                     double temperature) {
  CRL_CHECK(temperature > 0 && std::isfinite(temperature), "tempered_logprobs: temperature ",
            temperature, " must be > 0");
  std::vector<float> out(tokens.size());
  if (temperature == 1.0) {
    const auto raw = token_logprobs(logits, tokens, 0);
    for (size_t i = 0; i < raw.size(); ++i) out[i] = raw[i].first;
    return out;
  }
  // sample_row's processed arithmetic: q = exp((x - max) * scale) summed by exp_pass, then
  // (x[t] - max) / T - log(sum q), at most 0.
  const double inv_t = 1.0 / temperature;
  const float scale =
      static_cast<float>(std::min<double>(inv_t, std::numeric_limits<float>::max()));
  for_each_token_row(logits, tokens, "tempered_logprobs",
                     [&](int64_t r, const float* row, int64_t v, const MaxScan& scan, Scratch&) {
                       const double mass = exp_pass(row, v, scan.max, scale, nullptr, nullptr);
                       const double logp =
                           (static_cast<double>(row[tokens[r]]) - scan.max) * inv_t -
                           std::log(mass);
                       out[r] = static_cast<float>(std::min(0.0, logp));
                     });
  return out;
}

}  // namespace crl::engine
