// CPU reference kernels for paged attention (contract in kv/paged_attention.h). Inputs were
// validated by the dispatcher in paged_attention.cpp.
//
// This is the decode hot loop. It is built with -O3 -march=native -ffp-contract=off (see
// kv/CMakeLists.txt): the inner loops run over head_dim or over fixed 16-lane chunks so GCC
// vectorizes them without reassociating sums. Every (row, kv head) work item is computed by the
// same code in the same order whatever the batch or thread count, so results are batch-invariant
// and thread-count-invariant bit for bit.
//
// Threads: with libtorch's OpenMP backend, at::parallel_for expands `#pragma omp parallel` inline
// in this file, so the work items run in parallel only when this file is compiled with -fopenmp;
// without it they run serially (still correct).
#include <ATen/Parallel.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <limits>
#include <type_traits>
#include <vector>

#include "common/cephes_exp.h"
#include "kv/paged_attention.h"

namespace crl::kv::detail {

namespace {

constexpr int64_t kTile = 32;   // context positions scored per online-softmax update
constexpr int64_t kLanes = 16;  // partial sums per dot product (one AVX-512 or two AVX vectors)

// exp(x) for x <= 0 (a score minus its running max): exp_cephes (common/cephes_exp.h). Branch-free
// so loops over it vectorize; returns exactly 0 below -80 (terms that small vanish next to the max
// term, whose weight is 1), and for -inf.
inline float exp_nonpositive(float x) {
  const bool underflow = x < -80.0f;
  float e = underflow ? -80.0f : x;
  exp_cephes(e);
  return underflow ? 0.0f : e;
}

// Copies n values as float into dst (bfloat16 is widened exactly).
inline void to_float(const float* __restrict src, float* __restrict dst, int64_t n) {
  std::memcpy(dst, src, n * sizeof(float));
}
inline void to_float(const c10::BFloat16* __restrict src, float* __restrict dst, int64_t n) {
  const uint16_t* s = reinterpret_cast<const uint16_t*>(src);
  for (int64_t i = 0; i < n; ++i) {
    const uint32_t u = static_cast<uint32_t>(s[i]) << 16;
    std::memcpy(dst + i, &u, sizeof(u));
  }
}

// acc[d] += (w[0] * v[0][d] + w[1] * v[1][d]) + (w[2] * v[2][d] + w[3] * v[3][d]) for d < n.
// Kept out of line: inlined into the loop over positions, GCC vectorizes across positions with
// gathers instead of along d.
__attribute__((noinline)) void accumulate4(float* __restrict acc, const float* const* v,
                                           const float* w, int64_t n) {
  const float* __restrict v0 = v[0];
  const float* __restrict v1 = v[1];
  const float* __restrict v2 = v[2];
  const float* __restrict v3 = v[3];
  const float w0 = w[0], w1 = w[1], w2 = w[2], w3 = w[3];
  for (int64_t d = 0; d < n; ++d) {
    acc[d] += (w0 * v0[d] + w1 * v1[d]) + (w2 * v2[d] + w3 * v3[d]);
  }
}

inline void store(float x, float* dst) { *dst = x; }
inline void store(float x, c10::BFloat16* dst) { *dst = c10::BFloat16(x); }

// Max and sum of a kTile row with 8 interleaved partials and a fixed tree (vectorizable).
inline float tile_max(const float* s) {
  float mx[8];
  for (int l = 0; l < 8; ++l) mx[l] = s[l];
  for (int64_t c = 8; c < kTile; c += 8) {
    for (int l = 0; l < 8; ++l) mx[l] = mx[l] < s[c + l] ? s[c + l] : mx[l];
  }
  for (int w = 4; w > 0; w /= 2) {
    for (int l = 0; l < w; ++l) mx[l] = mx[l] < mx[l + w] ? mx[l + w] : mx[l];
  }
  return mx[0];
}
inline float tile_sum(const float* s) {
  float sm[8] = {};
  for (int64_t c = 0; c < kTile; c += 8) {
    for (int l = 0; l < 8; ++l) sm[l] += s[c + l];
  }
  for (int w = 4; w > 0; w /= 2) {
    for (int l = 0; l < w; ++l) sm[l] += sm[l + w];
  }
  return sm[0];
}

template <typename T>
struct AttentionArgs {
  const T* q;        // [num_rows, num_heads, head_dim]
  const T* k_cache;  // [num_blocks, block_size, num_kv_heads, head_dim]
  const T* v_cache;
  T* out;                       // [num_rows, num_heads, head_dim]
  const int32_t* query_start;   // [num_seqs + 1]
  const int32_t* context_lens;  // [num_seqs]
  const int32_t* block_tables;  // [num_seqs, max_blocks]
  const int32_t* row_seq;       // [num_rows]: sequence of each row
  int64_t num_heads, num_kv_heads, group, head_dim, block_size, max_blocks;
  float scale;
};

// Brings a cache row pair into the cache ahead of its use: rows are scattered over blocks.
template <typename T>
inline void prefetch_rows(const T* k_row, const T* v_row, int64_t row_bytes) {
  const char* k_line = reinterpret_cast<const char*>(k_row);
  const char* v_line = reinterpret_cast<const char*>(v_row);
  for (int64_t b = 0; b < row_bytes; b += 64) {
    __builtin_prefetch(k_line + b);
    __builtin_prefetch(v_line + b);
  }
}

// Lane partials of one K row against each of the `groups` queries ([groups, hp]): query h's kLanes
// partials go to out[h * kTile * kLanes].
__attribute__((always_inline)) inline void dot_lanes(const float* __restrict q,
                                                     const float* __restrict krow, int64_t groups,
                                                     int64_t hp, float* out) {
  for (int64_t h = 0; h < groups; ++h) {
    const float* __restrict qh = q + h * hp;
    float p[kLanes] = {};
    for (int64_t c = 0; c < hp; c += kLanes) {
      for (int64_t j = 0; j < kLanes; ++j) p[j] += qh[c + j] * krow[c + j];
    }
    std::memcpy(out + h * kTile * kLanes, p, sizeof(p));
  }
}

// The fixed halving tree over each dot's kLanes partials: scores[r] = scale * sum of pt[r].
__attribute__((always_inline)) inline void reduce_lanes(float* __restrict pt, int64_t num_dots,
                                                        float scale, float* scores) {
  for (int64_t r = 0; r < num_dots; ++r) {
    for (int64_t j = 0; j < 8; ++j) pt[r * kLanes + j] += pt[r * kLanes + j + 8];
  }
  for (int64_t r = 0; r < num_dots; ++r) {
    for (int64_t j = 0; j < 4; ++j) pt[r * kLanes + j] += pt[r * kLanes + j + 4];
  }
  for (int64_t r = 0; r < num_dots; ++r) {
    const float* x = pt + r * kLanes;
    scores[r] = ((x[0] + x[2]) + (x[1] + x[3])) * scale;
  }
}

// Online softmax over one tile ([groups, kTile] scores, `cnt` of them real): folds the tile max
// into the running max m, rescales l and the accumulators, and turns the scores into weights.
__attribute__((always_inline)) inline void online_softmax(float* sc, int64_t cnt, int64_t groups,
                                                          int64_t hp, float* m, float* l,
                                                          float* acc) {
  for (int64_t h = 0; h < groups; ++h) {
    float* s = sc + h * kTile;
    for (int64_t i = cnt; i < kTile; ++i) s[i] = -std::numeric_limits<float>::infinity();
    const float m_new = std::max(m[h], tile_max(s));
    if (m_new != m[h]) {
      const float corr = exp_nonpositive(m[h] - m_new);
      l[h] *= corr;
      float* acc_h = acc + h * hp;
      for (int64_t d = 0; d < hp; ++d) acc_h[d] *= corr;
      m[h] = m_new;
    }
    for (int64_t i = 0; i < kTile; ++i) s[i] = exp_nonpositive(s[i] - m_new);
    l[h] += tile_sum(s);
  }
}

// Attention of work items [begin, end), item = row * num_kv_heads + kv_head: the `group` query
// heads of that kv head against positions [0, pos] of the row's sequence.
//
// Per tile of kTile positions (tiles start at multiples of kTile, so the reduction order depends
// only on the position): each K row is loaded once and dotted with every head of the group into
// kLanes partial sums (lane l takes d = l, l + 16, ...); the partials of the whole tile are then
// reduced by a fixed halving tree, so no horizontal sum stalls the dot loop. Softmax is online
// (running max m and sum l; the accumulator is rescaled when the max grows). The weighted V sum
// adds four positions per pass, in ascending order.
template <typename T, int64_t kHeadDim>
void attend_items(const AttentionArgs<T>& a, int64_t begin, int64_t end) {
  constexpr bool kIsFloat = std::is_same<T, float>::value;
  const int64_t g_size = a.group;
  // head_dim is a compile-time constant for the common sizes (kHeadDim > 0); hp pads it with zeros
  // to whole lanes.
  const int64_t hd = kHeadDim > 0 ? kHeadDim : a.head_dim;
  const int64_t hp = (hd + kLanes - 1) / kLanes * kLanes;
  const bool staged = !kIsFloat || hp != hd;  // rows are widened/padded into tile buffers
  std::vector<float> qf(g_size * hp, 0.0f);   // [group, hp] queries
  std::vector<float> acc(g_size * hp);        // [group, hp] unnormalized outputs
  std::vector<float> part(g_size * kTile * kLanes, 0.0f);  // [group, kTile, kLanes] dot partials
  std::vector<float> sc(g_size * kTile);                   // [group, kTile] scores, then weights
  std::vector<float> m(g_size), l(g_size);
  std::vector<float> kbuf(staged ? kTile * hp : 0, 0.0f);  // [kTile, hp] staged rows
  std::vector<float> vbuf(staged ? kTile * hp : 0, 0.0f);
  const std::vector<float> zero_row(hp, 0.0f);
  const float* k_rows[kTile];
  const float* v_rows[kTile];
  int64_t offs[kTile];
  const int64_t row_bytes = hd * static_cast<int64_t>(sizeof(T));

  for (int64_t item = begin; item < end; ++item) {
    const int64_t row = item / a.num_kv_heads;
    const int64_t kvh = item % a.num_kv_heads;
    const int64_t seq = a.row_seq[row];
    const int64_t q0 = a.query_start[seq];
    const int64_t q_len = a.query_start[seq + 1] - q0;
    const int64_t n = a.context_lens[seq] - q_len + (row - q0) + 1;  // attended positions
    const int32_t* table = a.block_tables + seq * a.max_blocks;

    for (int64_t h = 0; h < g_size; ++h) {
      to_float(a.q + (row * a.num_heads + kvh * g_size + h) * hd, qf.data() + h * hp, hd);
      m[h] = -std::numeric_limits<float>::infinity();
      l[h] = 0.0f;
    }
    std::fill(acc.begin(), acc.end(), 0.0f);

    // Element offsets of a tile's rows, walking the block table without divisions.
    auto tile_offsets = [&](int64_t p0, int64_t cnt) {
      int64_t block = p0 / a.block_size;
      int64_t in_block = p0 % a.block_size;
      for (int64_t i = 0; i < cnt; ++i) {
        const int64_t slot = int64_t{table[block]} * a.block_size + in_block;
        offs[i] = (slot * a.num_kv_heads + kvh) * hd;
        if (++in_block == a.block_size) {
          in_block = 0;
          ++block;
        }
      }
    };
    tile_offsets(0, std::min(kTile, n));
    for (int64_t p0 = 0; p0 < n; p0 += kTile) {
      const int64_t cnt = std::min(kTile, n - p0);
      for (int64_t i = 0; i < cnt; ++i) {
        if (staged) {
          // (a.head_dim, not the constant hd: a constant trip count gets this row loop unrolled
          // and the loop over i vectorized with gathers.)
          to_float(a.k_cache + offs[i], kbuf.data() + i * hp, a.head_dim);
          to_float(a.v_cache + offs[i], vbuf.data() + i * hp, a.head_dim);
          k_rows[i] = kbuf.data() + i * hp;
          v_rows[i] = vbuf.data() + i * hp;
        } else {
          k_rows[i] = reinterpret_cast<const float*>(a.k_cache + offs[i]);
          v_rows[i] = reinterpret_cast<const float*>(a.v_cache + offs[i]);
        }
      }
      // Cache rows are scattered over blocks: prefetch the next tile's rows while this tile is
      // scored, one row pair per position.
      const int64_t cnt_next = std::min(kTile, n - p0 - kTile);
      if (cnt_next > 0) tile_offsets(p0 + kTile, cnt_next);

      // Scores: lane partials (prefetching the next tile's rows), then one tree reduction.
      for (int64_t i = 0; i < cnt; ++i) {
        if (i < cnt_next) prefetch_rows(a.k_cache + offs[i], a.v_cache + offs[i], row_bytes);
        dot_lanes(qf.data(), k_rows[i], g_size, hp, part.data() + i * kLanes);
      }
      reduce_lanes(part.data(), g_size * kTile, a.scale, sc.data());
      online_softmax(sc.data(), cnt, g_size, hp, m.data(), l.data(), acc.data());

      // Weighted V sum, four positions per pass (padding rows are zeros with weight 0).
      const int64_t cnt4 = (cnt + 3) / 4 * 4;
      for (int64_t i = cnt; i < cnt4; ++i) v_rows[i] = zero_row.data();
      for (int64_t h = 0; h < g_size; ++h) {
        const float* w = sc.data() + h * kTile;
        float* acc_h = acc.data() + h * hp;
        for (int64_t i = 0; i < cnt4; i += 4) {
          accumulate4(acc_h, v_rows + i, w + i, hp);
        }
      }
    }

    for (int64_t h = 0; h < g_size; ++h) {
      T* dst = a.out + (row * a.num_heads + kvh * g_size + h) * hd;
      const float* acc_h = acc.data() + h * hp;
      const float denom = l[h];
      for (int64_t d = 0; d < hd; ++d) store(acc_h[d] / denom, dst + d);
    }
  }
}

template <typename T>
void run_attention(const at::Tensor& q, const at::Tensor& k_cache, const at::Tensor& v_cache,
                   const PagedAttentionMetadata& meta, double scale, at::Tensor& out) {
  const int64_t num_rows = q.size(0);
  const int64_t num_seqs = meta.context_lens.size(0);
  const int32_t* qs = meta.query_start.data_ptr<int32_t>();
  std::vector<int32_t> row_seq(num_rows);
  for (int64_t s = 0; s < num_seqs; ++s) {
    for (int64_t r = qs[s]; r < qs[s + 1]; ++r) row_seq[r] = static_cast<int32_t>(s);
  }
  AttentionArgs<T> a;
  a.q = q.data_ptr<T>();
  a.k_cache = k_cache.data_ptr<T>();
  a.v_cache = v_cache.data_ptr<T>();
  a.out = out.data_ptr<T>();
  a.query_start = qs;
  a.context_lens = meta.context_lens.data_ptr<int32_t>();
  a.block_tables = meta.block_tables.data_ptr<int32_t>();
  a.row_seq = row_seq.data();
  a.num_heads = q.size(1);
  a.num_kv_heads = k_cache.size(2);
  a.group = a.num_heads / a.num_kv_heads;
  a.head_dim = q.size(2);
  a.block_size = k_cache.size(1);
  a.max_blocks = meta.block_tables.size(1);
  a.scale = static_cast<float>(scale);
  at::parallel_for(0, num_rows * a.num_kv_heads, 1, [&](int64_t begin, int64_t end) {
    switch (a.head_dim) {
      case 32:
        return attend_items<T, 32>(a, begin, end);
      case 64:
        return attend_items<T, 64>(a, begin, end);
      case 128:
        return attend_items<T, 128>(a, begin, end);
      default:
        return attend_items<T, 0>(a, begin, end);
    }
  });
}

}  // namespace

at::Tensor paged_attention_cpu(const at::Tensor& q, const at::Tensor& k_cache,
                               const at::Tensor& v_cache, const PagedAttentionMetadata& meta,
                               double scale) {
  at::Tensor out = at::empty_like(q);
  if (q.scalar_type() == at::kBFloat16) {
    run_attention<c10::BFloat16>(q, k_cache, v_cache, meta, scale, out);
  } else {
    run_attention<float>(q, k_cache, v_cache, meta, scale, out);
  }
  return out;
}

void write_kv_cache_cpu(at::Tensor& k_cache, at::Tensor& v_cache, const at::Tensor& k,
                        const at::Tensor& v, const at::Tensor& slot_mapping) {
  // Serial on purpose: it is a few memcpys per token, and a duplicate slot keeps the last row.
  const int64_t row_bytes = k.size(1) * k.size(2) * static_cast<int64_t>(k.element_size());
  const int64_t* slots = slot_mapping.data_ptr<int64_t>();
  char* kc = static_cast<char*>(k_cache.data_ptr());
  char* vc = static_cast<char*>(v_cache.data_ptr());
  const char* ks = static_cast<const char*>(k.data_ptr());
  const char* vs = static_cast<const char*>(v.data_ptr());
  for (int64_t t = 0; t < k.size(0); ++t) {
    std::memcpy(kc + slots[t] * row_bytes, ks + t * row_bytes, row_bytes);
    std::memcpy(vc + slots[t] * row_bytes, vs + t * row_bytes, row_bytes);
  }
}

}  // namespace crl::kv::detail
