#include "trainer/trainer.h"

#include <ATen/core/grad_mode.h>
#include <torch/csrc/autograd/autograd.h>
#include <torch/csrc/autograd/custom_function.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <map>
#include <set>
#include <stdexcept>

#include "common/check.h"
#include "engine/model/engine_matched_attention.h"
#include "engine/model/safetensors.h"

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
  if (micro_batch_tokens < 1)
    bad("micro_batch_tokens", std::to_string(micro_batch_tokens), "must be >= 1");
  if (zero_stage < -1 || zero_stage > 3) {
    bad("zero_stage", std::to_string(zero_stage), "0, 1, 2 or 3 (-1: automatic)");
  }
  if (zero_stage == 3 && lora.enabled()) {
    bad("zero_stage", "3",
        "LoRA trains an adapter and keeps its base frozen whole on each rank: use 2");
  }
  if (zero_stage == 3 && micro_batch_tokens < 2) {
    // An empty ZeRO-3 round runs a two-token micro-batch.
    bad("micro_batch_tokens", std::to_string(micro_batch_tokens), "must be >= 2 at zero stage 3");
  }
  if (zero_stage == 3 && grpo.kl_coef > 0) {
    // The reference would be a whole copy of the model on every rank, what stage 3 avoids.
    bad("zero_stage", "3", "not with a KL reference (kl_coef > 0) yet: use 2");
  }
  if (grad_bucket_bytes < 4)
    bad("grad_bucket_bytes", std::to_string(grad_bucket_bytes), "must be >= 4");
  if (cpu_kernels != "project" && cpu_kernels != "libtorch")
    bad("cpu_kernels", cpu_kernels, "project or libtorch");
  if (logits_chunk_tokens < 0)
    bad("logits_chunk_tokens", std::to_string(logits_chunk_tokens), "must be >= 0 (0: automatic)");
  if (lora.rank < 0)
    bad("lora.rank", std::to_string(lora.rank), "must be >= 0 (0: full fine-tuning)");
  if (lora.enabled()) {
    if (!(lora.alpha > 0)) bad("lora.alpha", std::to_string(lora.alpha), "must be > 0");
    if (!(lora.dropout >= 0 && lora.dropout < 1))
      bad("lora.dropout", std::to_string(lora.dropout), "must be in [0, 1)");
    if (lora.dropout > 0 && activation_checkpointing) {
      // The recomputed layer would draw other dropout masks than the forward that made the loss.
      bad("lora.dropout", std::to_string(lora.dropout), "must be 0 with activation checkpointing");
    }
    try {
      engine::parse_lora_targets(lora.targets);
    } catch (const std::invalid_argument& e) {
      bad("lora.targets", lora.targets, e.what());
    }
  }
}

