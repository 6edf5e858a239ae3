#include "engine/model/transformer.h"

#include <cmath>
#include <stdexcept>
#include <unordered_map>

#include "common/check.h"
#include "engine/model/linear.h"

namespace crl::engine {

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

Transformer::Transformer(ModelConfig config, NamedTensors weights, TransformerOptions options)
    : config_(std::move(config)), options_(options), params_(std::move(weights)) {
  config_.validate();
  if (options_.dtype != at::kFloat && options_.dtype != at::kBFloat16) {
    throw std::invalid_argument("model compute dtype must be float32 or bfloat16, got " +
                                dtype_name(options_.dtype));
  }
  auto specs = model_param_specs(config_);
  if (specs.size() != params_.size()) {
    throw std::invalid_argument("model expects " + std::to_string(specs.size()) +
                                " weights, got " + std::to_string(params_.size()));
  }
  for (size_t i = 0; i < specs.size(); ++i) {
    auto& [name, tensor] = params_[i];
    if (name != specs[i].name) {
      throw std::invalid_argument("weight " + std::to_string(i) + " is '" + name + "', expected '" +
                                  specs[i].name + "'");
    }
    if (tensor.sizes() != at::IntArrayRef(specs[i].shape)) {
      throw std::invalid_argument("weight '" + name + "' has shape " +
                                  c10::str(tensor.sizes()) + ", expected " +
                                  c10::str(at::IntArrayRef(specs[i].shape)));
    }
    if (tensor.scalar_type() != options_.dtype || tensor.device() != options_.device) {
      tensor = tensor.to(options_.device, options_.dtype).contiguous();
    }
  }
  bind_parameters();

  const int64_t max_pos = config_.max_position_embeddings;
  auto inv_freq = rope_inv_freq(config_);
  auto pos = at::arange(0, max_pos, at::kFloat);
  auto freqs = at::outer(pos, inv_freq);  // [max_pos, head_dim / 2]
  rope_cos_ = freqs.cos().to(options_.device);
  rope_sin_ = freqs.sin().to(options_.device);
}

Transformer Transformer::load(const std::string& dir, TransformerOptions options) {
  ModelConfig config = load_model_config(dir);
  NamedTensors weights = load_checkpoint(dir, model_param_specs(config), options.dtype);
  return Transformer(std::move(config), std::move(weights), options);
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
    l.post_norm = get(p + "post_attention_layernorm.weight");
    l.gate_proj = get(p + "mlp.gate_proj.weight");
    l.up_proj = get(p + "mlp.up_proj.weight");
    l.down_proj = get(p + "mlp.down_proj.weight");
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
  for (size_t i = 0; i < values.size(); ++i) {
    const auto& [name, t] = params_[i];
    const auto& [new_name, v] = values[i];
    if (new_name != name || v.sizes() != t.sizes() || v.scalar_type() != t.scalar_type() ||
        v.device() != t.device()) {
      throw std::invalid_argument("set_parameters: tensor " + std::to_string(i) + " is '" +
                                  new_name + "' " + c10::str(v.sizes()) + " " +
                                  c10::str(v.scalar_type()) + ", expected '" + name + "' " +
                                  c10::str(t.sizes()) + " " + c10::str(t.scalar_type()));
    }
  }
  for (size_t i = 0; i < values.size(); ++i) params_[i].second = values[i].second;
  bind_parameters();
}

at::Tensor Transformer::rms_norm(const at::Tensor& x, const at::Tensor& weight) const {
  auto xf = x.to(at::kFloat);
  auto var = xf.pow(2).mean(-1, /*keepdim=*/true);
  auto normed = (xf * at::rsqrt(var + config_.rms_norm_eps)).to(x.scalar_type());
  return normed * weight;
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

template <typename Fn>
at::Tensor Transformer::map_rows(const at::Tensor& x, Fn&& fn) const {
  const int64_t rows = x.size(0);
  if (!options_.deterministic) return fn(x, int64_t{0}, rows);
  constexpr int64_t tile = kDeterministicTile;
  std::vector<at::Tensor> outs;
  for (int64_t start = 0; start < rows; start += tile) {
    const int64_t len = std::min(tile, rows - start);
    at::Tensor piece = x.narrow(0, start, len);
    if (len < tile) {
      std::vector<int64_t> shape(x.sizes().begin(), x.sizes().end());
      shape[0] = tile - len;
      piece = at::cat({piece, at::zeros(shape, x.options())}, 0);
    }
    outs.push_back(fn(piece, start, len).narrow(0, 0, len));
  }
  if (outs.empty()) return fn(x, int64_t{0}, rows);
  return outs.size() == 1 ? outs[0] : at::cat(outs, 0);
}

at::Tensor Transformer::forward_hidden(const at::Tensor& tokens, const at::Tensor& positions,
                                       AttentionBackend& attention) const {
  const auto& c = config_;
  const int64_t t = tokens.size(0);
  const int64_t q_dim = c.num_heads * c.head_dim;
  const int64_t kv_dim = c.num_kv_heads * c.head_dim;
  if (t > 0) {
    auto max_pos = positions.max().item<int64_t>();
    if (max_pos >= c.max_position_embeddings) {
      throw std::invalid_argument("position " + std::to_string(max_pos) +
                                  " exceeds max_position_embeddings " +
                                  std::to_string(c.max_position_embeddings));
    }
  }
  auto cos = rope_cos_.index_select(0, positions).to(options_.dtype);
  auto sin = rope_sin_.index_select(0, positions).to(options_.dtype);
  auto h = embed_.index_select(0, tokens);  // [T, hidden]

  for (int64_t li = 0; li < c.num_layers; ++li) {
    const Layer& l = layers_[li];
    // Stage A (row-wise): norm, q/k/v projections, RoPE. Returns [t, q_dim + 2 * kv_dim].
    auto qkv = map_rows(h, [&](const at::Tensor& x, int64_t start, int64_t len) {
      const int64_t rows = x.size(0);
      auto cs = cos.narrow(0, start, len);
      auto sn = sin.narrow(0, start, len);
      if (rows > len) {
        cs = at::cat({cs, at::zeros({rows - len, cs.size(1)}, cs.options())}, 0);
        sn = at::cat({sn, at::zeros({rows - len, sn.size(1)}, sn.options())}, 0);
      }
      auto n = rms_norm(x, l.input_norm);
      auto q = apply_linear(n, l.q_proj, l.q_bias).view({rows, c.num_heads, c.head_dim});
      auto k = apply_linear(n, l.k_proj, l.k_bias).view({rows, c.num_kv_heads, c.head_dim});
      auto v = apply_linear(n, l.v_proj, l.v_bias);
      q = apply_rope(q, cs, sn).reshape({rows, q_dim});
      k = apply_rope(k, cs, sn).reshape({rows, kv_dim});
      return at::cat({q, k, v}, 1);
    });
    auto q = qkv.narrow(1, 0, q_dim).view({t, c.num_heads, c.head_dim});
    auto k = qkv.narrow(1, q_dim, kv_dim).view({t, c.num_kv_heads, c.head_dim});
    auto v = qkv.narrow(1, q_dim + kv_dim, kv_dim).view({t, c.num_kv_heads, c.head_dim});
    auto attn = attention.attend(li, q.contiguous(), k.contiguous(), v.contiguous())
                    .reshape({t, q_dim});
    // Stage B (row-wise): output projection, residual, MLP, residual.
    auto hx = at::cat({h, attn}, 1);
    h = map_rows(hx, [&](const at::Tensor& x, int64_t, int64_t) {
      auto resid = x.narrow(1, 0, c.hidden_size);
      auto a = x.narrow(1, c.hidden_size, q_dim);
      auto h2 = resid + apply_linear(a, l.o_proj);
      auto n = rms_norm(h2, l.post_norm);
      auto mlp = at::silu(apply_linear(n, l.gate_proj)) * apply_linear(n, l.up_proj);
      return h2 + apply_linear(mlp, l.down_proj);
    });
  }
  return map_rows(h, [&](const at::Tensor& x, int64_t, int64_t) { return rms_norm(x, final_norm_); });
}

at::Tensor Transformer::compute_logits(const at::Tensor& hidden) const {
  return map_rows(hidden, [&](const at::Tensor& x, int64_t, int64_t) {
    return apply_linear(x, lm_head_).to(at::kFloat);
  });
}

at::Tensor Transformer::forward_packed(const at::Tensor& tokens,
                                       const std::vector<int64_t>& seq_lens) const {
  std::vector<at::Tensor> pos;
  for (int64_t len : seq_lens) pos.push_back(at::arange(len, at::kLong));
  auto positions = (pos.size() == 1 ? pos[0] : at::cat(pos, 0)).to(options_.device);
  DenseCausalAttention attention(seq_lens);
  return compute_logits(forward_hidden(tokens, positions, attention));
}

}  // namespace crl::engine
