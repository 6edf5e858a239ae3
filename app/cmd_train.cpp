// colocated-rl [train] --gpus-infer I --gpus-train T ...: the RL job (the project's main job).
#include <ATen/ATen.h>
#include <fmt/format.h>
#include <sys/stat.h>
#include <torch/cuda.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cstdlib>

#include "app/cli_style.h"
#include "app/commands.h"
#include "app/launcher.h"
#include "app/rl_job.h"
#include "app/sync_flags.h"
#include "app/train_flags.h"
#include "common/units.h"
#include "engine/model/config.h"
#include "engine/model/model_cache.h"
#include "sync/dist_env.h"
#include "sync/placement.h"
#include "trainer/memory_plan.h"

namespace crl::app {
namespace {

// CUDA devices this process sees (0 with a libtorch built without CUDA).
int visible_cuda_devices() {
  return at::hasCUDA() ? static_cast<int>(torch::cuda::device_count()) : 0;
}

}  // namespace

// The model, where it runs, and the task.
void add_model_and_task_flags(CLI::App* cmd, TrainFlags* f) {
  RlJobOptions& o = f->o;
  cmd->option_defaults()->group(kGroupModel);
  cmd->add_option("--model", o.model_dir,
                  "Hugging Face model directory (default: the embedded one)");
  cmd->add_option("--device", o.device,
                  "cpu, or cuda: each rank's engine or trainer on one GPU (--device-map, else "
                  "local rank mod the GPU count); world rank 0 prints where each rank runs")
      ->capture_default_str();
  cmd->add_option("--device-map", f->device_map,
                  "with --device cuda: the GPU index of each local rank, infer ranks first, then "
                  "train ranks (I + T entries), e.g. 0,0 (one GPU shared) or 0,1,2,3");
  cmd->add_option("--dtype", o.engine_dtype, "engine compute dtype: float32 or bfloat16")
      ->capture_default_str();
  cmd->add_option("--train-dtype", f->train_dtype,
                  "trainer compute dtype (masters stay fp32; default: the engine's)");
  cmd->add_option("--kv-memory", f->kv_memory, "KV cache pool per engine")->capture_default_str();
  cmd->add_option("--infer-tp", o.infer_tp,
                  "split each engine's heads and MLP over N tensor-parallel ranks (threads of its "
                  "process; with --device cuda, engine i on GPUs i*N.. and the trainers after): "
                  "--gpus-infer counts engines")
      ->check(CLI::Range(1, 64))
      ->capture_default_str();
  cmd->add_flag("--deterministic", o.deterministic,
                "batch-invariant engine and matching trainer: log-prob gap exactly 0");
  cmd->add_option("--cpu-kernels", o.cpu_kernels,
                  "the engines' CPU linear layers: auto (the project's kernels where they beat "
                  "libtorch's, steps of 2+ tokens) or libtorch (at::linear everywhere)")
      ->check(CLI::IsMember({"auto", "libtorch"}))
      ->capture_default_str();
  cmd->option_defaults()->group(kGroupData);
  cmd->add_option("--data", o.data_path,
                  "JSONL rows {\"prompt\", \"answer\"} or {\"messages\": [chat], \"answer\"} "
                  "(a chat, rendered with the model's template; default: the built-in copy task)");
  cmd->add_flag("--split-special-tokens", o.split_special_tokens,
                "--data is untrusted (e.g. scraped from the web): special-token literals in its "
                "prompts, messages and answers are text, not control tokens (the chat template's "
                "own stay tokens)");
  cmd->add_option("--reward", f->reward,
                  "exact, numeric, regex or format (built in, on the answer part: "
                  "--answer-extract), or a command line that scores the completions: a program "
                  "speaking JSON lines, one per infer rank (verl's compute_score; see "
                  "docs/rewards.md and examples/rewards/gsm8k.py)")
      ->capture_default_str();
  f->extract_opt =
      cmd->add_option("--answer-extract", f->answer_extract,
                      "the answer part the built-in rewards judge: first-line, last-line, "
                      "after:STR (e.g. after:#### for GSM8K), boxed (the last \\boxed{...}) or "
                      "full")
          ->capture_default_str();
  cmd->add_option("--reward-timeout", f->reward_timeout_s,
                  "--reward COMMAND: seconds it has for one reply (then the request's completions "
                  "score 0, counted as crl/reward_errors)")
      ->capture_default_str()
      ->check(in_range(0.001, 86400.0));
  cmd->add_option("--format-weight", o.reward.format_weight,
                  "bonus for a well-formed answer (added to the correctness reward)");
  cmd->add_option("--eval-rows", o.eval_rows,
                  "held-out rows, never trained on (default: a fifth of the rows, at most 128)")
      ->check(at_least(0));
  cmd->add_option("--seed", o.seed, "seed of the split, prompt order and sampling")
      ->capture_default_str();
}

// The SFT warm-up, GRPO's schedule and the optimizer's state.
void add_schedule_flags(CLI::App* cmd, TrainFlags* f) {
  RlJobOptions& o = f->o;
  cmd->option_defaults()->group(kGroupRl);
  f->sft_steps_opt =
      cmd->add_option(
             "--sft-steps", o.sft_steps,
             "SFT warm-up steps before GRPO (0 = none; 400 with --sft-trains adapter, 800 with "
             "--env calculator on the embedded model, 0 with a --reward COMMAND)")
          ->check(at_least(0))
          ->capture_default_str();
  cmd->add_option("--sft-rows", o.sft_rows_per_step, "rows per SFT step")
      ->capture_default_str()
      ->check(at_least(1));
  f->sft_target_opt =
      cmd->add_option("--sft-target", f->sft_target,
                      "what the SFT warm-up trains on: each row's demonstration (the built-in "
                      "task's: its words in a random order, the format without the order; the "
                      "calculator's: the right calls, then a number of the conversation at random; "
                      "a --data row's \"demonstration\", else its answer) or its answer (answer "
                      "with --sft-trains adapter)")
          ->check(CLI::IsMember({"demonstration", "answer"}))
          ->capture_default_str();
  cmd->add_option(
         "--sft-trains", f->sft_trains,
         "with --lora-rank, what the warm-up trains: the whole model (at full fine-tuning's "
         "memory; GRPO's adapter then adapts it), the adapter alone, or auto (model on "
         "the embedded model, adapter on a --model or with --env)")
      ->check(CLI::IsMember({"auto", "model", "adapter"}))
      ->capture_default_str();
  f->sft_lr_opt = cmd->add_option("--sft-lr", o.sft_schedule.lr,
                                  "SFT peak learning rate (2e-3 with --sft-trains adapter)")
                      ->capture_default_str();
  cmd->add_option("--sft-warmup-steps", o.sft_schedule.warmup_steps,
                  "SFT linear warmup steps (to --sft-lr)")
      ->capture_default_str();
  cmd->add_option("--sft-min-lr", f->sft_min_lr,
                  "SFT cosine floor: after warmup the lr decays from --sft-lr to this over "
                  "--sft-steps (default: --sft-lr / 10; equal to --sft-lr: constant)");
  f->steps_opt = cmd->add_option("--steps", o.steps,
                                 "GRPO steps (60 with --sft-trains adapter, 40 with --env "
                                 "calculator on the embedded model, 90 with --env otherwise)")
                     ->capture_default_str()
                     ->check(at_least(0));
  cmd->add_option("--prompts-per-step", o.prompts_per_step, "prompts per GRPO step (all engines)")
      ->capture_default_str()
      ->check(at_least(1));
  cmd->add_option("--n-samples", o.samples_per_prompt, "samples per prompt (a GRPO group)")
      ->capture_default_str()
      ->check(at_least(1));
  f->temperature_opt =
      cmd->add_option("--temperature", o.temperature,
                      "rollout sampling temperature (0.3 with --sft-trains adapter)")
          ->capture_default_str();
  f->max_tokens_opt =
      cmd->add_option("--max-tokens", o.max_tokens,
                      "generated tokens per sample at most (64 with --env calculator on the "
                      "embedded model)")
          ->capture_default_str()
          ->check(at_least(1));
  f->lr_opt =
      cmd->add_option("--lr", f->lr,
                      "GRPO peak learning rate (1e-3 with --sft-trains model, 1e-4 with adapter, "
                      "3e-4 with --env)")
          ->capture_default_str();
  f->warmup_opt = cmd->add_option("--warmup-steps", o.trainer.schedule.warmup_steps,
                                  "GRPO linear warmup steps (0 with --sft-trains adapter)")
                      ->capture_default_str();
  cmd->add_option("--min-lr", f->min_lr,
                  "GRPO cosine floor: after warmup the lr decays from --lr to this over --steps "
                  "(default: --lr / 10; equal to --lr: constant)");
  cmd->add_option("--weight-decay", o.trainer.weight_decay, "AdamW weight decay (matrices)")
      ->capture_default_str();
  cmd->add_option("--max-grad-norm", o.trainer.max_grad_norm, "gradient clipping (0 = off)")
      ->capture_default_str();
  cmd->add_option("--zero", o.trainer.zero_stage,
                  "ZeRO stage over the train ranks: 0 replicated, 1 sharded optimizer state, 2 "
                  "also sharded gradients, 3 also sharded parameters (default: 2 with more than "
                  "one train rank, else 0)")
      ->check(in_range(0, 3));
  cmd->add_flag("--activation-checkpointing", o.trainer.activation_checkpointing,
                "recompute each decoder layer's activations in backward");
  cmd->add_flag("--offload-optimizer", o.trainer.offload_optimizer,
                "keep fp32 masters and Adam moments in host memory (AdamW steps there)");
  cmd->add_option("--logits-chunk-tokens", o.trainer.logits_chunk_tokens,
                  "loss rows whose fp32 logits the trainer computes at once, recomputing them in "
                  "backward (0: as many as make 1 GiB of logits)")
      ->capture_default_str()
      ->check(at_least(0));
}

// LoRA: train and sync an adapter alone.
void add_lora_flags(CLI::App* cmd, TrainFlags* f) {
  RlJobOptions& o = f->o;
  cmd->option_defaults()->group(kGroupLora);
  cmd->add_option("--lora-rank", o.trainer.lora.rank,
                  "train a LoRA adapter of this rank on the frozen base and sync only the adapter "
                  "(0 = full fine-tuning)")
      ->capture_default_str()
      ->check(at_least(0));
  cmd->add_option("--lora-alpha", o.trainer.lora.alpha,
                  "LoRA alpha (the update is scaled by alpha / rank)")
      ->capture_default_str();
  cmd->add_option("--lora-targets", o.trainer.lora.targets,
                  "the adapted linear layers: all-linear or a comma list of q,k,v,o,gate,up,down")
      ->capture_default_str();
  cmd->add_option("--lora-dropout", o.trainer.lora.dropout,
                  "dropout on the adapters' input (training passes)")
      ->capture_default_str();
}

// GRPO's loss, asynchrony and the rollout queue.
void add_rl_flags(CLI::App* cmd, TrainFlags* f) {
  RlJobOptions& o = f->o;
  cmd->option_defaults()->group(kGroupRl);
  cmd->add_option("--micro-batch-tokens", o.trainer.micro_batch_tokens,
                  "tokens per packed micro-batch")
      ->capture_default_str();
  cmd->add_option("--kl-coef", o.trainer.grpo.kl_coef, "k3 KL to the initial model (0 = off)")
      ->capture_default_str();
  cmd->add_option("--tis-cap", o.trainer.grpo.tis_cap,
                  "truncated importance sampling (decoupled PPO): each token's term is weighted by "
                  "min(proximal (trainer) / behaviour (engine) probability, C) and the PPO clip "
                  "moves to the proximal policy; 0 = off: the clip binds against the behaviour "
                  "log-probs (see the README for why off is the default at any --max-staleness)")
      ->capture_default_str();
  f->staleness_opt =
      cmd->add_option("--max-staleness", o.max_staleness,
                      "asynchronous RL: engines generate step s under weights at most K versions "
                      "older than the ones step s trains (0 = synchronous; the default where "
                      "engines and trainers are colocated pairs, --colocate)")
          ->capture_default_str()
          ->check(at_least(0));
  cmd->add_option(
         "--inflight-update", f->inflight,
         "a weight update reaching running sequences: keep (their KV), recompute (their KV "
         "under the new weights) or abort (restart them)")
      ->capture_default_str();
  cmd->add_flag("--reproducible", o.reproducible,
                "two runs with the same flags give the same numbers: engines take new weights only "
                "between RL steps (step s is sampled entirely by the weights K versions behind "
                "it), and rollouts are packed and trained in a fixed order; the rollout queue is "
                "then unbounded (at most K + 1 steps of rollouts; see the README)");
  cmd->add_option("--rollout-queue", o.rollout_queue,
                  "packed micro-batches an infer rank queues before it stops admitting prompts")
      ->capture_default_str()
      ->check(positive());
  cmd->add_option("--clip", o.trainer.grpo.clip_low, "PPO ratio clip range")->capture_default_str();
  cmd->add_option("--ppo-mini-batches", o.ppo_mini_batches,
                  "optimizer updates a GRPO step, each on an even share of its rollouts (verl's "
                  "ppo_mini_batch_size as a count; after the first the PPO clip acts even at "
                  "--max-staleness 0)")
      ->capture_default_str()
      ->check(at_least(1));
  cmd->add_option("--ppo-epochs", o.ppo_epochs,
                  "passes over each GRPO step's rollouts (verl's ppo_epochs)")
      ->capture_default_str()
      ->check(at_least(1));
}

// Evaluation, metrics, checkpoints and the API served during training.
void add_output_flags(CLI::App* cmd, TrainFlags* f) {
  RlJobOptions& o = f->o;
  cmd->option_defaults()->group(kGroupOutput);
  cmd->add_option("--eval-every", o.eval_every, "held-out evaluation every N steps (0: never)")
      ->capture_default_str()
      ->check(at_least(0));
  cmd->add_option("--metrics", o.metrics_path,
                  "JSONL metrics file in verl's file-logger form ({\"step\": N, \"data\": {...}}, "
                  "verl's metric names): the run's settings, the evals, each SFT and GRPO step");
  cmd->add_option("--traces", o.traces.path,
                  "append one JSON line per rollout sample (step, prompt and completion text and "
                  "ids, reward, advantage, each token's log-prob and weight version) to this file");
  cmd->add_option("--trace-rate", o.traces.rate,
                  "share of GRPO groups --traces writes, the same groups in every run of a seed")
      ->capture_default_str();
  cmd->add_flag("--verbose", o.verbose,
                "each GRPO step's full line (throughput, timings, staleness, importance weights, "
                "idle shares) instead of the short one");
  cmd->add_option("--tensorboard", o.tensorboard_dir,
                  "write TensorBoard event files into this directory (every per-step metric and "
                  "eval; `tensorboard --logdir DIR`, or `wandb sync DIR`)");
  cmd->add_option("--save-dir", o.save_dir, "checkpoints go to DIR/step-N (HF layout + optimizer)");
  cmd->add_option("--save-every", o.save_every,
                  "checkpoint every N steps; with --save-dir there is always one at the end");
  cmd->add_option("--resume", o.resume_dir, "continue from a checkpoint directory");
  cmd->add_flag(
      "--save-merged", o.save_merged,
      "with --lora-rank: each checkpoint also holds merged/, a model directory of the base "
      "with the adapter merged in (the adapter alone is the checkpoint)");
  cmd->add_option("--serve-port", o.serve_port,
                  "serve the OpenAI API during training: infer rank k on PORT + k (0: any port)");
  cmd->add_option("--serve-host", o.serve_host, "address the API binds")->capture_default_str();
  cmd->add_option("--serve-api-key", o.serve_api_key,
                  "the API (--serve-port) requires 'Authorization: Bearer KEY' on every endpoint "
                  "but /health and /metrics; from $CRL_API_KEY when not given")
      ->envname("CRL_API_KEY");
}

// Multi-turn RL against an environment.
void add_env_flags(CLI::App* cmd, TrainFlags* f) {
  RlJobOptions& o = f->o;
  cmd->option_defaults()->group(kGroupEnv);
  cmd->add_option("--env", o.env,
                  "multi-turn RL against an environment: 'calculator' (built in: 4-digit additions "
                  "with an add tool) or a command speaking JSON lines on stdin/stdout (started per "
                  "infer rank; see trainer/process_env.h); --max-tokens caps each assistant turn");
  cmd->add_option("--max-turns", o.multi_turn.max_turns,
                  "--env: assistant turns per episode at most")
      ->capture_default_str();
  cmd->add_option("--max-episode-tokens", o.multi_turn.max_episode_tokens,
                  "--env: token ids per episode at most (prompt, turns and tool results)")
      ->capture_default_str();
  cmd->add_option("--env-timeout", f->env_timeout_s,
                  "--env: seconds an external environment has for one reply (then the episode ends "
                  "with env_timeout, reward 0)")
      ->capture_default_str();
  cmd->add_option("--env-pass", o.env_options.pass_env,
                  "--env COMMAND: environment variables it gets beside PATH, HOME, LANG, TMPDIR, "
                  "PYTHONPATH and a few others (names, comma-separated; NAME* for a prefix); it "
                  "gets no other: not the API key, not the rendezvous store's address")
      ->delimiter(',');
  cmd->add_option("--env-procs", o.env_options.processes,
                  "--env COMMAND: processes per infer rank (each answers one request at a time: "
                  "this many episodes' tool calls run at once)")
      ->capture_default_str()
      ->check(in_range(1, 256));
  cmd->add_option("--env-digits", o.env_options.calculator_digits,
                  "--env calculator: digits of each operand")
      ->capture_default_str();
  cmd->add_option("--env-operands", o.env_options.calculator_operands,
                  "--env calculator: operands of each task (N: N - 1 add calls, N turns)")
      ->capture_default_str()
      ->check(in_range(2, 8));
}

namespace {

// Whether sh can run `word` as a command's first word: a file that can run (with a '/'), a program
// on PATH, a shell builtin, or a variable assignment.
bool program_found(const std::string& word) {
  static const char* const kShell[] = {"cd",     "exec",  "eval",    ".",    "export", "set",
                                       "ulimit", "umask", "command", "nice", "(",      "{"};
  if (word.find('=') != std::string::npos) return true;
  if (std::find(std::begin(kShell), std::end(kShell), word) != std::end(kShell)) return true;
  auto runnable = [](const std::string& path) {
    struct stat st {};
    return ::stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode) &&
           ::access(path.c_str(), X_OK) == 0;
  };
  if (word.find('/') != std::string::npos) return runnable(word);
  const char* path = std::getenv("PATH");
  std::string dirs = path ? path : "/usr/bin:/bin";
  for (size_t b = 0; b <= dirs.size();) {
    size_t e = dirs.find(':', b);
    if (e == std::string::npos) e = dirs.size();
    const std::string dir = e > b ? dirs.substr(b, e - b) : ".";
    if (runnable(dir + "/" + word)) return true;
    b = e + 1;
  }
  return false;
}

// --reward: a built-in kind, else a command line whose program must be found (a typo of a kind
// fails here, not as a reward_died on every request); --answer-extract.
void resolve_reward(const TrainFlags& f, RlJobOptions* o) {
  static const char* const kKinds[] = {"exact", "numeric", "regex", "format"};
  const bool builtin =
      std::find(std::begin(kKinds), std::end(kKinds), f.reward) != std::end(kKinds);
  o->reward.extract = trainer::parse_answer_extract(f.answer_extract);
  if (builtin) {
    o->reward.kind = trainer::parse_reward_kind(f.reward);
    return;
  }
  const size_t b = f.reward.find_first_not_of(" \t");
  const std::string program =
      b == std::string::npos ? "" : f.reward.substr(b, f.reward.find_first_of(" \t", b) - b);
  if (program.empty() || !program_found(program)) {
    throw std::invalid_argument(fmt::format(
        "--reward '{}': not a built-in reward (exact, numeric, regex, format) and '{}' is no "
        "program on PATH or file that can run; a reward program is a command line, e.g. --reward "
        "'python3 examples/rewards/gsm8k.py'",
        f.reward, program));
  }
  if (!o->env.empty()) {
    throw std::invalid_argument(
        "--reward COMMAND scores single-turn completions; an --env's episodes are scored by the "
        "environment (its \"done\" reply carries the reward)");
  }
  if (f.extract_opt->count() > 0) {
    throw std::invalid_argument(
        "--answer-extract chooses what the built-in rewards judge; a reward program (--reward "
        "COMMAND) gets the whole completion");
  }
  o->reward.program = f.reward;
  // The warm-up trains on each row's demonstration, else its answer: a program's ground truth is
  // not what the model should write (GSM8K's "72" against "... #### 72"), so it runs only when
  // asked for.
  if (f.sft_steps_opt->count() == 0) o->sft_steps = 0;
  o->reward.program_timeout =
      std::chrono::milliseconds(static_cast<int64_t>(f.reward_timeout_s * 1000));
}

// Bad data, and a held-out split the data cannot give, fail here, in the launcher, once, before
// any rank starts.
void check_task_data(const RlJobOptions& o) {
  auto rows = o.data_path.empty() ? trainer::default_task_rows(o.default_task_rows, o.seed)
                                  : trainer::load_task_jsonl(o.data_path, o.reward, o.model_dir,
                                                             o.split_special_tokens);
  const trainer::TaskSplit split = trainer::split_task(std::move(rows), o.eval_rows, o.seed);
  if (split.train.empty()) {
    throw std::invalid_argument(
        fmt::format("the task has no training rows after the held-out split ({} held out, {} "
                    "more left out: their prompt is a held-out row's)",
                    split.eval.size(), split.dropped_train_rows));
  }
}

// The job's options from the flags; what fails here fails in the launcher, before any rank starts.
RlJobOptions resolve_train_flags(const TrainFlags& flags) {
  const TrainFlags* f = &flags;
  RlJobOptions o = f->o;
  o.infer_per_node = f->dist.infer;
  o.train_per_node = f->dist.train;
  if (o.model_dir.empty()) {
    o.model_dir = engine::ensure_preset_model("default");
  } else {
    check_model_dir("--model", o.model_dir);  // once, here, not in every rank
  }
  o.kv_memory_bytes = parse_bytes(f->kv_memory);
  resolve_reward(*f, &o);
  check_task_data(o);
  o.trainer.dtype = f->train_dtype.empty() ? o.engine_dtype : f->train_dtype;
  double grpo_lr = f->lr;
  o.sft_trains_model = o.trainer.lora.enabled() && o.sft_steps > 0 &&
                       (f->sft_trains == "model" ||
                        (f->sft_trains == "auto" && f->o.model_dir.empty() && o.env.empty()));
  if (o.sft_trains_model) {
    // LoRA on a warmed-up model (docs/lora.md): the warm-up, the full job's, stands in for
    // pretraining; GRPO trains the adapter at 1e-3 (2e-3 dipped early at K = 0 on 2 seeds of 8).
    if (f->lr_opt->count() == 0) grpo_lr = 1e-3;
  } else if (o.trainer.lora.enabled()) {
    // The adapter alone learns the task in its warm-up (400 steps at 2e-3 on the answers; through
    // adapters the random-init model's output stays flat: rollouts at temperature 0.3, GRPO 60
    // steps at 1e-4 without warmup; docs/lora.md).
    if (f->sft_lr_opt->count() == 0) o.sft_schedule.lr = 2e-3;
    if (f->sft_steps_opt->count() == 0) o.sft_steps = 400;
    if (f->temperature_opt->count() == 0) o.temperature = 0.3;
    if (f->lr_opt->count() == 0) grpo_lr = 1e-4;
    if (f->sft_target_opt->count() == 0) o.sft_on_answers = true;
    if (f->steps_opt->count() == 0) o.steps = 60;
    if (f->warmup_opt->count() == 0) o.trainer.schedule.warmup_steps = 0;
  }
  if (f->sft_target_opt->count() > 0) o.sft_on_answers = f->sft_target == "answer";
  o.env_options.calculator_demo_any_number = !o.sft_on_answers;
  // Multi-turn jobs keep 90 steps at 3e-4 (110 at 2e-4 was not measured there). The built-in
  // calculator on the embedded model has its measured recipe (16 runs:
  // docs/results/2026-11-30-calculator-split.md): 800 warm-up steps (its format is not learned in
  // 500), 40 GRPO steps, 64 tokens a turn.
  if (!o.env.empty() && !o.trainer.lora.enabled()) {
    const bool calculator_job = o.env == "calculator" && f->o.model_dir.empty();
    if (f->lr_opt->count() == 0) grpo_lr = 3e-4;
    if (f->steps_opt->count() == 0) o.steps = calculator_job ? 40 : 90;
    if (calculator_job) {
      if (f->sft_steps_opt->count() == 0) o.sft_steps = 800;
      if (f->max_tokens_opt->count() == 0) o.max_tokens = 64;
    }
  }
  o.trainer.schedule.lr = grpo_lr;
  o.trainer.schedule.min_lr = f->min_lr >= 0 ? f->min_lr : grpo_lr / 10;
  o.trainer.schedule.total_steps = o.steps;
  o.sft_schedule.min_lr = f->sft_min_lr >= 0 ? f->sft_min_lr : o.sft_schedule.lr / 10;
  o.trainer.grpo.clip_high = o.trainer.grpo.clip_low;
  o.inflight = engine::parse_inflight_policy(f->inflight);
  o.timeout = f->dist.timeout();
  o.rollout_timeout = std::chrono::milliseconds(static_cast<int64_t>(f->rollout_timeout_s * 1000));
  o.env_options.timeout = std::chrono::milliseconds(static_cast<int64_t>(f->env_timeout_s * 1000));
  o.env_options.seed = o.seed;
  o.trainer.lora.seed = o.seed;
  o.traces.seed = o.seed;
  o.bucket_bytes = f->dist.bucket_bytes();
  o.sync = f->dist.sync_options();
  o.device_map = sync::parse_device_map(f->device_map);
  o.comm_backend = f->dist.backend;
  o.colocate = f->dist.colocate;
  // Counted only when asked for: a CPU job never touches CUDA.
  if (o.device == "cuda") o.cuda_device_count = visible_cuda_devices();
  // Pairs on GPUs of their own (--colocate on, 4 + 4 on 8 GPUs) share nothing and stay
  // asynchronous.
  const sync::Placement where = sync::plan_placement(
      sync::Topology{1, o.infer_per_node, o.train_per_node}, o.placement_request());
  trainer::resolve_colocated_schedule(where, f->staleness_opt->count() > 0, &o);
  // Placement errors (no CUDA device, a bad --device-map, GPU sharing NCCL cannot serve) fail
  // here, in the launcher, before any rank starts.
  o.validate();
  if (o.infer_tp > 1) {
    const engine::ModelConfig model = engine::load_model_config(o.model_dir);
    o.check_infer_tp(&model);
  }
  trainer::check_nccl_usable(o);
  // A GPU that cannot hold what the placement puts on it: refused before any rank loads anything
  // (ZeRO shards over every node's train ranks). On the CPU the plan is only printed.
  if (o.device == "cuda") {
    int nnodes = 1;
    try {
      nnodes =
          sync::resolve_dist_env(o.infer_per_node + o.train_per_node, sync::process_env()).nnodes;
    } catch (const std::invalid_argument&) {
    }
    const trainer::MemoryPlan plan = trainer::plan_memory(
        engine::load_model_config(o.model_dir), o,
        sync::plan_placement(sync::Topology{nnodes, o.infer_per_node, o.train_per_node},
                             o.placement_request()));
    plan.check_fits(trainer::device_capacities(plan));
  }
  return o;
}

}  // namespace

