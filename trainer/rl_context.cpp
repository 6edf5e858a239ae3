#include "trainer/rl_context.h"

#include <fmt/format.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <stdexcept>

#include "common/check.h"
#include "engine/kernels/cpu_isa.h"
#include "engine/model/config.h"
#include "engine/model/tensor_parallel.h"
#include "sync/nccl_communicator.h"
#include "trainer/checkpoint.h"
#include "trainer/memory_plan.h"

namespace crl::trainer {
namespace {

const char* const kScope = "rl/";  // the RL job's control-plane keys

}  // namespace

sync::PlacementRequest RlOptions::placement_request() const {
  sync::PlacementRequest r;
  r.kind = sync::parse_device_kind(device);
  r.device_map = device_map;
  r.device_count = cuda_device_count;
  r.comm_backend = comm_backend;
  r.colocate = colocate;
  r.infer_tp = infer_tp;
  return r;
}

void RlOptions::check_infer_tp(const engine::ModelConfig* model) const {
  if (infer_tp < 1) {
    throw std::invalid_argument(fmt::format("--infer-tp must be >= 1, got {}", infer_tp));
  }
  if (infer_tp == 1) return;
  // What a tensor-parallel engine does not do (yet), named before any rank starts.
  if (trainer.lora.enabled()) {
    throw std::invalid_argument(
        "--infer-tp with --lora-rank: a tensor-parallel engine has no LoRA slots yet (use "
        "--infer-tp 1, or full fine-tuning)");
  }
  if (deterministic) {
    throw std::invalid_argument(
        "--infer-tp with --deterministic: a tensor-parallel engine sums its ranks' partial "
        "outputs, so its log-probs are not the trainer's bits (use --infer-tp 1)");
  }
  if (colocate == "on") {
    throw std::invalid_argument(
        "--infer-tp with --colocate on: a tensor-parallel engine spans several GPUs, so it pairs "
        "with no single trainer (use --colocate auto)");
  }
  // Heads, KV heads and the MLP must split (the error names the number that does not divide).
  if (model != nullptr) engine::tp_local_config(*model, {0, infer_tp});
}

void RlOptions::validate() {
  check_infer_tp(nullptr);
  // One node's placement: every error a placement can have (flags, GPU sharing) shows on one node.
  const sync::PlacementRequest where = placement_request();
  sync::plan_placement(sync::Topology{1, infer_per_node, train_per_node}, where);
  if (where.kind == sync::DeviceKind::kCuda && deterministic) {
    throw std::invalid_argument(
        "--deterministic needs --device cpu: its batch-invariant kernels are CPU code (the engine "
        "refuses it on CUDA too)");
  }
  if (!(traces.rate > 0 && traces.rate <= 1)) {
    throw std::invalid_argument(fmt::format(
        "--trace-rate must be in (0, 1] (the share of groups traced), got {}", traces.rate));
  }
  const double lr = trainer.schedule.lr;
  if (!(lr >= 0) || !(sft_schedule.lr >= 0)) {
    throw std::invalid_argument(
        fmt::format("--lr ({}) and --sft-lr ({}) must be >= 0", lr, sft_schedule.lr));
  }
  if (reproducible && serve_port >= 0 && !deterministic) {
    throw std::invalid_argument(
        "--reproducible with --serve-port needs --deterministic: HTTP requests join the engines' "
        "batches, and only batch-invariant engines give a rollout the same logits whatever its "
        "batch");
  }
  if (ppo_mini_batches < 1 || ppo_epochs < 1) {
    throw std::invalid_argument(
        fmt::format("--ppo-mini-batches ({}) and --ppo-epochs ({}) must be >= 1", ppo_mini_batches,
                    ppo_epochs));
  }
  if (trainer.grpo.tis_cap > 0 && (ppo_mini_batches > 1 || ppo_epochs > 1)) {
    // Decoupled PPO's proximal policy is the trainer's as it scores a micro-batch: after an update
    // of the step it is no longer the step's start, and the clip would never bind.
    throw std::invalid_argument(
        "--tis-cap with --ppo-mini-batches or --ppo-epochs above 1: the proximal policy would be "
        "each update's own, not the step's start (not built); use --tis-cap 0, whose clip "
        "binds against the engine's log-probs");
  }
  if (trainer.schedule.min_lr > lr) {
    throw std::invalid_argument(
        fmt::format("--min-lr {} is above --lr {} (the cosine decays "
                    "from --lr to --min-lr)",
                    trainer.schedule.min_lr, lr));
  }
  if (sft_schedule.min_lr > sft_schedule.lr) {
    throw std::invalid_argument(
        fmt::format("--sft-min-lr {} is above --sft-lr {} (the cosine "
                    "decays from --sft-lr to --sft-min-lr)",
                    sft_schedule.min_lr, sft_schedule.lr));
  }
  sft_schedule.validate();
  trainer.validate();
  // A checkpoint of the other kind, or another adapter shape: said before any rank loads it.
  if (!resume_dir.empty()) {
    const CheckpointState st = read_checkpoint_state(resume_dir);
    check_resume_shape(st, resume_dir, trainer.lora);
    // An adapter trained on a warmed-up base (--sft-trains model) resumes on that base alone.
    const std::string base = st.extra.value("warmed_base", std::string());
    namespace fs = std::filesystem;
    if (!base.empty() && fs::weakly_canonical(base) != fs::weakly_canonical(model_dir)) {
      throw std::invalid_argument(fmt::format(
          "--resume {}: its adapter was trained on the warmed-up base in {} (the run's warm-up "
          "trained the whole model); resume with --model {} --sft-steps 0",
          resume_dir, base, base));
    }
  }
  if (sft_trains_model && trainer.lora.enabled() && serve_port >= 0) {
    throw std::invalid_argument(
        "--serve-port with --lora-rank after a warm-up of the whole model (--sft-trains model, "
        "the default on the embedded model): the engines' base changes under the requests "
        "served; use --sft-trains adapter, or serve after training");
  }
  if (save_merged && (!trainer.lora.enabled() || save_dir.empty())) {
    throw std::invalid_argument(
        "--save-merged needs --lora-rank > 0 and --save-dir (a full fine-tuning "
        "checkpoint is already a model directory)");
  }
  if (sync.mode != sync::SyncMode::kBucket) {
    throw std::invalid_argument(fmt::format(
        "--sync-mode {} is a benchmark baseline (`colocated-rl bench sync` compares it); the RL "
        "job syncs in bucket mode",
        sync::sync_mode_name(sync.mode)));
  }
  if (trainer.micro_batch_tokens <= max_tokens) {
    throw std::invalid_argument(
        "--micro-batch-tokens must exceed --max-tokens (a sequence never "
        "splits across micro-batches)");
  }
  if (!env.empty()) {
    multi_turn.max_tokens_per_turn = max_tokens;
    if (multi_turn.max_turns < 1 || multi_turn.max_episode_tokens <= max_tokens) {
      throw std::invalid_argument(
          "--max-turns must be >= 1 and --max-episode-tokens above --max-tokens");
    }
    if (trainer.micro_batch_tokens < multi_turn.max_episode_tokens) {
      throw std::invalid_argument(
          fmt::format("--micro-batch-tokens ({}) must be at least --max-episode-tokens ({}): a "
                      "trajectory never "
                      "splits across micro-batches",
                      trainer.micro_batch_tokens, multi_turn.max_episode_tokens));
    }
    if (!data_path.empty() && env == "calculator") {
      throw std::invalid_argument(
          "--env calculator makes its own tasks: --data goes with an external environment (a "
          "command), whose reset gets each row as \"task\"");
    }
    if (reproducible) {
      throw std::invalid_argument(
          "--reproducible is not supported with --env: episodes finish in "
          "the order their environment answers");
    }
  }
  if (!(temperature > 0 && std::isfinite(temperature))) {
    throw std::invalid_argument(fmt::format(
        "--temperature {} must be > 0: GRPO learns from the differences between a prompt's "
        "samples, and greedy ones (0) are all the same",
        temperature));
  }
  if (steps < 0 || prompts_per_step < 1 || samples_per_prompt < 1 || max_tokens < 1) {
    throw std::invalid_argument(
        "--steps >= 0, --prompts-per-step, --n-samples and --max-tokens >= 1");
  }
}

RlRanks make_rl_ranks(sync::World& world, const RlOptions& o, const sync::CommFactory& make_own) {
  RlRanks r;
  r.env = world.env;
  sync::Topology topo{r.env.nnodes, o.infer_per_node, o.train_per_node};
  r.placement = sync::plan_placement(topo, o.placement_request());
  r.self = r.placement.rank(r.env.rank);
  const bool cuda = r.placement.kind == sync::DeviceKind::kCuda;
  if (cuda && o.device_map.empty() && topo.nnodes > 1) {
    // Without a map each node places its ranks by its own GPU count; the groups' backends agree
    // across nodes only if the counts do.
    at::Tensor n =
        at::tensor({int64_t{o.cuda_device_count}, -int64_t{o.cuda_device_count}}, at::kLong);
    world.comm->all_reduce(n, sync::ReduceOp::kMax);
    if (n[0].item<int64_t>() != -n[1].item<int64_t>()) {
      CRL_INVALID("the nodes see different numbers of CUDA devices (", -n[1].item<int64_t>(),
                  " to ", n[0].item<int64_t>(), "): give every node the same --device-map");
    }
  }
  sync::CommFactory own = make_own;
  if (!own && cuda) {
    const int gpu = r.self.gpu;
    sync::StorePtr store = world.store;
    own = [store, gpu](const std::string& backend, const std::string& prefix,
                       sync::GroupInfo info) {
      CRL_CHECK(backend == "nccl", "group ", info.name, ": unexpected backend ", backend);
      sync::select_cuda_device(gpu);  // an NCCL communicator lives on the current CUDA device
      return sync::make_nccl_communicator(store, prefix, std::move(info));
    };
  }
  r.g = sync::make_groups(std::move(world.comm), r.placement.topo, r.placement.group_backends(),
                          world.store, own);
  r.infer_total = topo.nnodes * topo.infer_per_node;
  r.train_total = topo.nnodes * topo.train_per_node;
  r.role_global =
      r.g.node * (r.g.role == sync::Role::kInfer ? topo.infer_per_node : topo.train_per_node) +
      topo.role_index(r.env.rank);
  return r;
}

RlContext::Start RlContext::read_start(const RlOptions& o) {
  if (o.resume_dir.empty()) return {};
  auto state = read_checkpoint_state(o.resume_dir);
  // The rows the data sampler drew before the save, replayed one by one at the resume: a count
  // from a damaged file must not spin the ranks (1e11 did).
  const nlohmann::json drawn = state.extra.value("rows_drawn", nlohmann::json(0));
  constexpr int64_t kMaxRowsDrawn = 100'000'000;
  if (!drawn.is_number_integer() || drawn.get<int64_t>() < 0 ||
      drawn.get<int64_t>() > kMaxRowsDrawn) {
    CRL_INVALID("--resume ", o.resume_dir, ": trainer_state.json's extra.rows_drawn ", drawn.dump(),
                " is not an integer in [0, ", kMaxRowsDrawn, "]");
  }
  return {state.step, drawn.get<int64_t>(), true};
}

TaskData::TaskData(const RlOptions& o, int64_t rows_drawn) {
  auto task = o.data_path.empty()
                  ? default_task_rows(o.default_task_rows, o.seed)
                  : load_task_jsonl(o.data_path, o.reward, o.model_dir, o.split_special_tokens);
  split_ = split_task(std::move(task), o.eval_rows, o.seed);
  if (split_.train.empty()) CRL_INVALID("the task has no training rows after the held-out split");
  rows_ = std::make_unique<RowSampler>(static_cast<int64_t>(split_.train.size()), o.seed + 17);
  for (int64_t i = 0; i < rows_drawn; ++i) rows_->next();
}

std::vector<int64_t> TaskData::draw(int64_t count) {
  std::vector<int64_t> out;
  for (int64_t i = 0; i < count; ++i) out.push_back(rows_->next());
  return out;
}

RlContext::RlContext(const sync::RankEnv& env, const RlOptions& options)
    : RlContext(sync::join_world(env, options.timeout), options, read_start(options)) {}

RlContext::RlContext(sync::World world, const RlOptions& options, const Start& start)
    : o(options),
      coord(std::make_unique<sync::Coordinator>(world.store, kScope)),
      ranks(make_rl_ranks(world, options)),
      versions(options, start.step, start.resumed),
      data(options, start.rows_drawn) {
  if (ranks.env.rank == 0) {
    fmt::print("{}", ranks.placement.table());
    const MemoryPlan plan = plan_memory(engine::load_model_config(o.model_dir), o, ranks.placement);
    fmt::print("{}", plan.table(device_capacities(plan)));
    if (o.kv_handover) {
      fmt::print(
          "colocated: each engine and the trainer beside it take turns, --max-staleness 0: the "
          "engine frees its KV pool while its trainer trains and takes it back for the next "
          "rollouts\n");
    } else if (ranks.placement.topo.paired) {
      fmt::print(
          "colocated pairs, --max-staleness {}: engines and trainers run at once (no memory "
          "hand-over{})\n",
          o.max_staleness, o.serve_port >= 0 ? ": --serve-port needs the KV pool" : "");
    }
    if (const std::string note = engine::kernels::openblas_raise_note(); !note.empty()) {
      fmt::print("{}\n", note);
    }
    std::fflush(stdout);
  }
  if (start.resumed && ranks.env.rank == 0) {
    fmt::print("resumed from {} at step {} (data cursor {})\n", o.resume_dir, start.step,
               start.rows_drawn);
  }
}

std::unique_ptr<sync::Coordinator> RlContext::connect_own_coordinator() const {
  return sync::Coordinator::connect(ranks.env, o.timeout, kScope);
}

sync::WeightSyncOptions rl_sync_options(const RlOptions& o, const sync::RankPlacement& self) {
  sync::WeightSyncOptions so = o.sync;
  so.device = at::Device(self.device);
  return so;
}

int rl_sync_lanes(const RlOptions& o, const sync::Groups& g) {
  return o.infer_tp > 1 && g.topo.lanes == o.infer_tp ? o.infer_tp : 1;
}

// A placement with NCCL groups needs libnccl and libcudart at run time: refused here rather than
// by every rank at its first NCCL group.
void check_nccl_usable(const RlOptions& o) {
  if (o.device != "cuda") return;
  const sync::Placement p = sync::plan_placement(
      sync::Topology{1, o.infer_per_node, o.train_per_node}, o.placement_request());
  std::string why;
  if (p.any_nccl() && !sync::nccl_available(&why)) {
    throw std::invalid_argument(fmt::format(
        "--device cuda: the train or sync_root groups have their members on distinct GPUs and so "
        "run on NCCL (--comm-backend {}), which is not usable here: {}; use --comm-backend gloo",
        o.comm_backend, why));
  }
}

// Colocated pairs sharing a GPU (or --colocate on on the CPU, standing in for GPUs; docs/design.md
// §5) take turns: synchronous steps unless --max-staleness was given, and the KV pool handed to
// the trainer (not while an API server shares the engines).
void resolve_colocated_schedule(const sync::Placement& where, bool staleness_given, RlOptions* o) {
  const bool share =
      where.topo.paired && (where.kind == sync::DeviceKind::kCpu ||
                            sync::colocate_pairs("auto", where.topo, where.gpu_of_local));
  if (share && !staleness_given) o->max_staleness = 0;
  o->kv_handover = share && o->max_staleness == 0 && o->serve_port < 0;
}

bool hands_over_warmed_base(const RlOptions& o, bool runs_sft) {
  return o.sft_trains_model && o.trainer.lora.enabled() && runs_sft;
}

sync::WeightLayout warmed_base_layout(const engine::ModelConfig& config, const RlOptions& o) {
  const at::ScalarType dtype = engine::parse_dtype(o.engine_dtype);
  std::vector<sync::TensorSpec> specs;
  for (const engine::ParamSpec& p : engine::model_param_specs(config)) {
    specs.push_back({p.name, p.shape, dtype});
  }
  return sync::WeightLayout::plan(specs, o.bucket_bytes);
}

std::unique_ptr<sync::WeightSync> warmed_base_sync(RlContext& c, const sync::WeightLayout& layout) {
  sync::WeightSyncOptions bo = rl_sync_options(c.o, c.ranks.self);
  bo.scope = "base";
  return std::make_unique<sync::WeightSync>(c.ranks.g, c.coord->store(), layout, bo);
}

std::string kv_released_key(int node, const std::string& phase, int i) {
  return fmt::format("colo/node{}/{}/kv-released/{}", node, phase, i);
}

std::string handover_phase(int64_t step) { return fmt::format("s{}", step); }

Fault parse_fault(const std::string& s) {
  if (s.empty()) return {};
  Fault f;
  char end = 0;
  if (std::sscanf(s.c_str(), "die-at-step:%d:%ld%c", &f.rank, &f.step, &end) == 2) {
    f.kind = "die-at-step";
  } else if (std::sscanf(s.c_str(), "hold-kv:%d%c", &f.rank, &end) == 1) {
    f.kind = "hold-kv";
  } else {
    CRL_INVALID("unknown fault '", s, "' (die-at-step:RANK:STEP or hold-kv:RANK)");
  }
  return f;
}

}  // namespace crl::trainer