namespace {

// Identity on a parameter in forward; in backward hands the parameter's gradient to the
// TrainState (into its fp32 bucket). The parameter itself never requires grad: the sink's output
// does, through `anchor`, a scalar leaf that only exists to put the sink into the graph.
struct GradSink : public torch::autograd::Function<GradSink> {
  static torch::autograd::variable_list forward(torch::autograd::AutogradContext* ctx,
                                                const at::Tensor& param, const at::Tensor& anchor,
                                                TrainState* state, int64_t index) {
    (void)anchor;
    ctx->saved_data["state"] = reinterpret_cast<int64_t>(state);
    ctx->saved_data["index"] = index;
    return {param.view(param.sizes())};
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    auto* state = reinterpret_cast<TrainState*>(ctx->saved_data["state"].toInt());
    if (grads[0].defined()) state->add_grad(ctx->saved_data["index"].toInt(), grads[0]);
    return {at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

// Activation checkpointing of one decoder layer: forward keeps only the layer's input; backward
// recomputes the layer with grad enabled and back-propagates through it (a reentrant backward, as
// torch.utils.checkpoint's reentrant variant), so the parameters' sinks fire from there. `anchor`
// (the sinks' graph anchor) puts the node into the graph even where `h` needs no gradient (LoRA:
// the frozen embedding's output feeds the first layer).
struct LayerCheckpoint : public torch::autograd::Function<LayerCheckpoint> {
  static torch::autograd::variable_list forward(
      torch::autograd::AutogradContext* ctx, const at::Tensor& h, const at::Tensor& anchor,
      std::shared_ptr<engine::Transformer::LayerFn> layer) {
    (void)anchor;
    ctx->save_for_backward({h});
    at::Tensor out = (*layer)(h);  // grad mode is off inside a custom forward
    ctx->saved_data["layer"] = c10::IValue(reinterpret_cast<int64_t>(new auto(std::move(layer))));
    return {out};
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    using Held = std::shared_ptr<engine::Transformer::LayerFn>;
    std::unique_ptr<Held> layer(reinterpret_cast<Held*>(ctx->saved_data["layer"].toInt()));
    at::Tensor h = ctx->get_saved_variables()[0].detach().requires_grad_(true);
    at::Tensor out;
    {
      at::AutoGradMode grad(true);
      out = (**layer)(h);
    }
    torch::autograd::backward({out}, {grads[0]});
    return {h.grad(), at::Tensor(), at::Tensor()};
  }
};

// ZeRO-3: identity on a decoder layer's output in forward; in backward, which reaches it before
// the layer's own nodes, gathers the layer's parameters again (into the storage autograd's saved
// views point at). TrainState releases them once the layer's last gradient is in.
struct GatherForBackward : public torch::autograd::Function<GatherForBackward> {
  static torch::autograd::variable_list forward(torch::autograd::AutogradContext* ctx,
                                                const at::Tensor& out, TrainState* state,
                                                int64_t group) {
    ctx->saved_data["state"] = reinterpret_cast<int64_t>(state);
    ctx->saved_data["group"] = group;
    return {out.view(out.sizes())};
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    auto* state = reinterpret_cast<TrainState*>(ctx->saved_data["state"].toInt());
    const int group = static_cast<int>(ctx->saved_data["group"].toInt());
    state->acquire_for_backward(group);
    state->prefetch(group - 1);  // backward's next layer (group 0, the root, is held already)
    return {grads[0], at::Tensor(), at::Tensor()};
  }
};

// The ZeRO-3 parameter groups: 1 + i for decoder layer i, 0 for the rest (embedding, final norm,
// head), which a micro-batch holds from its forward to the end of its backward.
std::vector<int> parameter_groups(const engine::NamedTensors& params) {
  std::vector<int> groups;
  const std::string prefix = "model.layers.";
  for (const auto& [name, t] : params) {
    int g = 0;
    if (name.compare(0, prefix.size(), prefix) == 0) {
      g = 1 + std::stoi(name.substr(prefix.size()));
    }
    groups.push_back(g);
  }
  return groups;
}

// Holds a ZeRO-3 group for a scope (no-op at other stages).
struct GroupHold {
  TrainState& state;
  int group;
  GroupHold(TrainState& s, int g) : state(s), group(g) { state.acquire(group); }
  ~GroupHold() { state.release(group); }
  GroupHold(const GroupHold&) = delete;
  GroupHold& operator=(const GroupHold&) = delete;
};

// Row indices of the loss tokens (CPU int64).
at::Tensor loss_rows(const MicroBatch& b) { return loss_token_rows(b.loss_mask); }

}  // namespace

struct Trainer::Impl {
  engine::ModelConfig config;
  at::Device device = at::kCPU;
  at::ScalarType compute_dtype = at::kFloat;
  std::unique_ptr<TrainState> state;
  // While init() runs from a checkpoint at stage 3 over several ranks: read by each rank's slices.
  std::unique_ptr<engine::CheckpointReader> reader;
  std::unique_ptr<engine::Transformer> model;  // computes on state->parameters()
  std::unique_ptr<engine::Transformer> reference;
  at::Tensor anchor;  // the sinks' graph anchor
  GradScale grad_scale;
  // Activation checkpointing: the attention backend of the micro-batch in flight, which the
  // layers recomputed in backward use again.
  std::shared_ptr<engine::AttentionBackend> live_attention;
  // LoRA: the state's parameters are the adapter's A and B; `live` is the adapter the model runs
  // (the parameters, or their sinks during a micro-batch), `lora_shape` its rank, alpha and
  // targets, `reference_adapter` the KL reference's frozen copy.
  bool lora = false;
  engine::LoraAdapter lora_shape, live, reference_adapter;

  void bind(const engine::NamedTensors& values) {
    if (lora) {
      live = engine::lora_with_tensors(lora_shape, values);
    } else {
      model->set_parameters(values);
    }
  }
  // Full fine-tuning: the parameters of decoder layer i are [layer_first[i], layer_first[i + 1]).
  std::vector<size_t> layer_first;
  bool sinks_live = false;  // a micro-batch's forward and backward are under way

  at::Tensor sink(size_t i) {
    const auto& params = state->parameters();
    return GradSink::apply(params[i].second, anchor, state.get(), static_cast<int64_t>(i))[0];
  }
  // Rebinds the model to a fresh sink per parameter (one micro-batch's forward and backward). Full
  // fine-tuning binds each decoder layer's sinks as the layer runs, and the final norm's and
  // head's after the last layer (bind_sinks_from): the autograd engine runs the ready node made
  // last first, so a sink made before the forward would wait for the whole backward, its gradient
  // (and with ZeRO-3 its layer's gathered parameters) held until then, and the buckets after it
  // could not launch their reductions (they launch in descending order); made just before its
  // parameter is used, it runs as soon as backward is done with the parameter.
  void bind_sinks() {
    sinks_live = true;
    const auto& params = state->parameters();
    engine::NamedTensors sinks;
    sinks.reserve(params.size());
    for (size_t i = 0; i < params.size(); ++i) {
      const bool later = !lora && i >= layer_first.front();
      sinks.emplace_back(params[i].first, later ? params[i].second : sink(i));
    }
    bind(sinks);
  }
  // Sinks for parameters [first, end): decoder layer li's (before it runs, end = its last) or,
  // after the last layer, the final norm's and the head's (end = every parameter's end).
  void bind_sinks_from(size_t first, size_t end) {
    if (!sinks_live || lora) return;
    engine::NamedTensors sinks;
    for (size_t i = first; i < end; ++i) sinks.emplace_back(state->parameters()[i].first, sink(i));
    model->set_parameters(first, sinks);
  }
  void bind_plain() {
    sinks_live = false;
    bind(state->parameters());
  }
  // The reference's adapter: a frozen copy of the current parameters.
  void snapshot_reference_adapter() {
    engine::NamedTensors copy;
    for (const auto& [name, p] : state->parameters()) copy.emplace_back(name, p.detach().clone());
    reference_adapter = engine::lora_with_tensors(lora_shape, copy);
  }
};

Trainer::Trainer(const std::string& model_dir, TrainerOptions options)
    : options_(std::move(options)), impl_(std::make_unique<Impl>()) {
  options_.validate();
  engine::ModelConfig config = engine::load_model_config(model_dir);
  if (options_.zero_stage == 3 && options_.group && options_.group->size() > 1 &&
      !options_.lora.enabled()) {
    // Each rank reads only its slices of the (mapped) checkpoint: no rank holds the whole model.
    impl_->reader =
        std::make_unique<engine::CheckpointReader>(model_dir, engine::model_param_specs(config));
    init(std::move(config), {});
    impl_->reader.reset();
    return;
  }
  engine::NamedTensors weights =
      engine::load_checkpoint(model_dir, engine::model_param_specs(config), at::kFloat);
  // A LoRA run whose KL reference is the very base it adapts (a resumed run: it started from a zero
  // B, so base + adapter was the base, bit for bit): the reference shares the frozen base.
  std::error_code ec;
  const bool reference_is_base =
      options_.lora.enabled() && !options_.reference_model_dir.empty() &&
      std::filesystem::equivalent(options_.reference_model_dir, model_dir, ec);
  init(std::move(config), std::move(weights), reference_is_base);
}

Trainer::Trainer(engine::ModelConfig config, engine::NamedTensors weights, TrainerOptions options)
    : options_(std::move(options)), impl_(std::make_unique<Impl>()) {
  options_.validate();
  init(std::move(config), std::move(weights));
}

Trainer::~Trainer() = default;

void Trainer::init(engine::ModelConfig config, engine::NamedTensors weights,
                   bool reference_is_base) {
  Impl& s = *impl_;
  config.validate();
  s.config = config;
  s.device = at::Device(options_.device);
  s.compute_dtype = engine::parse_dtype(options_.dtype);
  engine::TransformerOptions topts;
  topts.dtype = s.compute_dtype;
  topts.device = s.device;
  topts.deterministic = options_.deterministic;
  topts.project_linear = options_.cpu_kernels == "project";
  // ATen's ops in every pass on a GPU: the fused kernels serve only no-grad passes, and a
  // no-grad pass (old log-probs, the reference) must round as the gradient pass does, so the
  // first PPO ratio is exactly 1 and the KL to an equal reference exactly 0.
  topts.cuda_fused = false;

  if (options_.zero_stage < 0)
    options_.zero_stage = options_.group && options_.group->size() > 1 ? 2 : 0;
  TrainStateOptions so;
  so.zero_stage = options_.zero_stage;
  so.compute_dtype = s.compute_dtype;
  so.device = s.device;
  so.offload_optimizer = options_.offload_optimizer;
  so.bucket_bytes = options_.grad_bucket_bytes;
  if (options_.lora.enabled()) {
    // The base, frozen in the compute dtype; the state holds the adapter alone.
    s.lora = true;
    for (auto& [name, w] : weights) w = w.detach().to(s.device, s.compute_dtype);
    const LoraTrainOptions& lo = options_.lora;
    s.lora_shape =
        engine::make_lora_adapter(config, lo.rank, lo.alpha, engine::parse_lora_targets(lo.targets),
                                  lo.seed, /*random_b=*/false);
    engine::NamedTensors adapter = engine::lora_tensors(s.lora_shape);
    for (auto& [name, t] : adapter) t = t.to(s.device, at::kFloat);
    s.state = std::make_unique<TrainState>(adapter, so, options_.group);
    s.model = std::make_unique<engine::Transformer>(config, std::move(weights), topts);
    weights.clear();
    s.bind_plain();
    s.model->set_adapter(&s.live, lo.dropout);
  } else {
    // ZeRO-3 fills its buckets from the host one at a time: the whole model never lands on the
    // device.
    const bool sharded = so.zero_stage == 3 && options_.group && options_.group->size() > 1;
    if (s.reader) {
      const engine::CheckpointReader& reader = *s.reader;
      s.state = std::make_unique<TrainState>(
          reader.specs(),
          [&reader](size_t i, int64_t from, int64_t count) {
            return reader.load_range(i, from, count, at::kFloat);
          },
          so, options_.group);
    } else {
      for (auto& [name, w] : weights) w = w.detach().to(sharded ? at::kCPU : s.device, at::kFloat);
      s.state = std::make_unique<TrainState>(weights, so, options_.group);
    }
    s.state->set_prefetch(options_.zero3_prefetch);
    weights.clear();
    // Validates names and shapes against the config.
    s.model = std::make_unique<engine::Transformer>(config, s.state->parameters(), topts);
  }
  s.anchor = at::zeros({}, at::TensorOptions().dtype(s.compute_dtype).device(s.device))
                 .requires_grad_(true);
  const bool sharded = s.state->sharded_parameters();
  const std::vector<int> groups = parameter_groups(s.state->parameters());
  if (sharded) s.state->set_parameter_groups(groups);
  if (!s.lora) {
    // Each decoder layer's parameters are contiguous in model_param_specs order.
    s.layer_first.assign(config.num_layers + 1, 0);
    size_t i = 0;
    while (i < groups.size() && groups[i] == 0) ++i;
    for (int64_t li = 0; li < config.num_layers; ++li) {
      s.layer_first[li] = i;
      while (i < groups.size() && groups[i] == li + 1) ++i;
    }
    s.layer_first[config.num_layers] = i;
    for (; i < groups.size(); ++i) {
      CRL_CHECK(groups[i] == 0, "trainer: parameter '", s.state->parameters()[i].first,
                "' of a decoder layer is out of the layers' order");
    }
  }
  s.model->set_layer_runner([&s, sharded, checkpoint = options_.activation_checkpointing](
                                int64_t li, const at::Tensor& h,
                                std::shared_ptr<engine::Transformer::LayerFn> layer) {
    const bool grad = at::GradMode::is_enabled();
    const int group = 1 + static_cast<int>(li);
    GroupHold hold(*s.state, group);  // ZeRO-3: the layer's parameters for its forward
    s.state->prefetch(group + 1);     // and the next layer's, gathered while this one computes
    if (grad && !s.lora) s.bind_sinks_from(s.layer_first[li], s.layer_first[li + 1]);
    at::Tensor out =
        grad && checkpoint ? LayerCheckpoint::apply(h, s.anchor, std::move(layer))[0] : (*layer)(h);
    if (grad && sharded) out = GatherForBackward::apply(out, s.state.get(), group)[0];
    if (grad && !s.lora && li + 1 == static_cast<int64_t>(s.layer_first.size()) - 1) {
      s.bind_sinks_from(s.layer_first.back(), s.state->parameters().size());
    }
    return out;
  });

  if (options_.grpo.kl_coef > 0) {
    if (reference_is_base) {
      s.reference =
          std::make_unique<engine::Transformer>(config, s.model->named_parameters(), topts);
    } else if (!options_.reference_model_dir.empty()) {
      s.reference = std::make_unique<engine::Transformer>(
          engine::Transformer::load(options_.reference_model_dir, topts));
    } else if (s.lora) {  // the shared frozen base with a frozen copy of the adapter
      s.reference =
          std::make_unique<engine::Transformer>(config, s.model->named_parameters(), topts);
      s.snapshot_reference_adapter();
      s.reference->set_adapter(&s.reference_adapter);
    } else {
      engine::NamedTensors ref;
      for (const auto& [name, p] : s.state->parameters()) ref.emplace_back(name, p.clone());
      s.reference = std::make_unique<engine::Transformer>(config, std::move(ref), topts);
    }
  }
}

void Trainer::set_grad_scale(GradScale fn) { impl_->grad_scale = std::move(fn); }

const engine::NamedTensors& Trainer::parameters() const { return impl_->state->parameters(); }
const std::vector<at::Tensor>& Trainer::buckets() const { return impl_->state->buckets(); }
const sync::WeightLayout& Trainer::layout() const { return impl_->state->layout(); }
StateBytes Trainer::state_bytes() const { return impl_->state->bytes(); }
int64_t Trainer::prefetched_buckets() const { return impl_->state->prefetched_buckets(); }
int64_t Trainer::prefetches_used() const { return impl_->state->prefetches_used(); }
void Trainer::gather_buckets(const std::function<bool(int64_t)>& keep) {
  impl_->state->acquire_buckets(keep);
}
void Trainer::gather_parameters(int64_t first, int64_t end,
                                const std::function<bool(int64_t)>& keep) {
  impl_->state->acquire_parameters(first, end, keep);
}
void Trainer::release_buckets() { impl_->state->release_kept(); }
int64_t Trainer::update_gathered_peak() const { return impl_->state->update_gathered_peak(); }
bool Trainer::parameters_sharded() const { return impl_->state->sharded_parameters(); }

int64_t Trainer::reference_bytes() const {
  const Impl& s = *impl_;
  if (!s.reference) return 0;
  std::set<const void*> trainer_storage;
  for (const auto& [name, t] : s.model->named_parameters())
    trainer_storage.insert(t.storage().data());
  int64_t bytes = 0;
  for (const auto& [name, t] : s.reference->named_parameters()) {
    if (trainer_storage.count(t.storage().data()) == 0) bytes += t.numel() * t.element_size();
  }
  for (const auto& [name, t] : engine::lora_tensors(s.reference_adapter))
    bytes += t.numel() * t.element_size();
  return bytes;
}
bool Trainer::is_group_leader() const { return !options_.group || options_.group->rank() == 0; }
const engine::ModelConfig& Trainer::config() const { return impl_->config; }

engine::NamedTensors Trainer::master_weights(bool keep) { return impl_->state->gather(0, keep); }

void Trainer::load_master_weights(const engine::NamedTensors& weights) {
  Impl& s = *impl_;
  s.state->scatter(0, weights);
  if (s.lora && s.reference && options_.reference_model_dir.empty()) s.snapshot_reference_adapter();
}

engine::LoraAdapter Trainer::lora_adapter(bool keep) {
  CRL_CHECK(impl_->lora, "lora_adapter: the trainer fine-tunes the full model (--lora-rank 0)");
  engine::NamedTensors w = master_weights(keep);
  if (!keep) return {};
  for (auto& [name, t] : w) t = t.to(at::kCPU, at::kFloat).contiguous();
  return engine::lora_with_tensors(impl_->lora_shape, w);
}

const engine::NamedTensors& Trainer::model_weights() const {
  return impl_->model->named_parameters();
}

void Trainer::zero_grad() { impl_->state->zero_grad(); }

at::Tensor Trainer::forward_logprobs(const engine::Transformer& model, const MicroBatch& b,
                                     double temperature, double* entropy_sum) const {
  const at::Device dev = impl_->device;
  std::vector<at::Tensor> pos;
  pos.reserve(b.seq_lens.size());
  for (int64_t len : b.seq_lens) pos.push_back(at::arange(len, at::kLong));
  at::Tensor positions = at::cat(pos, 0).to(dev);
  at::Tensor tokens = b.tokens.to(dev);
  std::shared_ptr<engine::AttentionBackend> attention;
  if (options_.deterministic) {
    attention = std::make_shared<engine::EngineMatchedAttention>(b.seq_lens);
  } else {
    attention = std::make_shared<engine::DenseCausalAttention>(b.seq_lens);
  }
  if (options_.activation_checkpointing && at::GradMode::is_enabled()) {
    impl_->live_attention = attention;
  }
  const int64_t longest = *std::max_element(b.seq_lens.begin(), b.seq_lens.end());
  at::Tensor hidden = model.forward_hidden(tokens, positions, *attention, longest - 1);
  at::Tensor rows = loss_rows(b).to(dev);
  // Row j - 1 predicts token j (the first token of a sequence is never a loss token).
  return head_target_logprobs(
      model, hidden.index_select(0, rows - 1), tokens.index_select(0, rows),
      logits_chunk_rows(options_.logits_chunk_tokens, impl_->config.vocab_size),
      /*match_engine=*/true, entropy_sum, temperature);
}

LossMetrics Trainer::accumulate(const MicroBatch& b, LossKind kind, double scale, bool last) {
  b.validate();
  if (b.num_tokens() > options_.micro_batch_tokens) {
    CRL_INVALID("micro-batch of ", b.num_tokens(), " tokens exceeds micro_batch_tokens ",
                options_.micro_batch_tokens);
  }
  Impl& s = *impl_;
  at::Tensor rows = loss_rows(b);
  LossOutput out;
  {
    GroupHold root(*s.state, 0);  // ZeRO-3: embedding, final norm and head for the micro-batch
    s.bind_sinks();
    struct Unbind {
      Impl& s;
      ~Unbind() {
        s.state->release_backward_holds();  // a backward that threw leaves its holds
        s.bind_plain();
        s.live_attention.reset();
      }
    } unbind{s};
    double entropy_sum = 0;  // GRPO's metrics only
    const bool sft = kind == LossKind::kSft;
    const double temperature = sft ? 1.0 : options_.grpo.temperature;
    at::Tensor lp = forward_logprobs(*s.model, b, temperature, sft ? nullptr : &entropy_sum);
    if (sft) {
      out = sft_loss(lp, at::Tensor());
    } else {
      at::Tensor old = b.old_logprobs.index_select(0, rows).to(s.device);
      at::Tensor adv = b.advantages.index_select(0, rows).to(s.device);
      at::Tensor ref;
      if (s.reference) {
        at::NoGradGuard no_grad;
        ref = forward_logprobs(*s.reference, b, temperature);
      }
      out = grpo_loss(lp, old, adv, ref, options_.grpo);
    }
    if (out.metrics.num_tokens > 0) {
      out.metrics.entropy = entropy_sum / static_cast<double>(out.metrics.num_tokens);
    }
    s.state->begin_micro_batch(last);
    (out.loss * scale).backward();
    s.state->end_micro_batch();
  }
  return out.metrics;
}

void Trainer::accumulate_empty() {
  if (impl_->state->sharded_parameters()) {
    // The peers' micro-batch gathers every layer twice: so does a two-token one adding 0.
    MicroBatch b;
    b.tokens = at::zeros({2}, at::kLong);
    b.seq_lens = {2};
    b.loss_mask = at::tensor({0.0f, 1.0f});
    b.old_logprobs = at::zeros({2}, at::kFloat);
    b.advantages = at::zeros({2}, at::kFloat);
    accumulate(b, LossKind::kSft, 0.0, true);
    return;
  }
  impl_->state->begin_micro_batch(true);
  impl_->state->end_micro_batch();
}

StepStats Trainer::finish_step(bool advance_schedule) {
  Impl& s = *impl_;
  at::NoGradGuard no_grad;
  StepStats st;
  const int64_t world = options_.group ? options_.group->size() : 1;
  // The bucket reductions go out before the scale callback's own collectives, on every rank,
  // whether or not a `last` micro-batch already started them.
  s.state->launch_remaining();
  const double scale = s.grad_scale ? s.grad_scale() : 1.0 / static_cast<double>(world);
  st.lr = lr_at(options_.schedule, step_);
  AdamWSettings a;
  a.lr = st.lr;
  a.beta1 = options_.beta1;
  a.beta2 = options_.beta2;
  a.eps = options_.adam_eps;
  a.weight_decay = options_.weight_decay;
  st.grad_norm = s.state->step(scale, options_.max_grad_norm, a);
  st.step = advance_schedule ? ++step_ : step_;
  return st;
}

StepStats Trainer::train_step(const std::vector<MicroBatch>& batches, LossKind kind) {
  const auto t0 = std::chrono::steady_clock::now();
  zero_grad();
  const double scale = batches.empty() ? 0.0 : 1.0 / static_cast<double>(batches.size());
  std::vector<LossMetrics> parts;
  int64_t tokens = 0;
  for (size_t i = 0; i < batches.size(); ++i) {
    parts.push_back(accumulate(batches[i], kind, scale, i + 1 == batches.size()));
    tokens += batches[i].num_tokens();
  }
  StepStats st = finish_step();
  st.loss = combine_loss_metrics(parts);
  st.num_micro_batches = static_cast<int64_t>(batches.size());
  st.num_tokens = tokens;
  st.num_loss_tokens = st.loss.num_tokens;
  st.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return st;
}

at::Tensor Trainer::compute_logprobs(const MicroBatch& b) const {
  b.validate();
  at::NoGradGuard no_grad;
  GroupHold root(*impl_->state, 0);
  return forward_logprobs(*impl_->model, b, options_.grpo.temperature).detach();
}

void Trainer::copy_weights_to(engine::Transformer& model) const {
  CRL_CHECK(!impl_->lora,
            "copy_weights_to: a LoRA trainer's weights are its adapter (lora_adapter())");
  at::NoGradGuard no_grad;
  const engine::NamedTensors& dst = model.named_parameters();
  const engine::NamedTensors& src = impl_->state->parameters();
  // ZeRO-3: every bucket gathered (a collective) and dropped once copied.
  impl_->state->acquire_buckets([](int64_t) { return true; });
  struct Release {
    TrainState& s;
    ~Release() { s.release_kept(); }
  } release{*impl_->state};
  CRL_CHECK(dst.size() == src.size(), "copy_weights_to: the model has ", dst.size(),
            " parameters, the trainer ", src.size());
  for (size_t i = 0; i < src.size(); ++i) {
    CRL_CHECK(dst[i].first == src[i].first && dst[i].second.sizes() == src[i].second.sizes(),
              "copy_weights_to: parameter ", i, " is '", dst[i].first, "' ", dst[i].second.sizes(),
              ", the trainer has '", src[i].first, "' ", src[i].second.sizes());
    dst[i].second.copy_(src[i].second);
  }
}

engine::NamedTensors Trainer::optimizer_state(int64_t* adam_step, bool keep) {
  *adam_step = impl_->state->adam_step();
  if (*adam_step == 0) return {};
  engine::NamedTensors m = impl_->state->gather(1, keep);
  engine::NamedTensors v = impl_->state->gather(2, keep);
  engine::NamedTensors out;
  for (auto& [name, t] : m) out.emplace_back("exp_avg/" + name, t.cpu());
  for (auto& [name, t] : v) out.emplace_back("exp_avg_sq/" + name, t.cpu());
  return out;
}

void Trainer::load_optimizer_state(const engine::SafetensorsFile& saved, int64_t adam_step,
                                   int64_t step) {
  const auto& params = impl_->state->parameters();
  const bool fresh = saved.tensors().empty();
  if (!fresh) {
    for (const auto& [name, p] : params) {
      for (const char* kind : {"exp_avg/", "exp_avg_sq/"}) {
        const std::string key = kind + name;
        auto it = saved.tensors().find(key);
        if (it == saved.tensors().end()) CRL_INVALID("optimizer state has no tensor '", key, "'");
        if (at::IntArrayRef(it->second.shape) != p.sizes()) {
          CRL_INVALID("optimizer state tensor '", key, "' has shape ",
                      at::IntArrayRef(it->second.shape), ", the parameter ", p.sizes());
        }
      }
    }
  }
  for (int what : {1, 2}) {
    const std::string kind = what == 1 ? "exp_avg/" : "exp_avg_sq/";
    impl_->state->scatter(what, [&](int64_t param, int64_t from, int64_t count) {
      if (fresh) return at::zeros({count}, at::kFloat);
      return saved.load_range(kind + params[param].first, from, count, at::kFloat);
    });
  }
  impl_->state->set_adam_step(fresh ? 0 : adam_step);
  step_ = step;
}

}  // namespace crl::trainer
