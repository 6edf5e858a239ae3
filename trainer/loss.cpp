#include "trainer/loss.h"

#include <ATen/core/grad_mode.h>
#include <torch/csrc/autograd/custom_function.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "common/check.h"
#include "engine/model/transformer.h"
#include "engine/sampler.h"

namespace crl::trainer {

void GrpoOptions::validate() const {
  auto bad = [](const char* field, double v, const char* rule) {
    CRL_INVALID("invalid GRPO setting '", field, "': ", v, " (", rule, ")");
  };
  if (!(clip_low >= 0 && clip_low < 1)) bad("clip_low", clip_low, "must be in [0, 1)");
  if (!(clip_high >= 0)) bad("clip_high", clip_high, "must be >= 0");
  if (!(kl_coef >= 0)) bad("kl_coef", kl_coef, "must be >= 0");
  if (!(tis_cap >= 0)) bad("tis_cap", tis_cap, "must be >= 0 (0 = off)");
  if (!(temperature > 0 && std::isfinite(temperature))) {
    bad("temperature", temperature, "must be > 0: the rollouts' sampling temperature");
  }
}

namespace {

void check_tokens(const at::Tensor& x, const char* name, int64_t n) {
  CRL_CHECK(x.defined() && x.dim() == 1 && x.size(0) == n, name, " must be [", n, "], got ",
            x.defined() ? c10::str(x.sizes()) : std::string("undefined"));
}

void fill_gap(LossMetrics& m, const at::Tensor& logprobs, const at::Tensor& old_logprobs) {
  if (!old_logprobs.defined() || logprobs.size(0) == 0) return;
  auto diff = old_logprobs.to(at::kDouble) - logprobs.detach().to(at::kDouble);
  auto gap = diff.abs();
  m.logprob_gap_max = gap.max().item<double>();
  m.logprob_gap_mean = gap.mean().item<double>();
  m.mismatch_kl = diff.mean().item<double>();
  m.mismatch_k3_kl = (at::exp(-diff) + diff - 1.0).mean().item<double>();
}

}  // namespace

LossMetrics combine_loss_metrics(const std::vector<LossMetrics>& parts) {
  LossMetrics m;
  double clip = 0, gap = 0, isw = 0, mkl = 0, mk3 = 0, ent = 0;
  for (const auto& p : parts) {
    m.loss += p.loss;
    m.kl += p.kl;
    clip += p.clip_fraction * p.num_tokens;
    gap += p.logprob_gap_mean * p.num_tokens;
    isw += p.is_weight_mean * p.num_tokens;
    mkl += p.mismatch_kl * p.num_tokens;
    mk3 += p.mismatch_k3_kl * p.num_tokens;
    ent += p.entropy * p.num_tokens;
    m.logprob_gap_max = std::max(m.logprob_gap_max, p.logprob_gap_max);
    m.is_weight_max = std::max(m.is_weight_max, p.is_weight_max);
    m.num_tokens += p.num_tokens;
  }
  if (!parts.empty()) {
    m.loss /= static_cast<double>(parts.size());
    m.kl /= static_cast<double>(parts.size());
  }
  if (m.num_tokens > 0) {
    const double n = static_cast<double>(m.num_tokens);
    m.clip_fraction = clip / n;
    m.logprob_gap_mean = gap / n;
    m.is_weight_mean = isw / n;
    m.mismatch_kl = mkl / n;
    m.mismatch_k3_kl = mk3 / n;
    m.entropy = ent / n;
  }
  return m;
}

LossOutput grpo_loss(const at::Tensor& logprobs, const at::Tensor& old_logprobs,
                     const at::Tensor& advantages, const at::Tensor& ref_logprobs,
                     const GrpoOptions& o) {
  const int64_t n = logprobs.size(0);
  check_tokens(logprobs, "logprobs", n);
  check_tokens(old_logprobs, "old_logprobs", n);
  check_tokens(advantages, "advantages", n);
  LossOutput out;
  out.metrics.num_tokens = n;
  if (n == 0) {
    out.loss = logprobs.sum();  // zero, keeps the graph
    return out;
  }
  at::Tensor old = old_logprobs;
  at::Tensor weight;
  if (o.tis_cap > 0) {
    old = logprobs.detach();
    weight = at::exp(old - old_logprobs).clamp_max(o.tis_cap);
  }
  auto ratio = at::exp(logprobs - old);
  auto unclipped = ratio * advantages;
  auto clipped = ratio.clamp(1.0 - o.clip_low, 1.0 + o.clip_high) * advantages;
  auto per_token = -at::min(unclipped, clipped);
  if (weight.defined()) per_token = per_token * weight;
  at::Tensor kl;
  if (o.kl_coef > 0) {
    check_tokens(ref_logprobs, "ref_logprobs", n);
    auto d = ref_logprobs - logprobs;
    kl = at::exp(d) - d - 1.0;
    per_token = per_token + o.kl_coef * kl;
  }
  out.loss = per_token.mean();
  {
    at::NoGradGuard no_grad;
    out.metrics.loss = out.loss.item<double>();
    out.metrics.kl = kl.defined() ? kl.mean().item<double>() : 0.0;
    const double lo = 1.0 - o.clip_low, hi = 1.0 + o.clip_high;
    auto r = ratio.detach();
    out.metrics.clip_fraction = ((r < lo).logical_or(r > hi)).to(at::kDouble).mean().item<double>();
    fill_gap(out.metrics, logprobs, old_logprobs);
    if (weight.defined()) {
      auto w = at::exp(old - old_logprobs).to(at::kDouble);
      out.metrics.is_weight_mean = w.mean().item<double>();
      out.metrics.is_weight_max = w.max().item<double>();
    }
  }
  return out;
}

LossOutput sft_loss(const at::Tensor& logprobs, const at::Tensor& old_logprobs) {
  const int64_t n = logprobs.size(0);
  LossOutput out;
  out.metrics.num_tokens = n;
  out.loss = n == 0 ? logprobs.sum() : -logprobs.mean();
  at::NoGradGuard no_grad;
  out.metrics.loss = out.loss.item<double>();
  if (old_logprobs.defined()) {
    check_tokens(old_logprobs, "old_logprobs", n);
    fill_gap(out.metrics, logprobs, old_logprobs);
  }
  return out;
}

at::Tensor loss_token_rows(const at::Tensor& loss_mask) {
  return (loss_mask != 0).nonzero().squeeze(1);
}

at::Tensor target_logprobs(const at::Tensor& logits, const at::Tensor& targets, bool match_engine,
                           double* entropy_sum, double temperature) {
  CRL_CHECK(logits.dim() == 2 && targets.dim() == 1 && logits.size(0) == targets.size(0),
            "target_logprobs: logits ", logits.sizes(), " targets ", targets.sizes());
  CRL_CHECK(temperature > 0, "target_logprobs: temperature ", temperature, " must be > 0");
  const at::Tensor lsm = at::log_softmax(temperature == 1.0 ? logits : logits / temperature, -1);
  auto ls = lsm.gather(1, targets.unsqueeze(1)).squeeze(1);
  if (entropy_sum != nullptr && logits.size(0) > 0) {
    // In row chunks: the temporaries stay ~64 MiB at a 150k vocabulary, not 2 x [N, V].
    at::NoGradGuard no_grad;
    const at::Tensor l = lsm.detach();
    const int64_t rows =
        std::max<int64_t>(1, (int64_t{16} << 20) / std::max<int64_t>(1, l.size(1)));
    for (int64_t r = 0; r < l.size(0); r += rows) {
      const at::Tensor c = l.narrow(0, r, std::min(rows, l.size(0) - r));
      *entropy_sum -= (c.exp() * c).sum().item<double>();
    }
  }
  if (!match_engine || !logits.is_cpu() || logits.size(0) == 0) return ls;
  at::Tensor exact;
  {
    at::NoGradGuard no_grad;
    auto t64 = targets.to(at::kLong).contiguous();
    std::vector<int32_t> ids(t64.data_ptr<int64_t>(), t64.data_ptr<int64_t>() + t64.size(0));
    exact = at::tensor(
        engine::tempered_logprobs(logits.detach().to(at::kFloat).contiguous(), ids, temperature),
        at::kFloat);
  }
  // Exactly `exact` in value (x - x == 0), log_softmax's gradient.
  return exact + (ls - ls.detach());
}

int64_t logits_chunk_rows(int64_t option, int64_t vocab) {
  if (option > 0) return option;
  return std::max<int64_t>(64, (int64_t{1} << 30) / (4 * std::max<int64_t>(1, vocab)));
}

namespace {

at::Tensor logprobs_by_chunk(const engine::Transformer& model, const at::Tensor& hidden,
                             const at::Tensor& head, const at::Tensor& targets, int64_t chunk_rows,
                             bool match_engine, double* entropy_sum, double temperature) {
  std::vector<at::Tensor> parts;
  for (int64_t r = 0; r < hidden.size(0); r += chunk_rows) {
    const int64_t n = std::min(chunk_rows, hidden.size(0) - r);
    parts.push_back(target_logprobs(model.compute_logits(hidden.narrow(0, r, n), head),
                                    targets.narrow(0, r, n), match_engine, entropy_sum,
                                    temperature));
  }
  return at::cat(parts, 0);
}

// head_target_logprobs with a graph: the inputs are the rows' hidden states and the head's weight
// (as bound: a gradient sink in the trainer, so the head's whole gradient reaches it once).
struct ChunkedHeadLogprobs : torch::autograd::Function<ChunkedHeadLogprobs> {
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& hidden,
                            const at::Tensor& head, const at::Tensor& targets,
                            const engine::Transformer* model, int64_t chunk_rows, bool match_engine,
                            double* entropy_sum, double temperature) {
    ctx->save_for_backward({hidden, head, targets});
    ctx->saved_data["model"] = reinterpret_cast<int64_t>(model);
    ctx->saved_data["chunk_rows"] = chunk_rows;
    ctx->saved_data["temperature"] = temperature;
    // Grad mode is off inside a custom forward.
    return logprobs_by_chunk(*model, hidden, head, targets, chunk_rows, match_engine, entropy_sum,
                             temperature);
  }

