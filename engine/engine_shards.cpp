#include "engine/engine_shards.h"

#include <ATen/Parallel.h>
#include <ATen/detail/CUDAHooksInterface.h>
#include <c10/core/DeviceGuard.h>
#include <fmt/format.h>

#include <chrono>
#include <stdexcept>
#include <string>
#include <utility>

#include "common/check.h"
#include "engine/llm_engine.h"
#include "engine/model/tensor_parallel.h"

namespace crl::engine {

TransformerOptions engine_model_options(const EngineConfig& config) {
  TransformerOptions opts;
  opts.dtype = parse_dtype(config.dtype);
  opts.device = at::Device(config.device);
  opts.deterministic = config.deterministic;
  opts.project_linear = config.cpu_kernels == "auto";
  opts.cuda_fused = config.gpu_kernels == "auto";
  opts.merge_projections = config.merge_projections && !opts.deterministic;
  return opts;
}

bool tensor_parallel(const sync::TpGroup* tp) { return tp != nullptr && tp->size() > 1; }

// What a split engine does not do yet.
void refuse_for_tensor_parallel(const EngineConfig& config) {
  if (config.max_loras > 0 || !config.lora_modules.empty()) {
    CRL_INVALID("a tensor-parallel engine does not serve LoRA adapters yet");
  }
  if (config.cuda_graphs == "on") {
    CRL_INVALID("a tensor-parallel engine runs its steps eagerly: --cuda-graphs on is refused");
  }
}

// The engine's model: the whole checkpoint, or a tensor-parallel group's shard of it whose
// row-parallel outputs are summed over the group (engine/model/tensor_parallel.h).
std::unique_ptr<Transformer> load_engine_model(const EngineConfig& config,
                                               const TransformerOptions& opts, sync::TpGroup* tp) {
  if (!tensor_parallel(tp)) {
    return std::make_unique<Transformer>(Transformer::load(config.model_dir, opts));
  }
  auto model = std::make_unique<Transformer>(
      Transformer::load(config.model_dir, opts, TpShard{tp->rank(), tp->size()}));
  model->set_row_parallel_reduce([tp](const at::Tensor& partial) {
    CRL_CHECK(partial.is_contiguous(), "a row-parallel output must be contiguous");
    if (partial.device() == tp->device()) {
      tp->all_reduce_sum(partial);
    } else {
      const at::Tensor staged = partial.to(tp->device());
      tp->all_reduce_sum(staged);
      partial.copy_(staged);
    }
  });
  return model;
}

// KV blocks of the pool: EngineConfig::num_kv_blocks, else what kv_memory_bytes holds (the same
// on every rank of a tensor-parallel group: their shards are alike).
int32_t engine_kv_blocks(const EngineConfig& config, const ModelConfig& mc, at::ScalarType dtype) {
  if (config.num_kv_blocks > 0) return config.num_kv_blocks;
  const int64_t per_block = ModelRunner::block_bytes(mc, dtype, config.block_size);
  const auto num_blocks = static_cast<int32_t>(config.kv_memory_bytes / per_block);
  if (num_blocks < 1) {
    throw std::invalid_argument(
        "invalid engine setting 'kv_memory_bytes': " + std::to_string(config.kv_memory_bytes) +
        " holds no KV block (one block needs " + std::to_string(per_block) + " bytes)");
  }
  return num_blocks;
}

// After every rank of a tensor-parallel group built its shard and KV pool (or failed to), the group
// agrees on it before any step: a rank that failed (a bad checkpoint, a model that does not split,
// memory) ends the others at once instead of at their first collective's deadline, and the pools
// must match (the leader's block tables index every rank's pool).
void agree_on_group(sync::TpGroup& tp, const std::exception_ptr& failed, const ModelRunner* runner,
                    const std::string& model_dir) {
  const int n = tp.size();
  const int me = tp.rank();
  at::Tensor words = at::zeros({3 * n}, at::TensorOptions(at::kLong).device(tp.device()));
  if (failed || runner == nullptr) {
    words[3 * me].fill_(1);
  } else {
    words[3 * me + 1].fill_(runner->num_blocks());
    words[3 * me + 2].fill_(runner->block_size());
  }
  tp.all_reduce_sum(words);
  if (failed) std::rethrow_exception(failed);
  const at::Tensor w = words.cpu();
  const int64_t* v = w.data_ptr<int64_t>();
  std::string bad;
  for (int r = 0; r < n; ++r) {
    if (v[3 * r] != 0) bad += (bad.empty() ? "" : ", ") + std::to_string(r);
  }
  if (!bad.empty()) {
    throw std::runtime_error("tensor-parallel group " + tp.name() + ": rank(s) " + bad +
                             " could not build their shard of " + model_dir +
                             " (their errors are printed above)");
  }
  for (int r = 0; r < n; ++r) {
    if (v[3 * r + 1] != v[1] || v[3 * r + 2] != v[2]) {
      throw std::invalid_argument(
          "tensor-parallel group " + tp.name() + ": rank " + std::to_string(r) + " has " +
          std::to_string(v[3 * r + 1]) + " KV blocks of " + std::to_string(v[3 * r + 2]) +
          " tokens, rank 0 " + std::to_string(v[1]) + " of " + std::to_string(v[2]) +
          ": every rank needs the same engine settings");
    }
  }
}

namespace {

// How long a tensor-parallel collective may wait for the group's other ranks.
constexpr std::chrono::milliseconds kLocalTpTimeout{300000};

at::Device tp_rank_device(const at::Device& base, int r) {
  if (!base.is_cuda()) return base;
  return at::Device(at::kCUDA,
                    static_cast<c10::DeviceIndex>((base.has_index() ? base.index() : 0) + r));
}

}  // namespace

std::unique_ptr<LocalTpFollowers> LocalTpFollowers::start(EngineConfig& config) {
  auto f = std::unique_ptr<LocalTpFollowers>(new LocalTpFollowers());
  const int n = config.tensor_parallel_size;
  // What would be refused after the ranks started, refused before (on GPUs a rank waits for the
  // others at its group's deadline).
  refuse_for_tensor_parallel(config);
  tp_local_config(load_model_config(config.model_dir), TpShard{0, n});  // does it split?
  at::Device base(config.device);
  if (base.is_cuda() && !base.has_index()) {  // the ranks' GPUs named, rank 0's too
    base = at::Device(at::kCUDA, 0);
    config.device = base.str();
  }
  if (base.is_cuda()) {
    const int have = at::detail::getCUDAHooks().getNumGPUs();
    const int last = (base.has_index() ? base.index() : 0) + n - 1;
    if (last >= have) {
      CRL_INVALID("tensor parallelism over ", n, " GPUs from ", base, " needs GPU ", last,
                  "; this machine has ", have);
    }
  }
  f->hub_ = std::make_unique<sync::LocalTpHub>(n, kLocalTpTimeout);
  f->lanes_ = std::make_unique<TpLaneBoard>(n);
  EngineConfig follower = config;
  follower.tensor_parallel_size = 1;  // follow() is given its group
  for (int r = 1; r < n; ++r) {
    sync::LocalTpHub* hub = f->hub_.get();
    TpLaneBoard* lanes = f->lanes_.get();
    f->threads_.emplace_back([hub, lanes, r, follower, device = tp_rank_device(base, r)] {
      try {
        const std::unique_ptr<sync::TpGroup> group = hub->join(r, device);
        c10::OptionalDeviceGuard guard;  // the rank's GPU current in its thread
        if (device.is_cuda()) guard.reset_device(device);
        EngineConfig c = follower;
        c.device = device.str();
        LlmEngine::follow(c, *group, lanes);
      } catch (const std::exception& e) {
        fmt::print(stderr, "tensor-parallel rank {} of {}: {}\n", r, hub->size(), e.what());
        hub->close();  // rank 0 fails at its next collective, not at the deadline
      }
    });
  }
  f->group_ = f->hub_->join(0, tp_rank_device(base, 0));
  return f;
}

LocalTpFollowers::~LocalTpFollowers() {
  if (hub_) hub_->close();  // followers still waiting for a command return
  group_.reset();           // rank 0's communicator before the others' threads end
  for (auto& t : threads_) t.join();
}

void LlmEngine::follow(const EngineConfig& config, sync::TpGroup& tp, TpLaneBoard* lanes) {
  if (tp.rank() == 0) {
    throw std::logic_error("LlmEngine::follow runs on the ranks of a tensor-parallel group past 0");
  }
  EngineConfig c = config;
  c.validate();
  c.tensor_parallel_size = 1;  // this rank's shard comes from `tp`
  if (c.num_threads > 0) at::set_num_threads(c.num_threads);
  const TransformerOptions opts = engine_model_options(c);
  std::unique_ptr<Transformer> model;
  std::unique_ptr<ModelRunner> runner;
  std::exception_ptr failed;
  try {
    model = load_engine_model(c, opts, &tp);
    runner = std::make_unique<ModelRunner>(*model, c.block_size,
                                           engine_kv_blocks(c, model->config(), opts.dtype));
  } catch (...) {
    failed = std::current_exception();
  }
  agree_on_group(tp, failed, runner.get(), c.model_dir);
  runner->set_tensor_parallel(&tp, load_model_config(c.model_dir));
  std::unique_ptr<WeightBuffers> buffers;  // with sync lanes: this rank's shard, as the leader's
  runner->follow([&](int64_t bucket_bytes) {
    if (lanes == nullptr) {
      throw std::runtime_error("sync lanes need an in-process tensor-parallel group");
    }
    if (!buffers) buffers = std::make_unique<WeightBuffers>(*model, bucket_bytes);
    lanes->put(tp.rank(), buffers->buckets());
  });
}

}  // namespace crl::engine
