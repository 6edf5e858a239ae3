// colocated-rl plan: the memory each GPU of a training job would hold, before anything runs.
#include <fmt/format.h>

#include <CLI/CLI.hpp>
#include <algorithm>

#include "app/cli_style.h"
#include "app/commands.h"
#include "app/train_flags.h"
#include "common/units.h"
#include "engine/model/config.h"
#include "engine/model/model_cache.h"
#include "sync/placement.h"
#include "trainer/memory_plan.h"

namespace crl::app {

namespace {

struct PlanFlags {
  std::string shape;
  int gpus_per_node = 0;  // 0: one GPU per rank (I + T), or the --device-map's
  int nnodes = 1;
  std::string gpu_memory = "80GiB";
};

// `colocated-rl plan`: the memory plan of a job on GPUs this machine need not have.
int run_plan(const TrainFlags& f, const PlanFlags& p) {
  RlJobOptions o = f.o;
  o.infer_per_node = f.dist.infer;
  o.train_per_node = f.dist.train;
  if (!p.shape.empty() && !o.model_dir.empty()) {
    throw std::invalid_argument("plan: give --model or --shape, not both");
  }
  engine::ModelConfig config;
  std::string model;
  if (!p.shape.empty()) {
    config = engine::preset_config(p.shape);
    model = p.shape;
  } else {
    if (o.model_dir.empty()) o.model_dir = engine::ensure_preset_model("default");
    check_model_dir("--model", o.model_dir);
    config = engine::load_model_config(o.model_dir);
    model = o.model_dir;
  }
  o.kv_memory_bytes = parse_bytes(f.kv_memory);
  o.trainer.dtype = f.train_dtype.empty() ? o.engine_dtype : f.train_dtype;
  o.trainer.validate();
  o.check_infer_tp(&config);
  o.bucket_bytes = f.dist.bucket_bytes();
  o.sync = f.dist.sync_options();
  o.device_map = sync::parse_device_map(f.device_map);
  o.comm_backend = f.dist.backend;
  o.colocate = f.dist.colocate;
  o.device = "cuda";
  int gpus = p.gpus_per_node;
  if (gpus == 0 && !o.device_map.empty()) {
    gpus = *std::max_element(o.device_map.begin(), o.device_map.end()) + 1;
  }
  if (gpus == 0) gpus = o.infer_per_node * o.infer_tp + o.train_per_node;
  o.cuda_device_count = gpus;
  const sync::Placement where = sync::plan_placement(
      sync::Topology{p.nnodes, o.infer_per_node, o.train_per_node}, o.placement_request());
  trainer::resolve_colocated_schedule(where, f.staleness_opt->count() > 0, &o);
  const int64_t capacity = parse_bytes(p.gpu_memory);
  const trainer::MemoryPlan plan = trainer::plan_memory(config, o, where);
  const int train_ranks = p.nnodes * o.train_per_node;
  const int stage = o.trainer.zero_stage >= 0 ? o.trainer.zero_stage : (train_ranks > 1 ? 2 : 0);
  fmt::print(
      "plan: {} ({:.2f} B parameters), {} node{} x {} GPUs of {}; per node {} engine{} ({}, KV "
      "pool {}{}) and {} trainer{} ({}, ZeRO-{} over {} train rank{}{}{}, micro-batches of {} "
      "tokens{}{}); {}\n",
      model, config.num_params() / 1e9, p.nnodes, p.nnodes > 1 ? "s" : "", gpus,
      format_bytes(capacity), o.infer_per_node, o.infer_per_node > 1 ? "s" : "", o.engine_dtype,
      format_bytes(o.kv_memory_bytes),
      o.infer_tp > 1 ? fmt::format(" a GPU, tensor-parallel over {} GPUs", o.infer_tp) : "",
      o.train_per_node, o.train_per_node > 1 ? "s" : "", o.trainer.dtype, stage, train_ranks,
      train_ranks > 1 ? "s" : "",
      o.trainer.lora.enabled() ? fmt::format(", LoRA rank {}", o.trainer.lora.rank) : "",
      o.trainer.offload_optimizer ? ", optimizer on the host" : "", o.trainer.micro_batch_tokens,
      o.trainer.activation_checkpointing ? ", activation checkpointing" : "",
      o.trainer.grpo.kl_coef > 0 ? ", a KL reference" : "",
      where.topo.paired ? "colocated pairs (one engine and one trainer a GPU)"
                        : "engines fed by every trainer (fan-out)");
  fmt::print("{}", plan.table(std::vector<int64_t>(plan.devices.size(), capacity)));
  const trainer::DeviceMemory& worst = plan.largest();
  if (worst.peak(plan.handover) <= capacity) {
    const double share = static_cast<double>(worst.peak(plan.handover)) / capacity;
    fmt::print("fits: the largest peak is {} ({}), {:.0f}% of {}{}\n",
               format_bytes(worst.peak(plan.handover)), worst.device, 100.0 * share,
               format_bytes(capacity),
               share > 0.9 ? " (tight: the estimates leave out the allocator's caching and "
                             "fragmentation; keep ~10% free)"
                           : "");
    return 0;
  }
  fmt::print("does not fit: {} needs about {} of {}\n", worst.device,
             format_bytes(worst.peak(plan.handover)), format_bytes(capacity));
  const auto fixes = trainer::plan_fixes(config, o, where, capacity);
  if (fixes.empty()) {
    fmt::print(
        "no change of --zero, --activation-checkpointing, --offload-optimizer, "
        "--micro-batch-tokens, --kv-memory or --lora-rank makes it fit, alone or stacked: more "
        "GPUs (--gpus-per-node, --nnodes), or larger ones\n");
  } else {
    fmt::print("what would fit (each on top of the flags given):\n");
    for (const auto& fix : fixes) {
      fmt::print("  {:<60} largest peak {}\n", fix.flags, format_bytes(fix.peak));
    }
  }
  return 1;
}

}  // namespace

Runner register_plan(CLI::App& app) {
  auto f = std::make_shared<TrainFlags>();
  auto p = std::make_shared<PlanFlags>();
  auto& o = f->o;
  o.trainer.micro_batch_tokens = 2048;  // train's defaults
  auto* cmd = app.add_subcommand(
      "plan",
      "the memory each GPU of a training job would hold (weights, KV pools, trainer state, "
      "activations), from a model's config.json or a named shape, before anything runs; names "
      "the flags that would make it fit. Takes train's model, schedule, RL, LoRA and distributed "
      "flags (GPUs whatever --device says)");
  cmd->option_defaults()->group("Plan");
  cmd->add_option("--shape", p->shape,
                  "a named model shape instead of --model: llama3.1-8b, qwen2.5-7b, qwen3-8b, "
                  "qwen2.5-32b, or a preset (qwen2-0.5b, ...)");
  cmd->add_option("--gpus-per-node", p->gpus_per_node,
                  "GPUs on each node (default: one per rank, or as many as --device-map names; "
                  "with --gpus-infer N --gpus-train N, N pairs them)")
      ->check(at_least(1));
  cmd->add_option("--nnodes", p->nnodes, "nodes, each laid out as node 0")
      ->capture_default_str()
      ->check(at_least(1));
  cmd->add_option("--gpu-memory", p->gpu_memory, "each GPU's memory")->capture_default_str();
  add_model_and_task_flags(cmd, f.get());
  add_schedule_flags(cmd, f.get());
  add_rl_flags(cmd, f.get());
  add_lora_flags(cmd, f.get());
  add_dist_flags(*cmd, f->dist, /*with_sync=*/true);
  add_colocate_flag(*cmd, f->dist);
  return [f, p]() { return run_plan(*f, *p); };
}

}  // namespace crl::app
