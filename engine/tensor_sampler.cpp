#include "engine/tensor_sampler.h"

#include <algorithm>
#include <cstring>
#include <limits>
#include <stdexcept>
#include <string>

#include "common/check.h"
#include "engine/kernels/cuda_ops.h"

namespace crl::engine {
namespace {

// The per-row parameters, one float64 row each (ids and counts are exact in a double).
enum Field : int64_t {
  kRow,      // logits row
  kScale,    // 1 / temperature, clamped to FLT_MAX as the CPU sampler's float scale; 1 if greedy
  kInvT,     // 1 / temperature unclamped (the processed log-prob); 1 if greedy
  kTopK,     // kept count after top_k (V when off)
  kTopP,     // top_p (1 when off)
  kMinP,     // min_p (0 when off)
  kUniform,  // the row's uniform in [0, 1)
  kGreedy,   // 1 for greedy rows
  kNumFields
};

// What the host knows about a batch of rows (decides which passes run) and the device tensors of
// their parameters, uploaded in one copy.
struct Plan {
  int64_t num_rows = 0;
  int64_t vocab = 0;
  bool identity_rows = true;  // row r samples logits row r
  bool any_sampled = false;   // some row is not greedy
  bool any_min_p = false;
  int64_t max_logprobs = 0;
  at::Tensor params;      // [kNumFields, R] float64
  at::Tensor ban_rows;    // [B] int64, undefined when no row bans an id
  at::Tensor ban_ids;     // [B] int64
  at::Tensor pen_rows;    // [P] int64, undefined when no row has penalties
  at::Tensor pen_ids;     // [P] int64
  at::Tensor pen_rep;     // [P] float32: PenaltyEntry::rep
  at::Tensor pen_add;     // [P] float32: PenaltyEntry::add
  at::Tensor sort_rows;   // [F] int64: rows with top_k or top_p, undefined when none
  bool sort_all = false;  // every row sorts (sort_rows is then the identity)
  bool any_top_p = false;