  // Per chunk: the logits z again (the forward's kernel, no graph), d ls / d z = (g / T) (onehot -
  // softmax(z / T)) in place of their softmax, then the head's two products by hand: d hidden = dz
  // W and d head += dz^T hidden, summed in fp32 (fp32 compute: one addmm into the sum; bf16: a
  // chunk's [V, H] product in bf16, as the whole head's would be, added to it).
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const at::Tensor& hidden = saved[0];
    const at::Tensor& head = saved[1];
    const at::Tensor& targets = saved[2];
    const auto* model =
        reinterpret_cast<const engine::Transformer*>(ctx->saved_data["model"].toInt());
    const int64_t chunk_rows = ctx->saved_data["chunk_rows"].toInt();
    const double temperature = ctx->saved_data["temperature"].toDouble();
    const bool want_hidden = ctx->needs_input_grad(0), want_head = ctx->needs_input_grad(1);
    const bool fp32 = head.scalar_type() == at::kFloat;
    at::NoGradGuard no_grad;
    at::Tensor grad_hidden = want_hidden ? at::empty_like(hidden) : at::Tensor();
    at::Tensor grad_head =
        want_head ? at::zeros(head.sizes(), head.options().dtype(at::kFloat)) : at::Tensor();
    for (int64_t r = 0; r < hidden.size(0); r += chunk_rows) {
      const int64_t n = std::min(chunk_rows, hidden.size(0) - r);
      const at::Tensor h = hidden.narrow(0, r, n);
      at::Tensor g = grads[0].narrow(0, r, n).to(at::kFloat).unsqueeze(1);
      at::Tensor dz = model->compute_logits(h, head);  // fp32 [n, V], ours
      if (temperature != 1.0) {
        dz.div_(temperature);
        g = g / temperature;
      }
      dz.sub_(dz.logsumexp(-1, /*keepdim=*/true)).exp_().mul_(-g);
      dz.scatter_add_(1, targets.narrow(0, r, n).unsqueeze(1), g);
      if (!fp32) dz = dz.to(head.scalar_type());
      if (want_hidden) {
        at::Tensor rows = grad_hidden.narrow(0, r, n);
        at::mm_out(rows, dz, head);
      }
      if (want_head) {
        if (fp32) {
          grad_head.addmm_(dz.t(), h);
        } else {
          grad_head.add_(at::mm(dz.t(), h));
        }
      }
    }
    if (want_head) grad_head = grad_head.to(head.scalar_type());
    return {grad_hidden,  grad_head,    at::Tensor(), at::Tensor(),
            at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

}  // namespace

at::Tensor head_target_logprobs(const engine::Transformer& model, const at::Tensor& hidden,
                                const at::Tensor& targets, int64_t chunk_rows, bool match_engine,
                                double* entropy_sum, double temperature) {
  CRL_CHECK(hidden.dim() == 2 && targets.dim() == 1 && hidden.size(0) == targets.size(0),
            "head_target_logprobs: hidden ", hidden.sizes(), " targets ", targets.sizes());
  CRL_CHECK(chunk_rows > 0, "head_target_logprobs: chunk_rows ", chunk_rows, " must be > 0");
  if (hidden.size(0) <= chunk_rows) {
    return target_logprobs(model.compute_logits(hidden), targets, match_engine, entropy_sum,
                           temperature);
  }
  const at::Tensor& head = model.lm_head();
  if (at::GradMode::is_enabled() && (hidden.requires_grad() || head.requires_grad())) {
    return ChunkedHeadLogprobs::apply(hidden, head, targets, &model, chunk_rows, match_engine,
                                      entropy_sum, temperature);
  }
  return logprobs_by_chunk(model, hidden, head, targets, chunk_rows, match_engine, entropy_sum,
                           temperature);
}

}  // namespace crl::trainer
