#include "trainer/trainer.h"

#include <ATen/core/grad_mode.h>
#include <torch/optim/adamw.h>

#include <chrono>
#include <cmath>
#include <map>
#include <sstream>
#include <stdexcept>
#include <type_traits>

#include "common/check.h"
#include "trainer/engine_matched_attention.h"

namespace crl::trainer {

void TrainerOptions::validate() const {
  auto bad = [](const char* field, const std::string& v, const char* rule) {
    CRL_INVALID("invalid trainer setting '", field, "': ", v, " (", rule, ")");
  };
  const at::ScalarType dt = engine::parse_dtype(dtype);
  if (dt != at::kFloat && dt != at::kBFloat16) bad("dtype", dtype, "float32 or bfloat16");
  schedule.validate();
  grpo.validate();
  if (!(weight_decay >= 0)) bad("weight_decay", std::to_string(weight_decay), "must be >= 0");
  if (!(beta1 >= 0 && beta1 < 1)) bad("beta1", std::to_string(beta1), "must be in [0, 1)");
  if (!(beta2 >= 0 && beta2 < 1)) bad("beta2", std::to_string(beta2), "must be in [0, 1)");
  if (!(adam_eps > 0)) bad("adam_eps", std::to_string(adam_eps), "must be > 0");
  if (!(max_grad_norm >= 0)) bad("max_grad_norm", std::to_string(max_grad_norm), "must be >= 0");
  if (micro_batch_tokens < 1) bad("micro_batch_tokens", std::to_string(micro_batch_tokens), "must be >= 1");
  if (dp_world_size < 1) bad("dp_world_size", std::to_string(dp_world_size), "must be >= 1");
  if (grad_bucket_bytes < 4) bad("grad_bucket_bytes", std::to_string(grad_bucket_bytes), "must be >= 4");
}

struct Trainer::Impl {
  engine::ModelConfig config;
  at::Device device = at::kCPU;
  at::ScalarType compute_dtype = at::kFloat;
  engine::NamedTensors masters;                  // float32 leaves, requires_grad
  std::vector<at::Tensor> grad_views;            // masters[i].grad() as bucket views
  std::vector<at::Tensor> grad_buckets;          // flat float32
  std::unique_ptr<engine::Transformer> model;    // computes on the masters (or their casts)
  std::unique_ptr<engine::Transformer> reference;
  std::unique_ptr<torch::optim::AdamW> optimizer;
  GradAllReduce all_reduce;

  // bf16 compute: rebinds the model to fresh differentiable casts of the masters.
  void bind_compute_weights() {
    if (compute_dtype == at::kFloat) return;
    engine::NamedTensors casts;
    casts.reserve(masters.size());
    for (const auto& [name, m] : masters) casts.emplace_back(name, m.to(compute_dtype));
    model->set_parameters(casts);
  }

