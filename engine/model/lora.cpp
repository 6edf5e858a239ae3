#include "engine/model/lora.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <regex>
#include <stdexcept>

#include "common/check.h"
#include "engine/model/model_writer.h"
#include "engine/model/safetensors.h"

namespace crl::engine {

namespace fs = std::filesystem;

namespace {

constexpr std::array<LoraTarget, kNumLoraTargets> kAllTargets = {
    LoraTarget::kQ,    LoraTarget::kK,  LoraTarget::kV,   LoraTarget::kO,
    LoraTarget::kGate, LoraTarget::kUp, LoraTarget::kDown};

bool is_attention(LoraTarget t) {
  return t == LoraTarget::kQ || t == LoraTarget::kK || t == LoraTarget::kV || t == LoraTarget::kO;
}

std::optional<LoraTarget> target_from_name(const std::string& s) {
  for (LoraTarget t : kAllTargets) {
    const std::string full = lora_target_name(t);
    if (s == full || s == full.substr(0, full.size() - 5)) return t;  // "q_proj" or "q"
  }
  return std::nullopt;
}

// The base weight a target adapts: its name in model_param_specs.
std::string base_weight_name(int64_t li, LoraTarget t) {
  return "model.layers." + std::to_string(li) + (is_attention(t) ? ".self_attn." : ".mlp.") +
         lora_target_name(t) + ".weight";
}

}  // namespace

const char* lora_target_name(LoraTarget t) {
  switch (t) {
    case LoraTarget::kQ:
      return "q_proj";
    case LoraTarget::kK:
      return "k_proj";
    case LoraTarget::kV:
      return "v_proj";
    case LoraTarget::kO:
      return "o_proj";
    case LoraTarget::kGate:
      return "gate_proj";
    case LoraTarget::kUp:
      return "up_proj";
    case LoraTarget::kDown:
      return "down_proj";
  }
  return "?";
}

std::vector<LoraTarget> parse_lora_targets(const std::string& spec) {
  if (spec == "all-linear" || spec == "all") return {kAllTargets.begin(), kAllTargets.end()};
  std::vector<LoraTarget> out;
  size_t start = 0;
  while (start <= spec.size()) {
    const size_t comma = spec.find(',', start);
    const std::string item =
        spec.substr(start, comma == std::string::npos ? std::string::npos : comma - start);
    if (!item.empty()) {
      const auto t = target_from_name(item);
      if (!t) {
        throw std::invalid_argument(
            "LoRA target '" + item +
            "': expected all-linear or a list of q, k, v, o, gate, up, down");
      }
      if (std::find(out.begin(), out.end(), *t) == out.end()) out.push_back(*t);
    }
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  if (out.empty()) throw std::invalid_argument("LoRA targets '" + spec + "': none given");
  return out;
}

std::pair<int64_t, int64_t> lora_target_shape(const ModelConfig& c, LoraTarget t) {
  const int64_t h = c.hidden_size, q = c.num_heads * c.head_dim, kv = c.num_kv_heads * c.head_dim;
  switch (t) {
    case LoraTarget::kQ:
      return {h, q};
    case LoraTarget::kK:
      return {h, kv};
    case LoraTarget::kV:
      return {h, kv};
    case LoraTarget::kO:
      return {q, h};
    case LoraTarget::kGate:
      return {h, c.intermediate_size};
    case LoraTarget::kUp:
      return {h, c.intermediate_size};
    case LoraTarget::kDown:
      return {c.intermediate_size, h};
  }
  return {0, 0};
}

bool LoraAdapter::has(LoraTarget t) const {
  return std::find(targets.begin(), targets.end(), t) != targets.end();
}

std::string LoraAdapter::peft_name(int64_t li, LoraTarget t, bool is_a) {
  return "base_model.model.model.layers." + std::to_string(li) +
         (is_attention(t) ? ".self_attn." : ".mlp.") + lora_target_name(t) +
         (is_a ? ".lora_A.weight" : ".lora_B.weight");
}

LoraAdapter make_lora_adapter(const ModelConfig& config, int64_t rank, double alpha,
                              const std::vector<LoraTarget>& targets, uint64_t seed,
                              bool random_b) {
  CRL_CHECK(rank >= 1, "LoRA rank must be >= 1, got ", rank);
  LoraAdapter ad;
  ad.rank = rank;
  ad.alpha = alpha;
  ad.targets = targets;
  ad.a.resize(config.num_layers);
  ad.b.resize(config.num_layers);
  at::Generator gen = at::detail::createCPUGenerator(seed);
  for (int64_t li = 0; li < config.num_layers; ++li) {
    for (LoraTarget t : targets) {
      const auto [in, out] = lora_target_shape(config, t);
      const int ti = static_cast<int>(t);
      ad.a[li][ti] = at::normal(0.0, 1.0 / std::sqrt(static_cast<double>(in)), {rank, in}, gen);
      ad.b[li][ti] = random_b ? at::normal(0.0, 0.02, {out, rank}, gen) : at::zeros({out, rank});
    }
  }
  return ad;
}

NamedTensors lora_tensors(const LoraAdapter& adapter) {
  NamedTensors out;
  for (size_t li = 0; li < adapter.a.size(); ++li) {
    for (int ti = 0; ti < kNumLoraTargets; ++ti) {
      const auto t = static_cast<LoraTarget>(ti);
      if (!adapter.has(t)) continue;
      out.emplace_back(LoraAdapter::peft_name(static_cast<int64_t>(li), t, true),
                       adapter.a[li][ti]);
      out.emplace_back(LoraAdapter::peft_name(static_cast<int64_t>(li), t, false),
                       adapter.b[li][ti]);
    }
  }
  return out;
}

LoraAdapter lora_with_tensors(const LoraAdapter& like, const NamedTensors& tensors) {
  LoraAdapter ad;
  ad.rank = like.rank;
  ad.alpha = like.alpha;
  ad.targets = like.targets;
  ad.a.resize(like.a.size());
  ad.b.resize(like.b.size());
  size_t k = 0;
  for (size_t li = 0; li < like.a.size(); ++li) {
    for (int ti = 0; ti < kNumLoraTargets; ++ti) {
      const auto t = static_cast<LoraTarget>(ti);
      if (!like.has(t)) continue;
      for (bool is_a : {true, false}) {
        const std::string name = LoraAdapter::peft_name(static_cast<int64_t>(li), t, is_a);
        const at::Tensor& ref = is_a ? like.a[li][ti] : like.b[li][ti];
        if (k >= tensors.size() || tensors[k].first != name ||
            tensors[k].second.sizes() != ref.sizes()) {
          throw std::invalid_argument("LoRA tensor " + std::to_string(k) + " should be '" + name +
                                      "' of shape " + c10::str(ref.sizes()) + ", got " +
                                      (k < tensors.size() ? "'" + tensors[k].first + "' " +
                                                                c10::str(tensors[k].second.sizes())
                                                          : std::string("none")));
        }
        (is_a ? ad.a[li][ti] : ad.b[li][ti]) = tensors[k++].second;
      }
    }
  }
  if (k != tensors.size()) {
    throw std::invalid_argument("LoRA tensors: " + std::to_string(tensors.size() - k) +
                                " more than the adapter's " + std::to_string(k) + " (first: '" +
                                tensors[k].first + "')");
  }
  return ad;
}

LoraAdapter load_peft_adapter(const std::string& dir, const ModelConfig& config) {
  const std::string cfg_path = dir + "/adapter_config.json";
  const std::string st_path = dir + "/adapter_model.safetensors";
  std::ifstream in(cfg_path);
  if (!in) throw std::invalid_argument("LoRA adapter " + dir + ": no adapter_config.json");
  nlohmann::json j;
  try {
    in >> j;
  } catch (const std::exception& e) {
    throw std::invalid_argument(cfg_path + ": not valid JSON (" + e.what() + ")");
  }
  auto bad = [&](const std::string& what) { return std::invalid_argument(cfg_path + ": " + what); };
  LoraAdapter ad;
  try {
    if (!j.is_object()) throw bad("not a JSON object");
    if (j.value("peft_type", std::string("LORA")) != "LORA") {
      throw bad("peft_type '" + j.value("peft_type", std::string()) + "' is not LORA");
    }
    if (!j.contains("r") || !j["r"].is_number_integer() || j["r"].get<int64_t>() < 1) {
      throw bad("'r' must be a positive integer");
    }
    auto flag = [&](const char* key) {
      return j.contains(key) && !j[key].is_null() && j[key].get<bool>();
    };
    if (flag("use_rslora")) throw bad("use_rslora adapters are not supported");
    if (flag("use_dora")) throw bad("DoRA adapters are not supported");
    if (flag("fan_in_fan_out")) throw bad("fan_in_fan_out adapters are not supported");
    for (const char* key : {"rank_pattern", "alpha_pattern"}) {  // per-module ranks or scalings
      if (j.contains(key) && !j[key].is_null() && !j[key].empty())
        throw bad(std::string(key) + " is not supported");
    }
    ad.rank = j["r"].get<int64_t>();
    ad.alpha = j.contains("lora_alpha") && !j["lora_alpha"].is_null()
                   ? j["lora_alpha"].get<double>()
                   : 8.0;  // PEFT's default
    const auto& tm = j.contains("target_modules") ? j["target_modules"] : nlohmann::json();
    if (tm.is_string()) {
      ad.targets = parse_lora_targets(tm.get<std::string>());
    } else if (tm.is_array()) {
      std::string list;
      for (const auto& e : tm) list += (list.empty() ? "" : ",") + e.get<std::string>();
      ad.targets = parse_lora_targets(list);
    } else {
      throw bad("'target_modules' must be a list of module names or \"all-linear\"");
    }
  } catch (const nlohmann::json::exception& e) {
    throw bad(std::string("a field has the wrong type (") + e.what() + ")");
  } catch (const std::invalid_argument& e) {
    const std::string what = e.what();
    if (what.rfind(cfg_path, 0) == 0) throw;
    throw bad(what);
  }
  ad.a.resize(config.num_layers);
  ad.b.resize(config.num_layers);

  if (!fs::exists(st_path))
    throw std::invalid_argument("LoRA adapter " + dir + ": no adapter_model.safetensors");
  const auto file = SafetensorsFile::open(st_path);
  static const std::regex kName(
      R"(^(?:base_model\.model\.)?model\.layers\.(\d+)\.(self_attn|mlp)\.([a-z_]+)\.lora_([AB])(?:\.default)?\.weight$)");
  for (const auto& [name, info] : file->tensors()) {
    std::smatch m;
    if (!std::regex_match(name, m, kName)) {
      throw std::invalid_argument(st_path + ": tensor '" + name +
                                  "' is not a LoRA A or B weight of a decoder layer's linear");
    }
    const int64_t li = m[1].str().size() > 9 ? config.num_layers : std::stoll(m[1].str());
    const auto t = target_from_name(m[3].str());
    if (li >= config.num_layers) {
      throw std::invalid_argument(st_path + ": tensor '" + name + "' is for layer " +
                                  std::to_string(li) + ", the model has " +
                                  std::to_string(config.num_layers));
    }
    if (!t || !ad.has(*t)) {
      throw std::invalid_argument(st_path + ": tensor '" + name + "' adapts '" + m[3].str() +
                                  "', not among the adapter's target_modules");
    }
    const bool is_a = m[4].str() == "A";
    const auto [fin, fout] = lora_target_shape(config, *t);
    const std::vector<int64_t> want =
        is_a ? std::vector<int64_t>{ad.rank, fin} : std::vector<int64_t>{fout, ad.rank};
    if (info.shape != want) {
      throw std::invalid_argument(st_path + ": tensor '" + name + "' has shape " +
                                  c10::str(at::IntArrayRef(info.shape)) + ", the model needs " +
                                  c10::str(at::IntArrayRef(want)));
    }
    at::Tensor w = file->load(name, at::kFloat);
    // Served unmerged in a batch with other adapters, a NaN would reach every row: rows of other
    // slots are zeroed by a mask product, and NaN * 0 is NaN.
    if (!at::isfinite(w).all().item<bool>()) {
      throw std::invalid_argument(st_path + ": tensor '" + name + "' holds NaN or infinite values");
    }
    (is_a ? ad.a : ad.b)[li][static_cast<int>(*t)] = std::move(w);
  }
  for (int64_t li = 0; li < config.num_layers; ++li) {
    for (LoraTarget t : ad.targets) {
      const int ti = static_cast<int>(t);
      if (!ad.a[li][ti].defined() || !ad.b[li][ti].defined()) {
        throw std::invalid_argument(st_path + ": no '" +
                                    LoraAdapter::peft_name(li, t, !ad.a[li][ti].defined()) +
                                    "' (target_modules names " + lora_target_name(t) + ")");
      }
    }
  }
  return ad;
}

void save_peft_adapter(const LoraAdapter& adapter, const std::string& dir,
                       const std::string& base_model_name) {
  fs::create_directories(dir);
  std::vector<std::pair<std::string, at::Tensor>> tensors;
  nlohmann::json modules = nlohmann::json::array();
  for (LoraTarget t : adapter.targets) modules.push_back(lora_target_name(t));
  for (size_t li = 0; li < adapter.a.size(); ++li) {
    for (LoraTarget t : adapter.targets) {
      const int ti = static_cast<int>(t);
      tensors.emplace_back(LoraAdapter::peft_name(static_cast<int64_t>(li), t, true),
                           adapter.a[li][ti].contiguous());
      tensors.emplace_back(LoraAdapter::peft_name(static_cast<int64_t>(li), t, false),
                           adapter.b[li][ti].contiguous());
    }
  }
  write_safetensors(dir + "/adapter_model.safetensors", tensors, {{"format", "pt"}});
  const nlohmann::json cfg = {{"peft_type", "LORA"},
                              {"task_type", "CAUSAL_LM"},
                              {"r", adapter.rank},
                              {"lora_alpha", adapter.alpha},
                              {"lora_dropout", 0.0},
                              {"bias", "none"},
                              {"target_modules", modules},
                              {"fan_in_fan_out", false},
                              {"use_rslora", false},
                              {"inference_mode", true},
                              {"base_model_name_or_path", base_model_name}};
  const std::string tmp = dir + "/adapter_config.json.tmp";
  {
    std::ofstream out(tmp);
    out << cfg.dump(2) << "\n";
    if (!out) throw std::runtime_error("cannot write " + tmp);
  }
  fs::rename(tmp, dir + "/adapter_config.json");
}

NamedTensors merge_lora(const NamedTensors& base, const LoraAdapter& adapter,
                        const ModelConfig& config) {
  NamedTensors out = base;
  std::map<std::string, size_t> index;
  for (size_t i = 0; i < out.size(); ++i) index[out[i].first] = i;
  for (int64_t li = 0; li < config.num_layers; ++li) {
    for (LoraTarget t : adapter.targets) {
      const int ti = static_cast<int>(t);
      auto it = index.find(base_weight_name(li, t));
      CRL_CHECK(it != index.end(), "merge_lora: the model has no '", base_weight_name(li, t), "'");
      at::Tensor& w = out[it->second].second;
      const at::Tensor delta =
          at::matmul(adapter.b[li][ti].to(at::kDouble), adapter.a[li][ti].to(at::kDouble)) *
          adapter.scaling();
      w = (w.to(at::kCPU, at::kDouble) + delta).to(w.device(), w.scalar_type());
    }
  }
  return out;
}

void write_merged_lora_model(const std::string& model_dir, const std::string& lora_dir,
                             const std::string& out_dir, const std::string& dtype) {
  if (dtype != "float32" && dtype != "bfloat16") {
    throw std::invalid_argument("merged model dtype '" + dtype + "': expected float32 or bfloat16");
  }
  ModelConfig config = load_model_config(model_dir);
  const LoraAdapter adapter = load_peft_adapter(lora_dir, config);
  config.torch_dtype = dtype;  // what the files hold, not the base's (HF loaders trust the field)
  NamedTensors merged = merge_lora(
      load_checkpoint(model_dir, model_param_specs(config), at::kFloat), adapter, config);
  if (dtype == "bfloat16") {
    for (auto& [name, t] : merged) t = t.to(at::kBFloat16);
  }
  write_model_dir(out_dir, config, merged, model_dir);
}

LoraSlots::LoraSlots(const ModelConfig& config, int64_t num_slots, int64_t max_rank,
                     std::vector<LoraTarget> targets, at::ScalarType dtype, at::Device device)
    : config_(config), num_slots_(num_slots), max_rank_(max_rank), dtype_(dtype), device_(device) {
  CRL_CHECK(num_slots >= 1 && max_rank >= 1, "LoRA slots: need >= 1 slot and rank >= 1, got ",
            num_slots, " slots of rank ", max_rank);
  for (LoraTarget t : targets) enabled_[static_cast<int>(t)] = true;
  a_.resize(config.num_layers);
  b_.resize(config.num_layers);
  slot_b_.assign(static_cast<size_t>(num_slots),
                 std::vector<std::array<at::Tensor, kNumLoraTargets>>(config.num_layers));
  const auto opts = at::TensorOptions().dtype(dtype).device(device);
  for (int64_t li = 0; li < config.num_layers; ++li) {
    for (LoraTarget t : targets) {
      const auto [in, out] = lora_target_shape(config, t);
      a_[li][static_cast<int>(t)] = at::zeros({num_slots * max_rank, in}, opts);
      b_[li][static_cast<int>(t)] = at::zeros({out, num_slots * max_rank}, opts);
      // One slot: b_ is that slot's B, contiguous already (no second copy to keep in step).
      for (auto& slot : slot_b_) {
        slot[li][static_cast<int>(t)] =
            num_slots == 1 ? b_[li][static_cast<int>(t)] : at::zeros({out, max_rank}, opts);
      }
    }
  }
}

void LoraSlots::load(int64_t slot, const LoraAdapter& ad) {
  CRL_CHECK(slot >= 0 && slot < num_slots_, "LoRA slot ", slot, " outside [0, ", num_slots_, ")");
  if (ad.rank > max_rank_) {
    throw std::invalid_argument("LoRA adapter of rank " + std::to_string(ad.rank) +
                                " exceeds the engine's max LoRA rank " + std::to_string(max_rank_) +
                                " (--max-lora-rank)");
  }
  if (static_cast<int64_t>(ad.a.size()) != config_.num_layers) {
    throw std::invalid_argument("LoRA adapter has " + std::to_string(ad.a.size()) +
                                " layers, the model " + std::to_string(config_.num_layers));
  }
  for (LoraTarget t : ad.targets) {
    if (!targets(t)) {
      throw std::invalid_argument(std::string("LoRA adapter targets ") + lora_target_name(t) +
                                  ", which the engine's LoRA slots do not (--lora-targets)");
    }
  }
  for (int64_t li = 0; li < config_.num_layers; ++li) {
    for (LoraTarget t : ad.targets) {
      const int ti = static_cast<int>(t);
      const auto [in, out] = lora_target_shape(config_, t);
      const at::Tensor& a = ad.a[li][ti];
      const at::Tensor& b = ad.b[li][ti];
      if (!a.defined() || !b.defined() || a.sizes() != at::IntArrayRef({ad.rank, in}) ||
          b.sizes() != at::IntArrayRef({out, ad.rank})) {
        throw std::invalid_argument("LoRA adapter tensor '" + LoraAdapter::peft_name(li, t, true) +
                                    "' or its B does not have the shapes [" +
                                    std::to_string(ad.rank) + ", " + std::to_string(in) + "] / [" +
                                    std::to_string(out) + ", " + std::to_string(ad.rank) + "]");
      }
    }
  }
  // An adapter that fills the slot (its rank, every target the slots hold: an RL policy update)
  // overwrites every value, so the slot is not zeroed first.
  bool fills = ad.rank == max_rank_;
  for (int ti = 0; ti < kNumLoraTargets; ++ti)
    fills = fills && (!enabled_[ti] || ad.has(static_cast<LoraTarget>(ti)));
  if (!fills) clear(slot);
  const int64_t c0 = slot * max_rank_;
  for (int64_t li = 0; li < config_.num_layers; ++li) {
    for (LoraTarget t : ad.targets) {
      const int ti = static_cast<int>(t);
      a_[li][ti].narrow(0, c0, ad.rank).copy_(ad.a[li][ti]);
      // B scaled in float32, then rounded once to the slots' dtype (the trainer's arithmetic).
      b_[li][ti].narrow(1, c0, ad.rank).copy_(ad.b[li][ti].to(at::kFloat) * ad.scaling());
      at::Tensor& own = slot_b_[static_cast<size_t>(slot)][li][ti];
      if (!own.is_same(b_[li][ti])) own.copy_(b_[li][ti].narrow(1, c0, max_rank_));
    }
  }
}

void LoraSlots::clear(int64_t slot) {
  CRL_CHECK(slot >= 0 && slot < num_slots_, "LoRA slot ", slot, " outside [0, ", num_slots_, ")");
  for (auto& layer : a_) {
    for (auto& t : layer) {
      if (t.defined()) t.narrow(0, slot * max_rank_, max_rank_).zero_();
    }
  }
  for (auto& layer : b_) {
    for (auto& t : layer) {
      if (t.defined()) t.narrow(1, slot * max_rank_, max_rank_).zero_();
    }
  }
  for (auto& t : slot_b_[static_cast<size_t>(slot)]) {
    for (auto& b : t) {
      if (b.defined()) b.zero_();
    }
  }
}

at::Tensor LoraSlots::row_mask(const std::vector<int32_t>& row_slots, bool on_host) const {
  const int64_t rows = static_cast<int64_t>(row_slots.size());
  at::Tensor m = at::zeros({rows, num_slots_ * max_rank_}, at::kFloat);
  float* p = m.data_ptr<float>();
  for (int64_t r = 0; r < rows; ++r) {
    const int32_t s = row_slots[r];
    if (s < 0) continue;
    CRL_CHECK(s < num_slots_, "LoRA slot ", s, " outside [0, ", num_slots_, ")");
    std::fill(p + r * num_slots_ * max_rank_ + s * max_rank_,
              p + r * num_slots_ * max_rank_ + (s + 1) * max_rank_, 1.0f);
  }
  return on_host ? m.to(dtype_) : m.to(device_, dtype_);
}

std::vector<LoraRowRun> lora_row_runs(const std::vector<int32_t>& row_slots) {
  std::vector<LoraRowRun> runs;
  for (size_t i = 0; i < row_slots.size(); ++i) {
    if (runs.empty() || runs.back().slot != row_slots[i]) {
      runs.push_back({static_cast<int64_t>(i), static_cast<int64_t>(i), row_slots[i]});
    }
    runs.back().end = static_cast<int64_t>(i) + 1;
  }
  return runs;
}

}  // namespace crl::engine