Runner register_train(CLI::App& app) {
  auto f = std::make_shared<TrainFlags>();
  f->dist.timeout_s = 300;
  auto& o = f->o;
  o.trainer.micro_batch_tokens = 2048;
  o.trainer.max_grad_norm = 1.0;
  // GRPO (docs/rl-job.md): 110 steps, a 10-step warmup to 2e-4 (without it Adam's first full-size
  // steps undid the warm-up's format on one seed of two), cosine to 2e-5.
  o.trainer.schedule.warmup_steps = 10;
  auto* cmd = app.add_subcommand("train",
                                 "GRPO post-training with colocated engines (the default command: "
                                 "`colocated-rl --gpus-infer I --gpus-train T` runs it)");
  // Help shows the groups in this order.
  add_model_and_task_flags(cmd, f.get());
  add_schedule_flags(cmd, f.get());
  add_rl_flags(cmd, f.get());
  add_lora_flags(cmd, f.get());
  add_env_flags(cmd, f.get());
  add_output_flags(cmd, f.get());
  add_dist_flags(*cmd, f->dist, /*with_sync=*/true);
  add_colocate_flag(*cmd, f->dist);
  cmd->option_defaults()->group(kGroupDist);
  cmd->add_option("--rollout-timeout", f->rollout_timeout_s,
                  "seconds a train rank waits for one step's rollouts")
      ->capture_default_str();
  cmd->add_option("--inject-fault", o.fault, "tests only: die-at-step:RANK:STEP")->group("");
  return [f]() {
    const RlJobOptions o = resolve_train_flags(*f);
    LaunchOptions lo{o.infer_per_node, o.train_per_node, o.timeout};
    return run_distributed(lo, [o](const sync::RankEnv& env) { return run_rl_rank(env, o); });
  };
}

}  // namespace crl::app
