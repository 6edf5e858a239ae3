#include "trainer/rl_context.h"

#include <fmt/format.h>

#include <cstdio>
#include <stdexcept>

#include "common/check.h"
#include "trainer/checkpoint.h"

namespace crl::trainer {
namespace {

const char* const kScope = "rl/";  // the RL job's control-plane keys

}  // namespace

void RlOptions::validate() {
  const double lr = trainer.schedule.lr;
  if (!(lr >= 0) || !(sft_schedule.lr >= 0)) {
    throw std::invalid_argument(fmt::format("--lr ({}) and --sft-lr ({}) must be >= 0", lr,
                                            sft_schedule.lr));
  }
  if (reproducible && serve_port >= 0 && !deterministic) {
    throw std::invalid_argument(
        "--reproducible with --serve-port needs --deterministic: HTTP requests join the engines' "
        "batches, and only batch-invariant engines give a rollout the same logits whatever its "
        "batch");
  }
  if (trainer.schedule.min_lr > lr) {
    throw std::invalid_argument(fmt::format("--min-lr {} is above --lr {} (the cosine decays "
                                            "from --lr to --min-lr)", trainer.schedule.min_lr, lr));
  }
  if (sft_schedule.min_lr > sft_schedule.lr) {
    throw std::invalid_argument(fmt::format("--sft-min-lr {} is above --sft-lr {} (the cosine "
                                            "decays from --sft-lr to --sft-min-lr)",
                                            sft_schedule.min_lr, sft_schedule.lr));
  }
  sft_schedule.validate();
  if (trainer.grpo.tis_cap < 0) trainer.grpo.tis_cap = max_staleness >= 1 ? 2.0 : 0.0;
  trainer.validate();
  if (sync.mode != sync::SyncMode::kBucket) {
    throw std::invalid_argument(fmt::format(
        "--sync-mode {} is a benchmark baseline (`colocated-rl bench sync` compares it); the RL "
        "job syncs in bucket mode",
        sync::sync_mode_name(sync.mode)));
  }
  if (trainer.micro_batch_tokens <= max_tokens) {
    throw std::invalid_argument("--micro-batch-tokens must exceed --max-tokens (a sequence never "
                                "splits across micro-batches)");
  }
  if (steps < 0 || prompts_per_step < 1 || samples_per_prompt < 1 || max_tokens < 1) {
    throw std::invalid_argument("--steps >= 0, --prompts-per-step, --n-samples and --max-tokens >= 1");
  }
}

RlContext::RlContext(const sync::RankEnv& e, const RlOptions& options)
    : o(options), env(e), world(sync::join_world(e, options.timeout)) {
  coord = std::make_unique<sync::Coordinator>(world.store, kScope);
  sync::Topology topo{env.nnodes, o.infer_per_node, o.train_per_node};
  g = sync::make_groups(std::move(world.comm), topo);
  infer_total = topo.nnodes * topo.infer_per_node;
  train_total = topo.nnodes * topo.train_per_node;
  role_global = g.node * (g.role == sync::Role::kInfer ? topo.infer_per_node : topo.train_per_node) +
                topo.role_index(env.rank);
  auto task = o.data_path.empty() ? default_task_rows(o.default_task_rows, o.seed)
                                  : load_task_jsonl(o.data_path, o.reward, o.model_dir, o.split_special_tokens);
  split = split_task(std::move(task), o.eval_rows, o.seed);
  if (split.train.empty()) CRL_INVALID("the task has no training rows after the held-out split");
  rows = std::make_unique<RowSampler>(static_cast<int64_t>(split.train.size()), o.seed + 17);
  if (!o.resume_dir.empty()) {
    auto state = read_checkpoint_state(o.resume_dir);
    resumed = true;
    start_step = state.step;
    int64_t drawn = state.extra.value("rows_drawn", int64_t{0});
    for (int64_t i = 0; i < drawn; ++i) rows->next();
    if (env.rank == 0) {
      fmt::print("resumed from {} at step {} (data cursor {})\n", o.resume_dir, start_step, drawn);
    }
  }
}

std::vector<int64_t> RlContext::draw(int64_t count) {
  std::vector<int64_t> out;
  for (int64_t i = 0; i < count; ++i) out.push_back(rows->next());
  return out;
}

std::unique_ptr<sync::Coordinator> RlContext::connect_own_coordinator() const {
  return sync::Coordinator::connect(env, o.timeout, kScope);
}

Fault parse_fault(const std::string& s) {
  if (s.empty()) return {};
  Fault f;
  if (std::sscanf(s.c_str(), "die-at-step:%d:%ld", &f.rank, &f.step) != 2) {
    CRL_INVALID("unknown fault '", s, "' (die-at-step:RANK:STEP)");
  }
  return f;
}

}  // namespace crl::trainer