  at::Tensor field(Field f) const { return params[f]; }
};

Plan make_plan(const std::vector<SampleRow>& rows, int64_t num_logit_rows, int64_t vocab,
               at::Device device, TensorSamplerStats* stats) {
  Plan plan;
  const int64_t r_count = static_cast<int64_t>(rows.size());
  plan.num_rows = r_count;
  plan.vocab = vocab;
  std::vector<double> host(static_cast<size_t>(kNumFields * r_count));
  auto at_field = [&](Field f, int64_t r) -> double& { return host[f * r_count + r]; };
  std::vector<int64_t> sort_rows;
  std::vector<std::pair<int64_t, int64_t>> bans;
  std::vector<std::pair<int64_t, PenaltyEntry>> pens;
  for (int64_t r = 0; r < r_count; ++r) {
    const SampleRow& row = rows[r];
    CRL_CHECK(row.params != nullptr, "SampleRow without params");
    CRL_CHECK(row.logits_row >= 0 && row.logits_row < num_logit_rows, "logits_row ", row.logits_row,
              " outside [0, ", num_logit_rows, ")");
    const SamplingParams& p = *row.params;
    plan.identity_rows &= row.logits_row == r;
    const bool greedy = p.is_greedy();
    const double inv_t = greedy ? 1.0 : 1.0 / p.temperature;
    at_field(kRow, r) = static_cast<double>(row.logits_row);
    at_field(kScale, r) = std::min<double>(inv_t, std::numeric_limits<float>::max());
    at_field(kInvT, r) = inv_t;
    const bool top_k = !greedy && p.top_k > 0 && p.top_k < vocab;
    const bool top_p = !greedy && p.top_p < 1.0;
    at_field(kTopK, r) = static_cast<double>(top_k ? p.top_k : vocab);
    at_field(kTopP, r) = top_p ? p.top_p : 1.0;
    at_field(kMinP, r) = greedy ? 0.0 : p.min_p;
    at_field(kUniform, r) = greedy ? 0.0 : sample_uniform(row.seed, row.sample_index, row.position);
    at_field(kGreedy, r) = greedy ? 1.0 : 0.0;
    plan.any_sampled |= !greedy;
    plan.any_min_p |= !greedy && p.min_p > 0.0;
    plan.any_top_p |= top_p;
    plan.max_logprobs = std::max<int64_t>(plan.max_logprobs, p.logprobs);
    if (top_k || top_p) sort_rows.push_back(r);
    if (row.penalties != nullptr) {
      for (const PenaltyEntry& e : *row.penalties) {
        CRL_CHECK(e.id >= 0 && e.id < vocab, "penalized id ", e.id, " outside vocabulary of ",
                  vocab);
        pens.emplace_back(r, e);
      }
    }
    if (row.banned != nullptr) {
      for (int32_t id : *row.banned) {
        CRL_CHECK(id >= 0 && id < vocab, "banned id ", id, " outside vocabulary of ", vocab);
        bans.emplace_back(r, id);
      }
    }
  }
  plan.max_logprobs = std::min(plan.max_logprobs, vocab);
  plan.sort_all = static_cast<int64_t>(sort_rows.size()) == r_count;
  const int64_t num_bans = static_cast<int64_t>(bans.size());
  const int64_t num_sort = plan.sort_all ? 0 : static_cast<int64_t>(sort_rows.size());
  for (const auto& [r, id] : bans) host.push_back(static_cast<double>(r));
  for (const auto& [r, id] : bans) host.push_back(static_cast<double>(id));
  for (int64_t i = 0; i < num_sort; ++i) host.push_back(static_cast<double>(sort_rows[i]));
  const int64_t num_pens = static_cast<int64_t>(pens.size());
  for (const auto& [r, e] : pens) host.push_back(static_cast<double>(r));
  for (const auto& [r, e] : pens) host.push_back(static_cast<double>(e.id));
  for (const auto& [r, e] : pens) host.push_back(static_cast<double>(e.rep));  // exact: floats
  for (const auto& [r, e] : pens) host.push_back(static_cast<double>(e.add));

  // One upload: pinned host memory for a device, so the copy is asynchronous (the caching host
  // allocator keeps the block until the copy is done).
  const int64_t n = static_cast<int64_t>(host.size());
  at::Tensor staged =
      at::empty({n}, at::TensorOptions().dtype(at::kDouble).pinned_memory(!device.is_cpu()));
  std::memcpy(staged.data_ptr<double>(), host.data(), host.size() * sizeof(double));
  at::Tensor up = staged.to(at::TensorOptions().device(device), /*non_blocking=*/true);
  if (stats != nullptr && !device.is_cpu())
    stats->h2d_bytes += n * static_cast<int64_t>(sizeof(double));

  plan.params = up.narrow(0, 0, kNumFields * r_count).view({kNumFields, r_count});
  int64_t off = kNumFields * r_count;
  if (num_bans > 0) {
    plan.ban_rows = up.narrow(0, off, num_bans).to(at::kLong);
    plan.ban_ids = up.narrow(0, off + num_bans, num_bans).to(at::kLong);
    off += 2 * num_bans;
  }
  if (num_sort > 0) plan.sort_rows = up.narrow(0, off, num_sort).to(at::kLong);
  off += num_sort;
  if (num_pens > 0) {
    plan.pen_rows = up.narrow(0, off, num_pens).to(at::kLong);
    plan.pen_ids = up.narrow(0, off + num_pens, num_pens).to(at::kLong);
    plan.pen_rep = up.narrow(0, off + 2 * num_pens, num_pens).to(at::kFloat);
    plan.pen_add = up.narrow(0, off + 3 * num_pens, num_pens).to(at::kFloat);
  }
  return plan;
}

// The rows' logits and the processed distribution before the draw.
struct Processed {
  at::Tensor x;      // [R, V] float32: each row's raw logits
  at::Tensor bad;    // [R] bool: NaN in the row, or no finite maximum
  at::Tensor lse;    // [R] float32: log-sum-exp of x
  at::Tensor z;      // [R, V]: x after the penalties, with the banned ids at -inf (without them
                     // where that leaves nothing)
  at::Tensor z_max;  // [R]
  at::Tensor q;      // [R, V] float32: exp((z - z_max) * scale) after the filters (undefined when
                     // every row is greedy)
};

at::Tensor column(const at::Tensor& t) { return t.unsqueeze(1); }

// top_k and top_p over the rows in plan.sort_rows: ranks each row by (q desc, id asc) with a
// stable sort, keeps ranks < top_k, then the ranks whose predecessors' mass (of what top_k kept)
// is below top_p times that mass. Returns q with the dropped entries at 0.
at::Tensor apply_rank_filters(const at::Tensor& q, const Plan& plan) {
  if (!plan.sort_all && !plan.sort_rows.defined()) return q;
  const bool all = plan.sort_all;
  const at::Tensor qf = all ? q : q.index_select(0, plan.sort_rows);
  const at::Tensor top_k =
      all ? plan.field(kTopK) : plan.field(kTopK).index_select(0, plan.sort_rows);
  auto sorted = at::sort(qf, /*stable=*/true, /*dim=*/1, /*descending=*/true);
  const at::Tensor& values = std::get<0>(sorted);
  const at::Tensor& order = std::get<1>(sorted);
  const at::Tensor rank =
      at::arange(plan.vocab, at::TensorOptions().dtype(at::kDouble).device(q.device()));
  at::Tensor keep = rank.unsqueeze(0) < column(top_k);
  if (plan.any_top_p) {
    const at::Tensor top_p =
        all ? plan.field(kTopP) : plan.field(kTopP).index_select(0, plan.sort_rows);
    const at::Tensor kept = values.to(at::kDouble) * keep;
    const at::Tensor cum = kept.cumsum(1);
    const at::Tensor mass = cum.select(1, plan.vocab - 1);
    // Rows without top_p keep everything top_k kept (their target is +inf).
    const at::Tensor target = at::where(
        top_p < 1.0, top_p * mass, at::full_like(mass, std::numeric_limits<double>::infinity()));
    keep = keep.logical_and(cum - kept < column(target));
  }
  const at::Tensor keep_by_id = at::zeros_like(keep).scatter_(1, order, keep);
  const at::Tensor filtered = qf * keep_by_id;
  if (all) return filtered;
  return q.index_copy(0, plan.sort_rows, filtered);
}

Processed process(const at::Tensor& logits, const Plan& plan) {
  Processed p;
  at::Tensor x =
      plan.identity_rows ? logits : logits.index_select(0, plan.field(kRow).to(at::kLong));
  p.x = x.to(at::kFloat).contiguous();
  const at::Tensor raw_max = std::get<0>(p.x.max(1));
  p.bad = p.x.isnan().any(1).logical_or(raw_max.isinf());
  p.lse = at::logsumexp(p.x, {1});
  p.z = p.x;
  if (plan.pen_rows.defined()) {  // PenaltyEntry: (v > 0 ? v / rep : v * rep) + add, in float
    at::Tensor z = p.x.clone();
    const at::Tensor v = p.x.index({plan.pen_rows, plan.pen_ids});
    z.index_put_({plan.pen_rows, plan.pen_ids},
                 at::where(v > 0, v / plan.pen_rep, v * plan.pen_rep) + plan.pen_add);
    p.z = z;
  }
  if (plan.ban_rows.defined()) {
    at::Tensor z = p.z.clone();
    z.index_put_({plan.ban_rows, plan.ban_ids}, -std::numeric_limits<float>::infinity());
    const at::Tensor none_left = std::get<0>(z.max(1)).isneginf();
    p.z = at::where(column(none_left), p.z, z);
  }
  p.z_max = std::get<0>(p.z.max(1));
  if (!plan.any_sampled) return p;
  const at::Tensor scale = plan.field(kScale).to(at::kFloat);
  at::Tensor q = ((p.z - column(p.z_max)) * column(scale)).exp_();
  q = apply_rank_filters(q, plan);
  if (plan.any_min_p) q = q * (q >= column(plan.field(kMinP).to(at::kFloat)));  // the max of q is 1
  p.q = q;
  return p;
}

void check_input(const at::Tensor& logits) {
  CRL_CHECK(logits.defined() && logits.dim() == 2, "logits must be [R, V]");
  CRL_CHECK(logits.scalar_type() == at::kFloat || logits.scalar_type() == at::kBFloat16,
            "logits must be float32 or bfloat16, got ", logits.scalar_type());
  CRL_CHECK(logits.size(1) > 0 && logits.size(1) < (int64_t{1} << 31),
            "vocabulary size out of range: ", logits.size(1));
}

// One download of the sampler's results: [token, raw, processed, bad] per row, then the top ids
// and log-probs (k per row); the first four as int32 words, the log-probs as float32 bits.
at::Tensor sample_on_device(const at::Tensor& logits, const Plan& plan, bool fused) {
  const int64_t vocab = logits.size(1);
  if (fused && logits.is_cuda() && kernels::cuda_ops_built() &&
      logits.scalar_type() == at::kFloat && logits.is_contiguous() && !plan.sort_all &&
      !plan.sort_rows.defined() && !plan.ban_rows.defined() && !plan.pen_rows.defined() &&
      !plan.any_min_p && plan.max_logprobs == 0) {
    return kernels::cuda_sample_plain_rows(logits, plan.params).flatten();
  }
  const Processed p = process(logits, plan);
  const at::Tensor greedy_tok = p.z.argmax(1);
  at::Tensor token = greedy_tok;
  at::Tensor processed = at::zeros_like(p.lse);
  if (plan.any_sampled) {
    // Inverse CDF in id order: the first id whose prefix sum exceeds u times the kept mass.
    const at::Tensor cdf = p.q.to(at::kDouble).cumsum(1);
    const at::Tensor mass = cdf.select(1, vocab - 1);
    const at::Tensor target = column(plan.field(kUniform) * mass);
    const at::Tensor drawn = at::searchsorted(cdf, target, /*out_int32=*/false, /*right=*/true)
                                 .squeeze(1)
                                 .clamp_max(vocab - 1);
    const at::Tensor greedy = plan.field(kGreedy) > 0.5;
    token = at::where(greedy, greedy_tok, drawn);
    const at::Tensor z_tok = p.z.gather(1, column(token)).squeeze(1).to(at::kDouble);
    const at::Tensor logp =
        ((z_tok - p.z_max.to(at::kDouble)) * plan.field(kInvT) - mass.log()).clamp_max(0.0);
    processed = at::where(greedy, at::zeros_like(logp), logp).to(at::kFloat);
  }
  const at::Tensor raw = p.x.gather(1, column(token)).squeeze(1) - p.lse;

  std::vector<at::Tensor> parts = {token.to(at::kInt), raw.view(at::kInt), processed.view(at::kInt),
                                   p.bad.to(at::kInt)};
  const int64_t k = plan.max_logprobs;
  if (k > 0) {
    auto top = p.x.topk(k, 1, /*largest=*/true, /*sorted=*/true);
    parts.push_back(std::get<1>(top).to(at::kInt).flatten());
    parts.push_back((std::get<0>(top) - column(p.lse)).contiguous().view(at::kInt).flatten());
  }
  return at::cat(parts, 0);
}

}  // namespace

std::vector<SampleResult> sample_tokens_tensor(const at::Tensor& logits,
                                               const std::vector<SampleRow>& rows,
                                               TensorSamplerStats* stats, bool fused) {
  check_input(logits);
  if (rows.empty()) return {};
  const Plan plan = make_plan(rows, logits.size(0), logits.size(1), logits.device(), stats);
  const int64_t k = plan.max_logprobs;
  const at::Tensor host = sample_on_device(logits, plan, fused).to(at::kCPU).contiguous();
  if (stats != nullptr && !logits.device().is_cpu()) stats->d2h_bytes += host.numel() * 4;

  const int64_t r_count = plan.num_rows;
  const int32_t* w = host.data_ptr<int32_t>();
  std::vector<SampleResult> out(static_cast<size_t>(r_count));
  for (int64_t r = 0; r < r_count; ++r) {
    if (w[3 * r_count + r] != 0) {
      // Same words as the CPU sampler's check.
      throw std::runtime_error("sampler: logits row " + std::to_string(rows[r].logits_row) +
                               " contains NaN or has no finite maximum");
    }
    SampleResult& res = out[r];
    res.token = w[r];
    std::memcpy(&res.raw_logprob, &w[r_count + r], sizeof(float));
    std::memcpy(&res.processed_logprob, &w[2 * r_count + r], sizeof(float));
    const int64_t want = std::min<int64_t>(rows[r].params->logprobs, k);
    const int32_t* ids = w + 4 * r_count + r * k;
    const int32_t* vals = w + 4 * r_count + r_count * k + r * k;
    for (int64_t j = 0; j < want; ++j) {
      float v;
      std::memcpy(&v, &vals[j], sizeof(float));
      res.top_logprobs.emplace_back(ids[j], v);
    }
  }
  return out;
}

at::Tensor tensor_sampler_kept_mask(const at::Tensor& logits, const std::vector<SampleRow>& rows) {
  check_input(logits);
  const Plan plan = make_plan(rows, logits.size(0), logits.size(1), logits.device(), nullptr);
  const Processed p = process(logits, plan);
  if (!p.q.defined()) return at::ones_like(p.x, at::kBool);
  return (p.q > 0).logical_or(column(plan.field(kGreedy) > 0.5));
}

}  // namespace crl::engine
