#include "engine/model/transformer.h"

#include <ATen/Parallel.h>
#include <ATen/core/grad_mode.h>

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <unordered_map>
#include <vector>

#include "common/check.h"
#include "engine/kernels/batch_invariant.h"
#include "engine/kernels/cpu_isa.h"
#include "engine/kernels/cuda_ops.h"
#include "engine/model/deterministic_ops.h"
#include "engine/model/linear.h"

namespace crl::engine {

namespace {

// `parts` (a layer's q/k/v weights, say) as one tensor over their memory, rows stacked, when they
// lie back to back in one storage: contiguous, one dtype, the same trailing shape, each starting
// where the one before ends. Else undefined (an undefined part included).
at::Tensor adjacent_rows(const std::vector<const at::Tensor*>& parts) {
  const at::Tensor& first = **parts.begin();
  if (!first.defined()) return {};
  const char* next = static_cast<const char*>(first.data_ptr());
  int64_t rows = 0;
  for (const at::Tensor* p : parts) {
    const at::Tensor& t = *p;
    if (!t.defined() || !t.is_contiguous() || t.scalar_type() != first.scalar_type() ||
        t.dim() != first.dim() || t.sizes().slice(1) != first.sizes().slice(1) ||
        !t.storage().is_alias_of(first.storage()) ||
        static_cast<const char*>(t.data_ptr()) != next) {
      return {};
    }
    next += t.nbytes();
    rows += t.size(0);
  }
  std::vector<int64_t> shape(first.sizes().begin(), first.sizes().end());
  shape[0] = rows;
  return first.as_strided(shape, first.strides(), first.storage_offset());
}

// A layer's groups of parameters that merge, by name suffix after "model.layers.<i>.".
const std::vector<std::vector<const char*>>& merged_groups() {
  static const std::vector<std::vector<const char*>> groups = {
      {"self_attn.q_proj.weight", "self_attn.k_proj.weight", "self_attn.v_proj.weight"},
      {"self_attn.q_proj.bias", "self_attn.k_proj.bias", "self_attn.v_proj.bias"},
      {"mlp.gate_proj.weight", "mlp.up_proj.weight"}};
  return groups;
}

}  // namespace

at::Tensor rope_inv_freq(const ModelConfig& c) {
  const int64_t half = c.head_dim / 2;
  auto idx = at::arange(0, half, at::kDouble) * 2.0 / static_cast<double>(c.head_dim);
  auto inv_freq = 1.0 / at::pow(c.rope_theta, idx);
  if (c.rope_scaling == RopeScaling::kLinear) {
    inv_freq = inv_freq / c.rope_factor;
  } else if (c.rope_scaling == RopeScaling::kLlama3) {
    const double old_len = static_cast<double>(c.rope_original_max_position);
    const double low_wavelen = old_len / c.rope_low_freq_factor;
    const double high_wavelen = old_len / c.rope_high_freq_factor;
    auto wavelen = 2.0 * M_PI / inv_freq;
    auto scaled = at::where(wavelen > low_wavelen, inv_freq / c.rope_factor, inv_freq);
    auto smooth = (old_len / wavelen - c.rope_low_freq_factor) /
                  (c.rope_high_freq_factor - c.rope_low_freq_factor);
    auto smoothed = (1.0 - smooth) * scaled / c.rope_factor + smooth * scaled;
    auto medium = (wavelen >= high_wavelen).logical_and(wavelen <= low_wavelen);
    inv_freq = at::where(medium, smoothed, scaled);
  }
  return inv_freq.to(at::kFloat);
}

Transformer::Transformer(ModelConfig config, NamedTensors weights, TransformerOptions options,
                         VocabRange vocab)
    : config_(std::move(config)), options_(options), vocab_(vocab), params_(std::move(weights)) {
  config_.validate();
  if (vocab_.rows == 0) vocab_ = {0, config_.vocab_size};
  if (vocab_.start < 0 || vocab_.rows < 0 || vocab_.start + vocab_.rows > config_.vocab_size) {
    throw std::invalid_argument("vocabulary rows [" + std::to_string(vocab_.start) + ", " +
                                std::to_string(vocab_.start + vocab_.rows) + ") of " +
                                std::to_string(config_.vocab_size));
  }
  set_deterministic(options_.deterministic);
  if (options_.dtype != at::kFloat && options_.dtype != at::kBFloat16) {
    throw std::invalid_argument("model compute dtype must be float32 or bfloat16, got " +
                                dtype_name(options_.dtype));
  }
  auto specs = model_param_specs(config_);
  for (auto& spec : specs) {  // a shard's part of the vocabulary
    if (spec.name == "model.embed_tokens.weight" || spec.name == "lm_head.weight") {
      spec.shape[0] = vocab_.rows;
    }
  }
  if (specs.size() != params_.size()) {
    throw std::invalid_argument("model expects " + std::to_string(specs.size()) + " weights, got " +
                                std::to_string(params_.size()));
  }
  for (size_t i = 0; i < specs.size(); ++i) {
    auto& [name, tensor] = params_[i];
    if (name != specs[i].name) {
      throw std::invalid_argument("weight " + std::to_string(i) + " is '" + name + "', expected '" +
                                  specs[i].name + "'");
    }
    if (tensor.sizes() != at::IntArrayRef(specs[i].shape)) {
      throw std::invalid_argument("weight '" + name + "' has shape " + c10::str(tensor.sizes()) +
                                  ", expected " + c10::str(at::IntArrayRef(specs[i].shape)));
    }
    if (tensor.scalar_type() != options_.dtype || tensor.device() != options_.device) {
      tensor = tensor.to(options_.device, options_.dtype).contiguous();
    }
  }
  if (options_.merge_projections) pack_merged_projections();
  bind_parameters();

  // The RoPE tables [max_pos, head_dim / 2]: the float32 angle pos * inv_freq as HF and vLLM form
  // it, then cos and sin from the C library in double, rounded once. (libtorch's vectorised cos
  // and sin depend on the CPU's vector width; these tables do not, as deterministic mode needs.)
  const int64_t max_pos = config_.max_position_embeddings;
  const at::Tensor inv_freq = rope_inv_freq(config_).contiguous();
  const int64_t half = inv_freq.numel();
  const float* inv = inv_freq.data_ptr<float>();
  at::Tensor cos_table = at::empty({max_pos, half}, at::kFloat);
  at::Tensor sin_table = at::empty({max_pos, half}, at::kFloat);
  float* cp = cos_table.data_ptr<float>();
  float* sp = sin_table.data_ptr<float>();
  at::parallel_for(0, max_pos, 256, [&](int64_t begin, int64_t end) {
    for (int64_t p = begin; p < end; ++p) {
      for (int64_t i = 0; i < half; ++i) {
        const double angle = static_cast<float>(p) * inv[i];  // float32 product, as HF
        cp[p * half + i] = static_cast<float>(std::cos(angle));
        sp[p * half + i] = static_cast<float>(std::sin(angle));
      }
    }
  });
  rope_cos_ = cos_table.to(options_.device);
  rope_sin_ = sin_table.to(options_.device);
}

Transformer Transformer::load(const std::string& dir, TransformerOptions options) {
  ModelConfig config = load_model_config(dir);
  NamedTensors weights = load_checkpoint(dir, model_param_specs(config), options.dtype);
  return Transformer(std::move(config), std::move(weights), options);
}

Transformer Transformer::load(const std::string& dir, TransformerOptions options,
                              const TpShard& shard) {
  const ModelConfig full = load_model_config(dir);
  ModelConfig local = tp_local_config(full, shard);
  NamedTensors weights = load_checkpoint(dir, model_param_specs(full), options.dtype,
                                         [&](const std::string& name, const at::Tensor& whole) {
                                           return tp_slice(name, whole, shard);
                                         });
  return Transformer(std::move(local), std::move(weights), options, tp_vocab_range(full, shard));
}

void Transformer::pack_merged_projections() {
  std::unordered_map<std::string, size_t> index;
  for (size_t i = 0; i < params_.size(); ++i) index[params_[i].first] = i;
  for (int64_t li = 0; li < config_.num_layers; ++li) {
    const std::string p = "model.layers." + std::to_string(li) + ".";
    for (const auto& group : merged_groups()) {
      std::vector<size_t> members_at;
      for (const char* suffix : group) {
        auto it = index.find(p + suffix);
        if (it != index.end()) members_at.push_back(it->second);
      }
      if (members_at.size() != group.size()) continue;  // no biases
      std::vector<const at::Tensor*> members;
      for (size_t i : members_at) members.push_back(&params_[i].second);
      if (adjacent_rows(members).defined()) continue;
      std::vector<at::Tensor> parts;
      for (size_t i : members_at) parts.push_back(params_[i].second);
      const at::Tensor whole = at::cat(parts, 0);
      int64_t row = 0;
      for (size_t i : members_at) {
        const int64_t rows = params_[i].second.size(0);
        params_[i].second = whole.narrow(0, row, rows);
        row += rows;
      }
    }
  }
}

bool Transformer::merges_projections() const {
  return options_.merge_projections && !options_.deterministic;
}

int64_t Transformer::merged_layers() const {
  if (!merges_projections()) return 0;
  int64_t n = 0;
  for (const Layer& l : layers_) {
    n += l.qkv_proj.defined() && l.gate_up_proj.defined();
  }
  return n;
}

void Transformer::bind_parameters() {
  std::unordered_map<std::string, at::Tensor> by_name;
  for (auto& [name, t] : params_) by_name[name] = t;
  auto get = [&](const std::string& name) -> at::Tensor {
    auto it = by_name.find(name);
    return it == by_name.end() ? at::Tensor() : it->second;
  };
  embed_ = get("model.embed_tokens.weight");
  final_norm_ = get("model.norm.weight");
  lm_head_ = config_.tie_word_embeddings ? embed_ : get("lm_head.weight");
  layers_.assign(config_.num_layers, Layer{});
  for (int64_t i = 0; i < config_.num_layers; ++i) {
    const std::string p = "model.layers." + std::to_string(i) + ".";
    Layer& l = layers_[i];
    l.input_norm = get(p + "input_layernorm.weight");
    l.q_proj = get(p + "self_attn.q_proj.weight");
    l.k_proj = get(p + "self_attn.k_proj.weight");
    l.v_proj = get(p + "self_attn.v_proj.weight");
    l.o_proj = get(p + "self_attn.o_proj.weight");
    l.q_bias = get(p + "self_attn.q_proj.bias");
    l.k_bias = get(p + "self_attn.k_proj.bias");
    l.v_bias = get(p + "self_attn.v_proj.bias");
    l.q_norm = get(p + "self_attn.q_norm.weight");
    l.k_norm = get(p + "self_attn.k_norm.weight");
    l.post_norm = get(p + "post_attention_layernorm.weight");
    l.gate_proj = get(p + "mlp.gate_proj.weight");
    l.up_proj = get(p + "mlp.up_proj.weight");
    l.down_proj = get(p + "mlp.down_proj.weight");
    if (options_.merge_projections) {
      l.qkv_proj = adjacent_rows({&l.q_proj, &l.k_proj, &l.v_proj});
      l.qkv_bias = adjacent_rows({&l.q_bias, &l.k_bias, &l.v_bias});
      if (l.q_bias.defined() && !l.qkv_bias.defined()) l.qkv_proj = at::Tensor();
      l.gate_up_proj = adjacent_rows({&l.gate_proj, &l.up_proj});
    }
  }
}

void Transformer::set_parameter(const std::string& name, const at::Tensor& value) {
  for (auto& [n, t] : params_) {
    if (n != name) continue;
    CRL_CHECK(value.sizes() == t.sizes() && value.scalar_type() == t.scalar_type(),
              "set_parameter '", name, "': got ", value.sizes(), " ", value.scalar_type(),
              ", expected ", t.sizes(), " ", t.scalar_type());
    t = value;
    bind_parameters();
    return;
  }
  throw std::invalid_argument("set_parameter: the model has no weight named '" + name + "'");
}

void Transformer::set_parameters(const NamedTensors& values) {
  if (values.size() != params_.size()) {
    throw std::invalid_argument("set_parameters: got " + std::to_string(values.size()) +
                                " tensors, the model has " + std::to_string(params_.size()));
  }
  set_parameters(0, values);
}

void Transformer::set_parameters(size_t first, const NamedTensors& values) {
  if (first + values.size() > params_.size()) {
    throw std::invalid_argument("set_parameters: tensors " + std::to_string(first) + ".." +
                                std::to_string(first + values.size()) + " of a model with " +
                                std::to_string(params_.size()));
  }
  for (size_t i = 0; i < values.size(); ++i) {
    const auto& [name, t] = params_[first + i];
    const auto& [new_name, v] = values[i];
    if (new_name != name || v.sizes() != t.sizes() || v.scalar_type() != t.scalar_type() ||
        v.device() != t.device()) {
      throw std::invalid_argument("set_parameters: tensor " + std::to_string(first + i) + " is '" +
                                  new_name + "' " + c10::str(v.sizes()) + " " +
                                  c10::str(v.scalar_type()) + ", expected '" + name + "' " +
                                  c10::str(t.sizes()) + " " + c10::str(t.scalar_type()));
    }
  }
  for (size_t i = 0; i < values.size(); ++i) params_[first + i].second = values[i].second;
  bind_parameters();
}

void Transformer::set_deterministic(bool on) {
  if (on && !options_.device.is_cpu()) {
    throw std::invalid_argument(
        "deterministic mode runs the project's CPU kernels; it is not "
        "available on " +
        options_.device.str());
  }
  options_.deterministic = on;
}

namespace {

// Which of the project's linear kernels beats the default path here (bench linear), if any.
// float32: bi_linear from 5 rows on an AVX2 or AVX-512 path (up to 4 rows the GEMV kernel ran
// 1.6-2.7x faster, equal at 8), with an autograd graph from 2 rows. bfloat16:
// bf16_dot_linear from 3 rows where the CPU has AVX512-BF16 (below that the GEMV kernel wins;
// from 3 to 512 rows it beat oneDNN's bf16 matmul by 1.06-4.3x). Never with an autograd graph.
enum class ProjectLinear { kNone, kFloat32, kFloat32WithGrad, kBf16Dot };

ProjectLinear project_linear_for(const at::Tensor& x, const at::Tensor& weight,
                                 const at::Tensor& bias) {
  if (x.dim() != 2 || x.size(0) < 2 || !x.is_cpu() || x.scalar_type() != weight.scalar_type()) {
    return ProjectLinear::kNone;
  }
  const bool graph = at::GradMode::is_enabled() && (x.requires_grad() || weight.requires_grad() ||
                                                    (bias.defined() && bias.requires_grad()));
  if (x.scalar_type() == at::kFloat && kernels::active_cpu_isa() != kernels::CpuIsa::kScalar) {
    if (graph) return ProjectLinear::kFloat32WithGrad;
    return x.size(0) >= 5 ? ProjectLinear::kFloat32 : ProjectLinear::kNone;
  }
  if (graph) return ProjectLinear::kNone;
  if (x.scalar_type() == at::kBFloat16 && x.size(0) >= 3 && kernels::bf16_dot_supported()) {
    return ProjectLinear::kBf16Dot;
  }
  return ProjectLinear::kNone;
}

// The RMSNorm and SiLU gate kernels: one pass and one allocation where libtorch takes five ops
// (norm) or two (gate), which is what a decode step of few tokens pays for. Same dtype, CPU, a
// vector path, no autograd graph.
bool project_rowwise_fits(std::initializer_list<const at::Tensor*> ts) {
  const at::Tensor& first = **ts.begin();
  if (!first.is_cpu() || kernels::active_cpu_isa() == kernels::CpuIsa::kScalar) return false;
  if (first.scalar_type() != at::kFloat && first.scalar_type() != at::kBFloat16) return false;
  for (const at::Tensor* t : ts) {
    if (t->scalar_type() != first.scalar_type() || !t->is_cpu()) return false;
    if (at::GradMode::is_enabled() && t->requires_grad()) return false;
  }
  return true;
}

}  // namespace

at::Tensor Transformer::linear(const at::Tensor& x, const at::Tensor& weight,
                               const at::Tensor& bias) const {
  if (options_.deterministic) return det_linear(x, weight, bias);
  if (options_.project_linear) {
    switch (project_linear_for(x, weight, bias)) {
      case ProjectLinear::kFloat32:
        return kernels::bi_linear(x, weight, bias);
      case ProjectLinear::kFloat32WithGrad:
        return kernel_linear(x, weight, bias);
      case ProjectLinear::kBf16Dot:
        return kernels::bf16_dot_linear(x, weight, bias);
      case ProjectLinear::kNone:
        break;
    }
  }
  return apply_linear(x, weight, bias);
}

bool Transformer::cuda_fused_fits(std::initializer_list<const at::Tensor*> ts) const {
  if (!options_.cuda_fused || !options_.device.is_cuda() || !kernels::cuda_ops_built())
    return false;
  for (const at::Tensor* t : ts) {
    if (!t->is_cuda() || (t->scalar_type() != at::kFloat && t->scalar_type() != at::kBFloat16))
      return false;
    if (at::GradMode::is_enabled() && t->requires_grad()) return false;
  }
  return true;
}

at::Tensor Transformer::rms_norm(const at::Tensor& x, const at::Tensor& weight) const {
  if (options_.deterministic) return det_rms_norm(x, weight, config_.rms_norm_eps);
  if (x.dim() == 2 && cuda_fused_fits({&x, &weight})) {
    return kernels::cuda_rms_norm(x.contiguous(), weight.contiguous(), config_.rms_norm_eps);
  }
  if (options_.project_linear && project_rowwise_fits({&x, &weight})) {
    return kernels::bi_rms_norm(x, weight, config_.rms_norm_eps);
  }
  return aten_rms_norm(x, weight, config_.rms_norm_eps);
}

at::Tensor Transformer::silu_mul(const at::Tensor& gate, const at::Tensor& up) const {
  if (options_.deterministic) return det_silu_mul(gate, up);
  if (cuda_fused_fits({&gate, &up})) {  // rows apart (a merged gate/up product) read in place
    const bool rows = gate.dim() == 2 && gate.stride(1) == 1 && up.stride(1) == 1;
    return kernels::cuda_silu_mul(rows ? gate : gate.contiguous(), rows ? up : up.contiguous());
  }
  if (options_.project_linear && project_rowwise_fits({&gate, &up}))
    return kernels::bi_silu_mul(gate, up);
  return at::silu(gate) * up;
}

at::Tensor Transformer::apply_rope(const at::Tensor& x, const at::Tensor& cos,
                                   const at::Tensor& sin) const {
  // x: [t, heads, head_dim]; cos, sin: [t, head_dim / 2]. HF's rotate_half convention.
  const int64_t half = x.size(-1) / 2;
  auto x1 = x.narrow(-1, 0, half);
  auto x2 = x.narrow(-1, half, half);
  auto c = cos.unsqueeze(1);
  auto s = sin.unsqueeze(1);
  return at::cat({x1 * c - x2 * s, x2 * c + x1 * s}, -1);
}

at::Tensor Transformer::adapted_linear(int64_t li, LoraTarget target, const at::Tensor& x,
                                       const at::Tensor& weight, const at::Tensor& bias,
                                       const LoraBatch& lora) const {
  if (fuses_lora(li, target, x, weight, bias, lora)) {
    // The engine's slots outside deterministic mode, on the project's float32 kernel: the adapter's
    // up-projection is a second depth segment of the base product, y = [x | x A^T] [W | s B]^T + b,
    // one product and no add per target. (Rounding differs from the path below, which rounds the
    // delta before adding it; deterministic mode keeps that one, the trainer's arithmetic.)
    if (lora.slot < 0 && !lora.runs.empty()) {
      // Rows of several slots, in runs: each run's x A^T and second segment on its own slot's A
      // and B only (a quarter of the masked product's work with four slots).
      std::vector<kernels::RowGroup> down, up;
      down.reserve(lora.runs.size());
      up.reserve(lora.runs.size());
      for (const LoraRowRun& r : lora.runs) {
        const bool on = r.slot >= 0;
        down.push_back({r.begin, r.end, on ? lora_->slot_a(li, target, r.slot) : at::Tensor()});
        up.push_back({r.begin, r.end, on ? lora_->slot_b(li, target, r.slot) : at::Tensor()});
      }
      return kernels::bi_linear(x, weight, bias,
                                kernels::bi_grouped_linear(x, down, lora_->max_rank()), up);
    }
    const at::Tensor xa = lora.slot >= 0 ? linear(x, lora_->slot_a(li, target, lora.slot))
                                         : linear(x, lora_->a(li, target)) * lora.mask;
    return kernels::bi_linear(
        x, weight, bias, xa,
        lora.slot >= 0 ? lora_->slot_b(li, target, lora.slot) : lora_->b(li, target));
  }
  at::Tensor y = linear(x, weight, bias);
  if (adapter_ != nullptr && adapter_->has(target)) {
    const int ti = static_cast<int>(target);
    const at::Tensor in = adapter_dropout_ > 0 && at::GradMode::is_enabled()
                              ? at::dropout(x, adapter_dropout_, /*train=*/true)
                              : x;
    y = y + linear(linear(in, adapter_->a[li][ti]), adapter_->b[li][ti] * adapter_->scaling());
  }
  if (lora_ == nullptr || !lora.active() || !lora_->targets(target)) return y;
  if (lora.slot >= 0) {  // one adapter for every row: its own A and B alone
    return y + linear(linear(x, lora_->slot_a(li, target, lora.slot)),
                      lora_->slot_b(li, target, lora.slot));
  }
  // ((x A^T) * mask) B^T: every slot's down-projection at once, each row keeping its own slot's.
  return y + linear(linear(x, lora_->a(li, target)) * lora.mask, lora_->b(li, target));
}

bool Transformer::fuses_lora(int64_t li, LoraTarget target, const at::Tensor& x,
                             const at::Tensor& weight, const at::Tensor& bias,
                             const LoraBatch& lora) const {
  return lora_ != nullptr && lora.active() && lora_->targets(target) && !options_.deterministic &&
         options_.project_linear && (adapter_ == nullptr || !adapter_->has(target)) &&
         project_linear_for(x, weight, bias) == ProjectLinear::kFloat32 &&
         lora_->a(li, target).scalar_type() == weight.scalar_type() &&
         !lora_->a(li, target).requires_grad() &&
         !lora_->b(li, target).requires_grad();  // no autograd here
}

at::Tensor Transformer::layer_forward(int64_t li, const at::Tensor& h, const Rope& rope,
                                      AttentionBackend& attention) const {
  const auto& c = config_;
  const int64_t t = h.size(0);
  const int64_t q_dim = c.num_heads * c.head_dim;
  const Layer& l = layers_[li];
  const LoraBatch& m = rope.lora;
  const int64_t kv_dim = c.num_kv_heads * c.head_dim;
  // Merged products (TransformerOptions::merge_projections) where no adapter changes a target.
  const bool merged = merges_projections() && adapter_ == nullptr && !(lora_ && m.active());
  auto n = rms_norm(h, l.input_norm);
  at::Tensor q, k, v;
  if (merged && l.qkv_proj.defined()) {
    const at::Tensor qkv = linear(n, l.qkv_proj, l.qkv_bias);  // [t, q_dim + 2 kv_dim]
    q = qkv.narrow(1, 0, q_dim).view({t, c.num_heads, c.head_dim});
    k = qkv.narrow(1, q_dim, kv_dim).view({t, c.num_kv_heads, c.head_dim});
    v = qkv.narrow(1, q_dim + kv_dim, kv_dim).view({t, c.num_kv_heads, c.head_dim});
  } else {
    q = adapted_linear(li, LoraTarget::kQ, n, l.q_proj, l.q_bias, m)
            .view({t, c.num_heads, c.head_dim});
    k = adapted_linear(li, LoraTarget::kK, n, l.k_proj, l.k_bias, m)
            .view({t, c.num_kv_heads, c.head_dim});
    v = adapted_linear(li, LoraTarget::kV, n, l.v_proj, l.v_bias, m)
            .view({t, c.num_kv_heads, c.head_dim});
  }
  if (c.qk_norm) {  // Qwen3: each head's q and k normalised over head_dim before RoPE
    q = rms_norm(q.reshape({t * c.num_heads, c.head_dim}), l.q_norm)
            .view({t, c.num_heads, c.head_dim});
    k = rms_norm(k.reshape({t * c.num_kv_heads, c.head_dim}), l.k_norm)
            .view({t, c.num_kv_heads, c.head_dim});
  }
  if (rope.cos.defined() || !cuda_fused_fits({&q, &k})) {
    const at::Tensor cos = rope.cos.defined()
                               ? rope.cos
                               : rope_cos_.index_select(0, rope.positions).to(options_.dtype);
    const at::Tensor sin = rope.sin.defined()
                               ? rope.sin
                               : rope_sin_.index_select(0, rope.positions).to(options_.dtype);
    q = apply_rope(q, cos, sin);
    k = apply_rope(k, cos, sin);
  } else {
    // In place; tokens may lie apart (the rows of a merged q/k/v product), each token's heads not.
    if (q.stride(2) != 1 || q.stride(1) != c.head_dim) q = q.contiguous();
    if (k.stride(2) != 1 || k.stride(1) != c.head_dim) k = k.contiguous();
    kernels::cuda_rope_(q, k, rope.positions, rope_cos_, rope_sin_);
  }
  auto attn =
      attention.attend(li, q.contiguous(), k.contiguous(), v.contiguous()).reshape({t, q_dim});
  auto o = adapted_linear(li, LoraTarget::kO, attn, l.o_proj, {}, m);
  if (row_reduce_) row_reduce_(o);
  auto h2 = h + o;
  auto n2 = rms_norm(h2, l.post_norm);
  at::Tensor gate, up;
  if (merged && l.gate_up_proj.defined()) {
    const at::Tensor gate_up = linear(n2, l.gate_up_proj);  // [t, 2 intermediate]
    const int64_t inter = l.gate_proj.size(0);
    gate = gate_up.narrow(1, 0, inter);  // rows strided: silu_mul reads them in place
    up = gate_up.narrow(1, inter, inter);
  } else {
    gate = adapted_linear(li, LoraTarget::kGate, n2, l.gate_proj, {}, m);
    up = adapted_linear(li, LoraTarget::kUp, n2, l.up_proj, {}, m);
  }
  auto down = adapted_linear(li, LoraTarget::kDown, silu_mul(gate, up), l.down_proj, {}, m);
  if (row_reduce_) row_reduce_(down);
  return h2 + down;
}

at::Tensor Transformer::forward_hidden(const at::Tensor& tokens, const at::Tensor& positions,
                                       AttentionBackend& attention, int64_t max_position,
                                       const LoraBatch& lora) const {
  const auto& c = config_;
  if (tokens.size(0) > 0 && max_position >= c.max_position_embeddings) {
    throw std::invalid_argument("position " + std::to_string(max_position) +
                                " exceeds max_position_embeddings " +
                                std::to_string(c.max_position_embeddings));
  }
  at::Tensor h;  // [T, hidden]
  if (!splits_vocab()) {
    h = embed_.index_select(0, tokens);
  } else {
    // This shard's rows; zeros for the other shards' tokens, whose rows the group's sum adds (a sum
    // of one row and zeros: the whole embedding's bits).
    CRL_CHECK(row_reduce_, "forward_hidden: a split vocabulary needs set_row_parallel_reduce");
    const at::Tensor local = tokens - vocab_.start;
    const at::Tensor outside = local.lt(0).logical_or_(local.ge(vocab_.rows));
    h = embed_.index_select(0, local.clamp(0, vocab_.rows - 1));
    h.masked_fill_(outside.unsqueeze(1), 0);
    row_reduce_(h);
  }
  if (lora.active()) {
    CRL_CHECK(lora_ != nullptr, "forward_hidden: LoRA rows without LoRA slots");
    CRL_CHECK(lora.slot < lora_->num_slots(), "forward_hidden: LoRA slot ", lora.slot, " of ",
              lora_->num_slots());
    CRL_CHECK(lora.slot >= 0 || (lora.mask.dim() == 2 && lora.mask.size(0) == tokens.size(0) &&
                                 lora.mask.size(1) == lora_->num_slots() * lora_->max_rank()),
              "forward_hidden: LoRA mask ", lora.mask.sizes(), " for ", tokens.size(0),
              " rows and ", lora_->num_slots(), " slots of rank ", lora_->max_rank());
  }
  Rope rope{positions, {}, {}, lora};
  if (!cuda_fused_fits({&h})) {  // the fused kernel reads the tables itself
    rope.cos = rope_cos_.index_select(0, positions).to(options_.dtype);
    rope.sin = rope_sin_.index_select(0, positions).to(options_.dtype);
  }

  for (int64_t li = 0; li < c.num_layers; ++li) {
    if (!layer_runner_) {
      h = layer_forward(li, h, rope, attention);
      continue;
    }
    auto fn = std::make_shared<LayerFn>([this, li, rope, &attention](const at::Tensor& x) {
      return layer_forward(li, x, rope, attention);
    });
    h = layer_runner_(li, h, std::move(fn));
  }
  return rms_norm(h, final_norm_);
}

at::Tensor Transformer::compute_logits(const at::Tensor& hidden) const {
  return compute_logits(hidden, lm_head_);
}

at::Tensor Transformer::compute_logits(const at::Tensor& hidden, const at::Tensor& lm_head) const {
  return linear(hidden, lm_head).to(at::kFloat);
}

at::Tensor Transformer::forward_packed(const at::Tensor& tokens,
                                       const std::vector<int64_t>& seq_lens) const {
  std::vector<at::Tensor> pos;
  for (int64_t len : seq_lens) pos.push_back(at::arange(len, at::kLong));
  auto positions = (pos.size() == 1 ? pos[0] : at::cat(pos, 0)).to(options_.device);
  DenseCausalAttention attention(seq_lens);
  const int64_t longest =
      seq_lens.empty() ? 0 : *std::max_element(seq_lens.begin(), seq_lens.end());
  // Token ids may come from the host (tests, the trainer's packed batches): gather on the device.
  return compute_logits(
      forward_hidden(tokens.to(options_.device), positions, attention, longest - 1));
}

}  // namespace crl::engine