  // Autograd accumulates into existing grads in place; should it ever replace one, copy it back
  // into its bucket view so the all-reduce sees it.
  void rebind_grads() {
    for (size_t i = 0; i < masters.size(); ++i) {
      at::Tensor& p = masters[i].second;
      const at::Tensor& g = p.grad();
      if (g.defined() && g.data_ptr() == grad_views[i].data_ptr()) continue;
      if (g.defined()) grad_views[i].copy_(g);
      p.mutable_grad() = grad_views[i];
    }
  }
};

Trainer::Trainer(const std::string& model_dir, TrainerOptions options)
    : options_(std::move(options)), impl_(std::make_unique<Impl>()) {
  options_.validate();
  engine::ModelConfig config = engine::load_model_config(model_dir);
  engine::NamedTensors weights =
      engine::load_checkpoint(model_dir, engine::model_param_specs(config), at::kFloat);
  init(std::move(config), std::move(weights));
}

Trainer::Trainer(engine::ModelConfig config, engine::NamedTensors weights, TrainerOptions options)
    : options_(std::move(options)), impl_(std::make_unique<Impl>()) {
  options_.validate();
  init(std::move(config), std::move(weights));
}

Trainer::~Trainer() = default;

void Trainer::init(engine::ModelConfig config, engine::NamedTensors weights) {
  Impl& s = *impl_;
  config.validate();
  s.config = config;
  s.device = at::Device(options_.device);
  s.compute_dtype = engine::parse_dtype(options_.dtype);
  engine::TransformerOptions topts;
  topts.dtype = s.compute_dtype;
  topts.device = s.device;
  topts.deterministic = options_.deterministic;

  // Masters: fresh float32 leaves (never aliasing the caller's tensors).
  for (auto& [name, w] : weights) {
    at::Tensor m = w.detach().to(s.device, at::kFloat, /*non_blocking=*/false, /*copy=*/true);
    s.masters.emplace_back(name, m.contiguous().requires_grad_(true));
  }
  engine::NamedTensors compute;
  for (const auto& [name, m] : s.masters) {
    compute.emplace_back(name, s.compute_dtype == at::kFloat ? m : m.detach().to(s.compute_dtype));
  }
  // Validates names and shapes against the config.
  s.model = std::make_unique<engine::Transformer>(config, std::move(compute), topts);

  // Gradient buckets, in parameter order; each master's grad is a view into one.
  std::vector<std::pair<int64_t, int64_t>> place;  // (bucket, element offset)
  std::vector<int64_t> bucket_numel;
  const int64_t cap = std::max<int64_t>(1, options_.grad_bucket_bytes / 4);
  for (const auto& [name, m] : s.masters) {
    const int64_t n = m.numel();
    if (bucket_numel.empty() || (bucket_numel.back() > 0 && bucket_numel.back() + n > cap)) {
      bucket_numel.push_back(0);
    }
    place.emplace_back(static_cast<int64_t>(bucket_numel.size()) - 1, bucket_numel.back());
    bucket_numel.back() += n;
  }
  for (int64_t n : bucket_numel) {
    s.grad_buckets.push_back(at::zeros({n}, at::TensorOptions().dtype(at::kFloat).device(s.device)));
  }
  for (size_t i = 0; i < s.masters.size(); ++i) {
    at::Tensor& m = s.masters[i].second;
    at::Tensor view = s.grad_buckets[place[i].first].narrow(0, place[i].second, m.numel()).view(m.sizes());
    s.grad_views.push_back(view);
    m.mutable_grad() = view;
  }

  if (options_.grpo.kl_coef > 0) {
    if (!options_.reference_model_dir.empty()) {
      s.reference = std::make_unique<engine::Transformer>(
          engine::Transformer::load(options_.reference_model_dir, topts));
    } else {
      engine::NamedTensors ref;
      for (const auto& [name, m] : s.masters) {
        ref.emplace_back(name, m.detach().to(s.compute_dtype, /*non_blocking=*/false, /*copy=*/true));
      }
      s.reference = std::make_unique<engine::Transformer>(config, std::move(ref), topts);
    }
  }

  std::vector<at::Tensor> decay, no_decay;
  for (const auto& [name, m] : s.masters) (m.dim() >= 2 ? decay : no_decay).push_back(m);
  auto base = torch::optim::AdamWOptions(options_.schedule.lr)
                  .betas(std::make_tuple(options_.beta1, options_.beta2))
                  .eps(options_.adam_eps)
                  .weight_decay(options_.weight_decay);
  std::vector<torch::optim::OptimizerParamGroup> groups;
  groups.emplace_back(decay, std::make_unique<torch::optim::AdamWOptions>(base));
  auto nd = base;
  nd.weight_decay(0.0);
  if (!no_decay.empty()) groups.emplace_back(no_decay, std::make_unique<torch::optim::AdamWOptions>(nd));
  s.optimizer = std::make_unique<torch::optim::AdamW>(std::move(groups), base);
}

void Trainer::set_grad_all_reduce(GradAllReduce fn) { impl_->all_reduce = std::move(fn); }

const engine::NamedTensors& Trainer::master_weights() const { return impl_->masters; }
const engine::ModelConfig& Trainer::config() const { return impl_->config; }

void Trainer::zero_grad() {
  for (auto& b : impl_->grad_buckets) b.zero_();
  impl_->rebind_grads();
}

namespace {

// libtorch keys an optimizer's per-parameter state by the parameter's TensorImpl: 1.x by its
// address printed as a string, 2.x by the address itself.
template <class StateMap>
typename StateMap::key_type optimizer_state_key(const StateMap&, const at::Tensor& p) {
  using Key = typename StateMap::key_type;
  if constexpr (std::is_same_v<Key, std::string>) {
    std::ostringstream os;
    os << p.unsafeGetTensorImpl();
    return os.str();
  } else {
    return static_cast<Key>(p.unsafeGetTensorImpl());
  }
}

// Row indices of the loss tokens (CPU int64).
at::Tensor loss_rows(const MicroBatch& b) { return b.loss_mask.nonzero().squeeze(1); }

}  // namespace

at::Tensor Trainer::forward_logprobs(const engine::Transformer& model, const MicroBatch& b) const {
  const at::Device dev = impl_->device;
  std::vector<at::Tensor> pos;
  pos.reserve(b.seq_lens.size());
  for (int64_t len : b.seq_lens) pos.push_back(at::arange(len, at::kLong));
  at::Tensor positions = at::cat(pos, 0).to(dev);
  at::Tensor tokens = b.tokens.to(dev);
  std::unique_ptr<engine::AttentionBackend> attention;
  if (options_.deterministic) {
    attention = std::make_unique<EngineMatchedAttention>(b.seq_lens);
  } else {
    attention = std::make_unique<engine::DenseCausalAttention>(b.seq_lens);
  }
  at::Tensor hidden = model.forward_hidden(tokens, positions, *attention);
  at::Tensor rows = loss_rows(b).to(dev);
  // Row j - 1 predicts token j (the first token of a sequence is never a loss token).
  at::Tensor logits = model.compute_logits(hidden.index_select(0, rows - 1));
  return target_logprobs(logits, tokens.index_select(0, rows), /*match_engine=*/true);
}

LossMetrics Trainer::accumulate(const MicroBatch& b, LossKind kind, double scale) {
  b.validate();
  if (b.num_tokens() > options_.micro_batch_tokens) {
    CRL_INVALID("micro-batch of ", b.num_tokens(), " tokens exceeds micro_batch_tokens ",
                options_.micro_batch_tokens);
  }
  Impl& s = *impl_;
  at::Tensor rows = loss_rows(b);
  s.bind_compute_weights();
  at::Tensor lp = forward_logprobs(*s.model, b);
  LossOutput out;
  if (kind == LossKind::kSft) {
    out = sft_loss(lp, at::Tensor());
  } else {
    at::Tensor old = b.old_logprobs.index_select(0, rows).to(impl_->device);
    at::Tensor adv = b.advantages.index_select(0, rows).to(impl_->device);
    at::Tensor ref;
    if (s.reference) {
      at::NoGradGuard no_grad;
      ref = forward_logprobs(*s.reference, b);
    }
    out = grpo_loss(lp, old, adv, ref, options_.grpo);
  }
  (out.loss * scale).backward();
  s.rebind_grads();
  return out.metrics;
}

StepStats Trainer::finish_step() {
  Impl& s = *impl_;
  at::NoGradGuard no_grad;
  StepStats st;
  if (s.all_reduce) {
    std::vector<int64_t> sizes;
    for (const auto& b : s.grad_buckets) sizes.push_back(b.numel());
    std::vector<at::Tensor> buckets = s.grad_buckets;  // handles: the hook writes in place
    s.all_reduce(buckets);
    for (size_t i = 0; i < buckets.size(); ++i) {
      CRL_CHECK(buckets[i].data_ptr() == s.grad_buckets[i].data_ptr() && buckets[i].numel() == sizes[i],
                "the gradient all-reduce hook must reduce the buckets in place");
    }
  } else {
    CRL_CHECK(options_.dp_world_size == 1, "dp_world_size ", options_.dp_world_size,
              " needs a gradient all-reduce hook (set_grad_all_reduce)");
  }
  if (options_.dp_world_size > 1) {
    for (auto& b : s.grad_buckets) b.div_(static_cast<double>(options_.dp_world_size));
  }
  double sq = 0;
  for (const auto& b : s.grad_buckets) sq += b.to(at::kDouble).pow(2).sum().item<double>();
  st.grad_norm = std::sqrt(sq);
  if (options_.max_grad_norm > 0 && st.grad_norm > options_.max_grad_norm) {
    const double coef = options_.max_grad_norm / (st.grad_norm + 1e-6);
    for (auto& b : s.grad_buckets) b.mul_(coef);
  }
  st.lr = lr_at(options_.schedule, step_);
  for (auto& group : s.optimizer->param_groups()) {
    static_cast<torch::optim::AdamWOptions&>(group.options()).lr(st.lr);
  }
  s.optimizer->step();
  st.step = ++step_;
  return st;
}

StepStats Trainer::train_step(const std::vector<MicroBatch>& batches, LossKind kind) {
  const auto t0 = std::chrono::steady_clock::now();
  zero_grad();
  const double scale = batches.empty() ? 0.0 : 1.0 / static_cast<double>(batches.size());
  std::vector<LossMetrics> parts;
  int64_t tokens = 0;
  for (const auto& b : batches) {
    parts.push_back(accumulate(b, kind, scale));
    tokens += b.num_tokens();
  }
  StepStats st = finish_step();
  st.loss = combine_loss_metrics(parts);
  const int64_t loss_tokens = st.loss.num_tokens;
  st.num_micro_batches = static_cast<int64_t>(batches.size());
  st.num_tokens = tokens;
  st.num_loss_tokens = loss_tokens;
  st.seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return st;
}

at::Tensor Trainer::compute_logprobs(const MicroBatch& b) const {
  b.validate();
  at::NoGradGuard no_grad;
  if (impl_->compute_dtype != at::kFloat) {
    const_cast<Impl&>(*impl_).bind_compute_weights();
  }
  return forward_logprobs(*impl_->model, b).detach();
}

void Trainer::copy_weights_to(engine::Transformer& model) const {
  at::NoGradGuard no_grad;
  const engine::NamedTensors& dst = model.named_parameters();
  const engine::NamedTensors& src = impl_->masters;
  CRL_CHECK(dst.size() == src.size(), "copy_weights_to: the model has ", dst.size(),
            " parameters, the trainer ", src.size());
  for (size_t i = 0; i < src.size(); ++i) {
    CRL_CHECK(dst[i].first == src[i].first && dst[i].second.sizes() == src[i].second.sizes(),
              "copy_weights_to: parameter ", i, " is '", dst[i].first, "' ", dst[i].second.sizes(),
              ", the trainer has '", src[i].first, "' ", src[i].second.sizes());
    dst[i].second.copy_(src[i].second.detach());
  }
}

engine::NamedTensors Trainer::optimizer_state(int64_t* adam_step) const {
  engine::NamedTensors out;
  *adam_step = 0;
  auto& state = impl_->optimizer->state();
  for (const auto& [name, m] : impl_->masters) {
    auto it = state.find(optimizer_state_key(state, m));
    if (it == state.end()) continue;
    auto& st = static_cast<torch::optim::AdamWParamState&>(*it->second);
    *adam_step = st.step();
    out.emplace_back("exp_avg/" + name, st.exp_avg().detach().cpu());
    out.emplace_back("exp_avg_sq/" + name, st.exp_avg_sq().detach().cpu());
  }
  return out;
}

void Trainer::load_optimizer_state(const engine::NamedTensors& saved, int64_t adam_step,
                                   int64_t step) {
  std::map<std::string, at::Tensor> by_name(saved.begin(), saved.end());
  auto& state = impl_->optimizer->state();
  state.clear();
  if (!saved.empty()) {
    for (const auto& [name, m] : impl_->masters) {
      auto get = [&](const std::string& key) {
        auto it = by_name.find(key);
        if (it == by_name.end()) CRL_INVALID("optimizer state has no tensor '", key, "'");
        if (it->second.sizes() != m.sizes()) {
          CRL_INVALID("optimizer state tensor '", key, "' has shape ", it->second.sizes(),
                      ", the parameter ", m.sizes());
        }
        return it->second.to(m.device(), at::kFloat, false, /*copy=*/true);
      };
      auto st = std::make_unique<torch::optim::AdamWParamState>();
      st->step(adam_step);
      st->exp_avg(get("exp_avg/" + name));
      st->exp_avg_sq(get("exp_avg_sq/" + name));
      state[optimizer_state_key(state, m)] = std::move(st);
    }
  }
  step_ = step;
}

}  // namespace crl::trainer
