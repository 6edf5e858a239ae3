#include "trainer/memory_plan.h"

#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <functional>
#include <map>
#include <stdexcept>

#include "common/units.h"
#include "engine/model/lora.h"
#include "engine/model/tensor_parallel.h"
#include "sync/cuda_ipc.h"
#include "sync/weight_layout.h"
#include "trainer/loss.h"

namespace crl::trainer {
namespace {

constexpr int64_t kCudaContextBytes = int64_t{512} << 20;

int64_t dtype_bytes(const std::string& dtype) {
  return static_cast<int64_t>(c10::elementSize(engine::parse_dtype(dtype)));
}

// Parameters an adapter of `rank` on `targets` trains (A and B of every targeted layer).
int64_t lora_params(const engine::ModelConfig& config, const LoraTrainOptions& lora) {
  int64_t per_layer = 0;
  for (engine::LoraTarget t : engine::parse_lora_targets(lora.targets)) {
    const auto [in, out] = engine::lora_target_shape(config, t);
    per_layer += lora.rank * (in + out);
  }
  return per_layer * config.num_layers;
}

std::string ranks_label(const DeviceMemory& d) {
  std::string out;
  if (d.engines > 0) out += fmt::format("{} engine{}", d.engines, d.engines > 1 ? "s" : "");
  if (d.trainers > 0) {
    out += fmt::format("{}{} trainer{}", out.empty() ? "" : ", ", d.trainers,
                       d.trainers > 1 ? "s" : "");
  }
  return out;
}

// The ZeRO stage a trainer runs: the one asked for, else 2 over several ranks (TrainerOptions).
int zero_stage_of(const TrainerOptions& trainer, int train_ranks) {
  return trainer.zero_stage >= 0 ? trainer.zero_stage : (train_ranks > 1 ? 2 : 0);
}

// The most bytes a ZeRO-3 trainer holds while it streams a weight update over `runs` of the sync
// layout's buckets: TrainState::acquire_parameters and gather_target, in bytes. A run gathers
// (in order, once each) the trainer's buckets holding its parameters, keeping those keep(b) says
// until a later run no longer needs them; a buffer let go is kept for reuse (at most two, the
// smallest that fits taken first), else a new one is allocated.
int64_t streamed_update_peak(const sync::WeightLayout& own, const sync::WeightLayout& sync_layout,
                             const std::vector<std::pair<int64_t, int64_t>>& runs,
                             const std::function<bool(int64_t)>& keep) {
  std::vector<int64_t> bucket_of(own.specs().size());
  for (const sync::Bucket& b : own.buckets())
    for (const sync::BucketEntry& e : b.entries) bucket_of[e.tensor] = b.index;
  std::vector<int64_t> spare;
  std::vector<std::pair<int64_t, int64_t>> kept;  // (bucket, its buffer's bytes)
  int64_t held = 0, spare_bytes = 0, next = 0, peak = 0;
  auto let_go = [&](int64_t cap) {
    held -= cap;
    if (spare.size() < 2) {
      spare.push_back(cap);
      spare_bytes += cap;
    }
  };
  for (const auto& [first, end] : runs) {
    const int64_t p0 = sync_layout.buckets()[first].entries.front().tensor;
    const int64_t p1 = sync_layout.buckets()[end - 1].entries.back().tensor;
    std::vector<std::pair<int64_t, int64_t>> still;
    for (const auto& [b, cap] : kept) {
      if (own.buckets()[b].entries.back().tensor < p0) {
        let_go(cap);
      } else {
        still.emplace_back(b, cap);
      }
    }
    kept = std::move(still);
    for (int64_t b = std::max(next, bucket_of[p0]); b <= bucket_of[p1]; ++b) {
      const int64_t need = own.buckets()[b].nbytes;
      auto best = spare.end();
      for (auto it = spare.begin(); it != spare.end(); ++it) {
        if (*it >= need && (best == spare.end() || *it < *best)) best = it;
      }
      int64_t cap = need;
      if (best != spare.end()) {
        cap = *best;
        spare_bytes -= cap;
        spare.erase(best);
      }
      held += cap;
      peak = std::max(peak, held + spare_bytes);
      if (keep(b)) {
        kept.emplace_back(b, cap);
      } else {
        let_go(cap);
      }
    }
    next = std::max(next, bucket_of[p1] + 1);
  }
  return peak;
}

}  // namespace

int64_t DeviceMemory::peak(bool handover) const {
  const int64_t rest = engine_weights + trainer_state + contexts;
  const int64_t between = std::max(activations, sync_gathered);  // a step's, or a weight update's
  // Turns are taken pair by pair: with more than one pair on a device one trainer may train while
  // another pair's engine still holds its pool.
  const bool turns = handover && engines <= 1 && trainers <= 1;
  return turns ? rest + std::max(kv_pools, between) : rest + kv_pools + between;
}

int64_t trainer_state_bytes(const engine::ModelConfig& config, const TrainerOptions& trainer,
                            int train_ranks) {
  const int64_t c = dtype_bytes(trainer.dtype);
  const int64_t all = config.num_params();
  const int64_t trainable = trainer.lora.enabled() ? lora_params(config, trainer.lora) : all;
  const int stage = zero_stage_of(trainer, train_ranks);
  const int64_t shard = stage >= 1 ? train_ranks : 1;
  const bool on_device = !trainer.offload_optimizer || trainer.device == "cpu";
  int64_t bytes = all * c;                             // parameters (LoRA: the frozen base)
  if (trainer.lora.enabled()) bytes += trainable * c;  // the adapter's compute-dtype copy
  if (stage == 3 && !trainer.lora.enabled()) {         // (the trainer refuses LoRA at stage 3)
    // The own slices, and what is gathered at most: the embedding, final norm and head for the
    // micro-batch, two decoder layers (one's backward, the next's gather), a third with the
    // prefetch (the layer after the one running), and a bucket at each group boundary (two more
    // with the prefetch: the spans of two groups, and spare buffers larger than a bucket).
    const int64_t root =
        config.vocab_size * config.hidden_size * (config.tie_word_embeddings ? 1 : 2) +
        config.hidden_size;
    const int64_t layer = (all - root) / std::max<int64_t>(config.num_layers, 1);
    const int64_t layers = trainer.zero3_prefetch ? 3 : 2;
    const int64_t edges = trainer.zero3_prefetch ? 4 : 2;
    bytes = all * c / shard + (root + layers * layer) * c +
            std::min(all * c, edges * trainer.grad_bucket_bytes);
  }
  if (stage >= 2) {
    // The own slice, and the pool of full-bucket buffers gradients are reduce-scattered from.
    bytes += trainable * 4 / shard + std::min(trainable * 4, 2 * trainer.grad_bucket_bytes * 4 / c);
  } else {
    bytes += trainable * 4;
  }
  if (on_device) {
    if (c != 4) bytes += trainable * 4 / shard;  // masters (fp32 compute: the parameters)
    bytes += 2 * trainable * 4 / shard;          // Adam m and v
  }
  if (trainer.grpo.kl_coef > 0) bytes += trainer.lora.enabled() ? trainable * c : all * c;
  return bytes;
}

int64_t activation_bytes(const engine::ModelConfig& config, const TrainerOptions& trainer,
                         int64_t longest_sample) {
  const int64_t c = dtype_bytes(trainer.dtype);
  const int64_t m = trainer.micro_batch_tokens;
  const int64_t h = config.hidden_size, q = config.num_heads * config.head_dim;
  const int64_t kv = config.num_kv_heads * config.head_dim, i = config.intermediate_size;
  // Saved per token by one decoder layer: the norms' inputs and outputs, q, k, v, the attention
  // output, gate, up, their product and the down projection's input.
  int64_t layer = (3 * h + 2 * q + 2 * kv + 4 * i) * c;
  // Off CUDA the trainer's attention is dense (engine::DenseCausalAttention): each sequence's
  // fp32 softmax probabilities [heads, L, L] are saved, at most m x L a micro-batch of sequences
  // of L tokens at most; and its fp32 q (unless the compute dtype is fp32) and the k, v widened to
  // every head (unless they are the fp32 k, v themselves). On CUDA, SDPA saves only q, k, v and
  // the output.
  int64_t dense = 0;
  if (trainer.device.rfind("cuda", 0) != 0) {
    const int64_t longest = longest_sample > 0 ? std::min(m, longest_sample) : m;
    const bool grouped = config.num_kv_heads != config.num_heads;
    layer += (c != 4 ? q * 4 : 0) + (grouped || c != 4 ? 2 * q * 4 : 0);
    dense = config.num_heads * longest * 4;  // a token's share of the probabilities
  }
  const int64_t layers = trainer.activation_checkpointing
                             ? config.num_layers * h * c + layer + dense  // inputs + one layer
                             : config.num_layers * (layer + dense);
  // fp32 logits, their log-softmax and its gradient, for one chunk of loss rows at most; chunked,
  // backward sums the trained head's gradient in fp32 ([V, H]), and in bf16 also holds a chunk's.
  const int64_t rows =
      std::min(m, logits_chunk_rows(trainer.logits_chunk_tokens, config.vocab_size));
  int64_t head = 0;
  if (rows < m && !trainer.lora.enabled()) {
    head = config.vocab_size * config.hidden_size * (4 + (c == 4 ? 0 : c));
  }
  return m * layers + rows * 3 * config.vocab_size * 4 + head;
}

MemoryPlan plan_memory(const engine::ModelConfig& config, const RlOptions& o,
                       const sync::Placement& placement) {
  MemoryPlan plan;
  plan.handover = o.kv_handover;
  const sync::Topology& topo = placement.topo;
  const bool cuda = placement.kind == sync::DeviceKind::kCuda;
  const int train_ranks = topo.nnodes * topo.train_per_node;
  TrainerOptions trainer = o.trainer;
  trainer.device = cuda ? "cuda" : "cpu";
  trainer.grad_bucket_bytes = o.bucket_bytes;  // as the RL job's trainers get it
  // A tensor-parallel engine's rank holds its shard (split tensors / N, the rest whole). Over sync
  // lanes (the CPU) each receives into its shard in place; staged (GPUs), a weight update's
  // largest bucket is in flight on the leader, and each other rank's copy of it too. Its KV pool
  // is --kv-memory a rank.
  const int tp = std::max(1, o.infer_tp);
  int64_t engine_weights = 0;
  std::vector<sync::TensorSpec> specs;
  for (const engine::ParamSpec& spec : engine::model_param_specs(config)) {
    int64_t n = 1;
    for (int64_t d : spec.shape) n *= d;
    engine_weights += (engine::tp_split_dim(spec.name, config, tp) >= 0 ? n / tp : n) *
                      dtype_bytes(o.engine_dtype);
    specs.push_back({spec.name, spec.shape, engine::parse_dtype(o.engine_dtype)});
  }
  const bool staged = tp > 1 && placement.topo.lanes != tp;
  const int64_t staging =
      staged ? sync::WeightLayout::plan(std::move(specs), o.bucket_bytes).max_bucket_nbytes() : 0;
  if (o.trainer.lora.enabled()) {  // the adapter's versions in the engine's slots
    engine_weights +=
        (o.max_staleness + 1) * lora_params(config, o.trainer.lora) * dtype_bytes(o.engine_dtype);
  }
  const int64_t state = trainer_state_bytes(config, trainer, train_ranks);
  // The longest sample a micro-batch can hold: the model's context (the engines'), an episode's
  // cap.
  int64_t longest = config.max_position_embeddings;
  if (!o.env.empty()) longest = std::min<int64_t>(longest, o.multi_turn.max_episode_tokens);
  const int64_t act = activation_bytes(config, trainer, longest);
  // ZeRO-3 (RolloutConsumer::send): every train rank takes part in gathering each bucket, a run of
  // the sync's buckets at a time (--sync-chunk-mb, WeightLayout::chunks; where a sender of the
  // node uses CUDA IPC, the whole model at once), and keeps until a later run the ones it needs:
  // fan-out, those it sends (sync::fan_out_senders); paired, every bucket; where its own buffers
  // are not the sync's (another dtype, or the per-tensor modes), every one of its buckets holding a
  // parameter of the run.
  const int stage = zero_stage_of(trainer, train_ranks);
  std::vector<int64_t> gathered(topo.train_per_node, 0);
  if (stage == 3 && !trainer.lora.enabled() && train_ranks > 1) {
    std::vector<sync::TensorSpec> train_specs, sync_specs;
    const at::ScalarType train_dtype = engine::parse_dtype(trainer.dtype);
    // Over sync lanes the layout is one engine rank's (sliced), its runs chunk / lanes bytes, and
    // a trainer keeps every bucket of a run (it packs every lane's slices).
    const int lanes = tp > 1 && !staged ? tp : 1;
    for (const engine::ParamSpec& spec : engine::model_param_specs(config)) {
      train_specs.push_back({spec.name, spec.shape, train_dtype});
      sync_specs.push_back(
          {spec.name, engine::tp_slice_shape(spec.name, spec.shape, engine::TpShard{0, lanes}),
           engine::parse_dtype(o.engine_dtype)});
    }
    const sync::WeightLayout layout =
        sync::WeightLayout::plan(std::move(train_specs), trainer.grad_bucket_bytes);
    const sync::WeightLayout sync_layout =
        sync::WeightLayout::plan(std::move(sync_specs), o.bucket_bytes);
    const bool own_buffers = o.sync.mode == sync::SyncMode::kBucket && lanes == 1 &&
                             train_dtype == engine::parse_dtype(o.engine_dtype);
    // CUDA IPC: a sync_root group all on one GPU.
    auto over_ipc = [&](int t) {
      if (o.sync.transport != sync::SyncTransport::kAuto) {
        return o.sync.transport == sync::SyncTransport::kIpc;
      }
      if (!cuda) return false;
      const int gpu = placement.gpu_of_local.at(topo.infer_per_node + t);
      for (int i : topo.receivers_of(t)) {
        if (placement.gpu_of_local.at(i) != gpu) return false;
      }
      return true;
    };
    std::vector<int64_t> bytes;
    for (const sync::Bucket& b : layout.buckets()) bytes.push_back(b.nbytes);
    const std::vector<int> senders = sync::fan_out_senders(bytes, topo.train_per_node);
    // Run by run only where every sender of the node broadcasts (sync::SendStream).
    bool streamed = o.sync.mode == sync::SyncMode::kBucket;
    for (int t = 0; t < topo.train_per_node; ++t) streamed = streamed && !over_ipc(t);
    for (int t = 0; t < topo.train_per_node; ++t) {
      const int64_t chunk = streamed && o.sync.stream_chunk_bytes > 0
                                ? std::max<int64_t>(1, o.sync.stream_chunk_bytes / lanes)
                                : 0;
      gathered[t] = streamed_update_peak(
          layout, sync_layout, sync_layout.chunks(chunk),
          [&](int64_t b) { return !own_buffers || topo.sends(t, b, senders); });
    }
  }
  std::map<std::string, DeviceMemory> by_device;
  std::vector<std::string> order;
  for (int l = 0; l < topo.ranks_per_node(); ++l) {
    const std::string dev = cuda ? fmt::format("cuda:{}", placement.gpu_of_local.at(l)) : "cpu";
    if (!by_device.count(dev)) order.push_back(dev);
    DeviceMemory& d = by_device[dev];
    d.device = dev;
    if (topo.role_of(l) == sync::Role::kInfer) {
      for (int r = 0; r < tp; ++r) {  // on CUDA rank r of the engine's group on GPU gpu + r
        const std::string rdev =
            cuda ? fmt::format("cuda:{}", placement.gpu_of_local.at(l) + r) : "cpu";
        if (!by_device.count(rdev)) order.push_back(rdev);
        DeviceMemory& e = by_device[rdev];
        e.device = rdev;
        if (r == 0 || cuda) ++e.engines;  // on a GPU: a shard of one
        e.engine_weights += engine_weights + (r == 0 || cuda ? staging : 0);
        e.kv_pools += o.kv_memory_bytes;
        if (cuda && r > 0) e.contexts += kCudaContextBytes;
      }
    } else {
      ++d.trainers;
      d.trainer_state += state;
      d.activations += act;
      d.sync_gathered += gathered.at(topo.role_index(l));
    }
    if (cuda) d.contexts += kCudaContextBytes;
  }
  std::sort(order.begin(), order.end(), [](const std::string& a, const std::string& b) {
    return a.size() != b.size() ? a.size() < b.size() : a < b;  // cuda:2 before cuda:10
  });
  for (const auto& dev : order) plan.devices.push_back(by_device[dev]);
  return plan;
}

std::vector<int64_t> device_capacities(const MemoryPlan& plan) {
  std::vector<int64_t> out;
  for (const DeviceMemory& d : plan.devices) {
    int64_t bytes = 0;
    try {
      if (d.device.rfind("cuda:", 0) == 0) {
        bytes = sync::cuda_device_total_bytes(std::stoi(d.device.substr(5)));
      } else {
        bytes = static_cast<int64_t>(sysconf(_SC_PHYS_PAGES)) * sysconf(_SC_PAGESIZE);
      }
    } catch (const std::exception&) {
      bytes = 0;  // unknown: the table says "?" and nothing is refused
    }
    out.push_back(std::max<int64_t>(bytes, 0));
  }
  return out;
}

namespace {

// The activations, and where a ZeRO-3 weight update gathers buckets in their place, those.
std::string between_steps(const DeviceMemory& d) {
  if (d.sync_gathered == 0) return format_bytes(d.activations);
  return fmt::format("{} (weight update: {} gathered)", format_bytes(d.activations),
                     format_bytes(d.sync_gathered));
}

}  // namespace

std::string MemoryPlan::table(const std::vector<int64_t>& capacity) const {
  std::string out = fmt::format(
      "memory plan per device (estimates from config.json and the flags; peak = {}):\n"
      "| device | ranks | engine weights | KV pools | trainer state | activations | CUDA contexts "
      "| peak | capacity |\n|---|---|---|---|---|---|---|---|---|\n",
      handover ? "all at once, but the KV pools and the activations take turns (hand-over)"
               : "all at once");
  for (size_t k = 0; k < devices.size(); ++k) {
    const DeviceMemory& d = devices[k];
    const int64_t cap = k < capacity.size() ? capacity[k] : 0;
    out += fmt::format("| {} | {} | {} | {} | {} | {} | {} | {} | {} |\n", d.device, ranks_label(d),
                       format_bytes(d.engine_weights), format_bytes(d.kv_pools),
                       format_bytes(d.trainer_state), between_steps(d),
                       d.contexts > 0 ? format_bytes(d.contexts) : "-",
                       format_bytes(d.peak(handover)), cap > 0 ? format_bytes(cap) : "?");
  }
  return out;
}

void MemoryPlan::check_fits(const std::vector<int64_t>& capacity) const {
  for (size_t k = 0; k < devices.size() && k < capacity.size(); ++k) {
    const DeviceMemory& d = devices[k];
    if (capacity[k] <= 0 || d.peak(handover) <= capacity[k]) continue;
    throw std::invalid_argument(fmt::format(
        "memory plan: {} ({}) needs about {} at its peak but has {}: engine weights {} + KV pools "
        "{} + trainer state {} + activations {}{}{}. Lower --kv-memory or --micro-batch-tokens, "
        "shard the trainer's state (--zero 1/2, --offload-optimizer), train an adapter "
        "(--lora-rank), or spread the ranks over more GPUs (--device-map)",
        d.device, ranks_label(d), format_bytes(d.peak(handover)), format_bytes(capacity[k]),
        format_bytes(d.engine_weights), format_bytes(d.kv_pools), format_bytes(d.trainer_state),
        between_steps(d),
        d.contexts > 0 ? fmt::format(" + CUDA contexts {}", format_bytes(d.contexts)) : "",
        handover ? " (the KV pools and the activations taking turns: the larger counts)" : ""));
  }
}

const DeviceMemory& MemoryPlan::largest() const {
  return *std::max_element(devices.begin(), devices.end(),
                           [this](const DeviceMemory& a, const DeviceMemory& b) {
                             return a.peak(handover) < b.peak(handover);
                           });
}

std::vector<PlanFix> plan_fixes(const engine::ModelConfig& config, const RlOptions& options,
                                const sync::Placement& placement, int64_t capacity) {
  auto peak = [&](const RlOptions& o) {
    const MemoryPlan p = plan_memory(config, o, placement);
    return p.largest().peak(p.handover);
  };
  std::vector<PlanFix> fixes;
  auto try_fix = [&](const std::string& flags, const RlOptions& o) {
    const int64_t p = peak(o);
    if (p <= capacity) fixes.push_back({flags, p});
    return p <= capacity;
  };
  // The largest --kv-memory in whole GiB (>= 1) with which `o` fits, or 0.
  auto kv_that_fits = [&](RlOptions o) -> int64_t {
    if (o.infer_per_node == 0) return 0;
    int64_t lo = 0, hi = o.kv_memory_bytes >> 30;
    while (lo < hi) {  // the largest g in [0, hi] with a fit (g = 0: none)
      const int64_t mid = (lo + hi + 1) / 2;
      o.kv_memory_bytes = mid << 30;
      if (peak(o) <= capacity) {
        lo = mid;
      } else {
        hi = mid - 1;
      }
    }
    return lo;
  };
  const int train_ranks = placement.topo.nnodes * placement.topo.train_per_node;
  const bool full = !options.trainer.lora.enabled();
  // The trainer-state flags not already given, each tried alone here and cumulatively below.
  std::vector<std::pair<std::string, std::function<void(RlOptions&)>>> state;
  if (full && train_ranks > 1 && options.trainer.zero_stage >= 0 &&
      options.trainer.zero_stage < 2) {
    state.emplace_back("--zero 2", [](RlOptions& o) { o.trainer.zero_stage = 2; });
  }
  if (full && train_ranks > 1 && options.trainer.zero_stage != 3 &&
      options.trainer.grpo.kl_coef == 0) {
    state.emplace_back("--zero 3", [](RlOptions& o) { o.trainer.zero_stage = 3; });
  }
  if (!options.trainer.activation_checkpointing) {
    state.emplace_back("--activation-checkpointing",
                       [](RlOptions& o) { o.trainer.activation_checkpointing = true; });
  }
  if (!options.trainer.offload_optimizer) {
    state.emplace_back("--offload-optimizer",
                       [](RlOptions& o) { o.trainer.offload_optimizer = true; });
  }
  for (const auto& [flag, apply] : state) {
    RlOptions o = options;
    apply(o);
    try_fix(flag, o);
  }
  // A micro-batch holds a whole sequence (--max-tokens) or trajectory (--max-episode-tokens).
  int64_t shortest = std::max<int64_t>(256, options.max_tokens + 1);
  if (!options.env.empty()) {
    shortest = std::max<int64_t>(shortest, options.multi_turn.max_episode_tokens);
  }
  // The largest power of 2 below `base`'s micro-batch (>= shortest) with which it fits, alone or
  // with the largest --kv-memory that then fits; true when one was added.
  auto try_micro_batch = [&](const RlOptions& base, const std::string& flags) {
    for (int64_t m = int64_t{1} << 20; m >= shortest; m /= 2) {
      if (m >= base.trainer.micro_batch_tokens) continue;
      RlOptions o = base;
      o.trainer.micro_batch_tokens = m;
      const std::string with = fmt::format("{}--micro-batch-tokens {}", flags, m);
      if (try_fix(with, o)) return true;
      if (const int64_t g = kv_that_fits(o); g > 0) {
        o.kv_memory_bytes = g << 30;
        if (try_fix(fmt::format("{} --kv-memory {}GiB", with, g), o)) return true;
      }
    }
    return false;
  };
  auto try_kv = [&](const RlOptions& base, const std::string& flags) {
    const int64_t g = kv_that_fits(base);
    if (g <= 0 || (g << 30) >= base.kv_memory_bytes) return false;
    RlOptions o = base;
    o.kv_memory_bytes = g << 30;
    return try_fix(fmt::format("{}--kv-memory {}GiB", flags, g), o);
  };
  try_micro_batch(options, "");
  try_kv(options, "");
  // LoRA keeps its base whole on each rank, so ZeRO-3 does not apply to it (the trainer refuses
  // it): an adapter asked for at stage 3 goes with stage 2.
  RlOptions lora = options;
  lora.trainer.lora.rank = 16;
  const bool user_z3 = options.trainer.zero_stage == 3;
  if (user_z3) lora.trainer.zero_stage = 2;
  if (full) {
    const std::string flag = user_z3 ? "--lora-rank 16 --zero 2" : "--lora-rank 16";
    try_fix(flag, lora);
    state.emplace_back(flag, [](RlOptions& o) {
      o.trainer.lora.rank = 16;
      if (o.trainer.zero_stage == 3) o.trainer.zero_stage = 2;
    });
  }
  // None alone: these flags one after another, each time also with the --kv-memory or the
  // --micro-batch-tokens that then fits.
  RlOptions acc = options;
  std::string flags;
  for (size_t k = 0; fixes.empty() && k < state.size(); ++k) {
    // --zero 3 follows --zero 2 in the list: the cumulative flags name only the stage they set.
    if (state[k].first == "--zero 2" && k + 1 < state.size() && state[k + 1].first == "--zero 3") {
      continue;
    }
    state[k].second(acc);
    if (state[k].first.rfind("--lora-rank 16", 0) == 0) {
      // A suggested --zero 3 becomes stage 2 under the adapter (named unless the default).
      const size_t z3 = flags.find("--zero 3 ");
      if (z3 != std::string::npos) {
        const bool default_two = options.trainer.zero_stage < 0 || options.trainer.zero_stage == 2;
        flags.replace(z3, 9, default_two ? "" : "--zero 2 ");
      }
    }
    flags += state[k].first + " ";
    const std::string named = flags.substr(0, flags.size() - 1);
    if (k > 0 && try_fix(named, acc)) break;
    if (try_kv(acc, flags) || try_micro_batch(acc, flags)) break;
  }
  return fixes;
}

}  // namespace crl::trainer
