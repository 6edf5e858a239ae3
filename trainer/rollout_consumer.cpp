#include "trainer/rollout_consumer.h"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <csignal>
#include <cstdio>
#include <filesystem>
#include <limits>
#include <thread>

#include "common/check.h"
#include "common/tfevents.h"
#include "common/units.h"
#include "engine/cuda_graph.h"
#include "engine/model/config.h"
#include "engine/model/model_writer.h"
#include "engine/model/tensor_parallel.h"
#include "sync/rollout_transport.h"
#include "sync/store.h"
#include "sync/weight_layout.h"
#include "sync/weight_sync.h"
#include "text/chat_template.h"
#include "text/tokenizer.h"
#include "trainer/checkpoint.h"
#include "trainer/environment.h"
#include "trainer/make_environment.h"
#include "trainer/metrics.h"
#include "trainer/micro_batch.h"
#include "trainer/multi_turn.h"
#include "trainer/prompt_encoder.h"
#include "trainer/step_reports.h"

namespace crl::trainer {
namespace fs = std::filesystem;
namespace {

using Clock = std::chrono::steady_clock;

// The ZeRO-2 round counters of a step (see round_runnable).
const char* const kRounds = "zr";
std::string have_counter(int64_t i) { return fmt::format("have{}", i); }
std::string ended_counter(int64_t i) { return fmt::format("ended{}", i); }
const char* const kEnded = "ended";

}  // namespace

bool round_runnable(int64_t have_i, int64_t ended, int64_t ended_i, int64_t ranks) {
  return have_i >= 1 && have_i + (ended - ended_i) == ranks;
}

RolloutConsumer::RolloutConsumer(RlContext& ctx) : c_(ctx), o_(ctx.o) {
  sync::RolloutRoute route{c_.ranks.g.node, c_.ranks.g.topo.infer_per_node,
                           c_.ranks.g.topo.train_per_node};
  receiver_ = std::make_unique<sync::RolloutReceiver>(
      c_.coord->store(), *c_.ranks.g.sync, route, c_.ranks.g.topo.role_index(c_.ranks.env.rank));
}

RolloutConsumer::~RolloutConsumer() = default;

TrainerOptions rollout_trainer_options(const RlOptions& o, const sync::RankPlacement& self,
                                       sync::Communicator* train_group) {
  CRL_CHECK(self.role == sync::Role::kTrain, "rank ", self.world_rank, " is not a train rank");
  TrainerOptions topts = o.trainer;
  topts.device = self.device;
  topts.deterministic = o.deterministic;
  topts.group = train_group;
  // GRPO scores the tokens under the distribution the engines sampled them from.
  topts.grpo.temperature = o.temperature;
  // The trainer's buckets are the weight sync's: same cap (and, with equal dtypes, same layout).
  topts.grad_bucket_bytes = o.bucket_bytes;
  return topts;
}

void RolloutConsumer::run() {
  at::ScalarType edtype = engine::parse_dtype(o_.engine_dtype);
  TrainerOptions topts = rollout_trainer_options(o_, c_.ranks.self, c_.ranks.g.train.get());
  std::unique_ptr<Trainer> tr;
  if (c_.versions.resumed()) {
    if (topts.grpo.kl_coef > 0) {
      if (o_.sft_steps > 0) {
        throw std::invalid_argument(
            "--resume with --kl-coef > 0 after an SFT warm-up: the KL reference (the warmed-up "
            "weights) is not in the checkpoint; resume with --sft-steps 0 to use --model as the "
            "reference");
      }
      topts.reference_model_dir = o_.model_dir;  // the run's reference: its initial model
    }
    // LoRA: the base from --model, the adapter from the checkpoint (load_trainer_state).
    tr = std::make_unique<Trainer>(topts.lora.enabled() ? o_.model_dir : o_.resume_dir, topts);
    load_trainer_state(*tr, o_.resume_dir);
  } else {
    tr = std::make_unique<Trainer>(o_.model_dir, topts);
  }
  // With sync lanes the layout is one engine rank's: its slice of every parameter.
  sync::WeightSyncOptions so = rl_sync_options(o_, c_.ranks.self);
  so.lanes = rl_sync_lanes(o_, c_.ranks.g);
  std::vector<sync::TensorSpec> specs;
  for (const auto& [name, t] : tr->parameters()) {
    specs.push_back({name,
                     engine::tp_slice_shape(name, t.sizes().vec(), engine::TpShard{0, so.lanes}),
                     edtype});
  }
  layout_ = std::make_unique<sync::WeightLayout>(sync::WeightLayout::plan(specs, o_.bucket_bytes));
  ws_ = std::make_unique<sync::WeightSync>(c_.ranks.g, c_.coord->store(), *layout_, so);
  if (hands_over_warmed_base(o_, c_.versions.runs_sft())) {
    base_layout_ = std::make_unique<sync::WeightLayout>(warmed_base_layout(tr->config(), o_));
    base_ws_ = warmed_base_sync(c_, *base_layout_);
  }
  // What loading left cached goes back before the engine beside this trainer generates.
  if (o_.kv_handover) release_device_memory();

  if (c_.versions.runs_sft()) {
    if (o_.kv_handover) wait_kv_released("sft");
    tr = sft(std::move(tr), topts);
    if (o_.kv_handover) release_device_memory();
    if (base_ws_) send_warmed_base(*tr, c_.versions.first_grpo_version());
    send(*tr, c_.versions.first_grpo_version());
    // The engines took the base before they asked for this version: its sync can go.
    base_ws_.reset();
    base_layout_.reset();
  }
  tr->set_grad_scale(grad_scale());
  Fault fault = parse_fault(o_.fault);
  auto counters = sync::Coordinator::store_traffic();
  for (int64_t step = c_.versions.start_step(); step < o_.steps; ++step) {
    if (fault.kind == "die-at-step" && fault.rank == c_.ranks.env.rank && fault.step == step + 1) {
      std::raise(SIGKILL);
    }
    c_.data.draw(o_.prompts_per_step);  // keep the data cursor in step with the infer ranks
    TrainReport m = train_step(*tr, step);
    auto s0 = Clock::now();
    m.sync_send_s = send(*tr, c_.versions.version_at(step) + 1);
    m.update_gathered = tr->update_gathered_peak();
    m.send_wait_s = seconds_since(s0) - m.sync_send_s;
    bool save = !o_.save_dir.empty() &&
                ((o_.save_every > 0 && (step + 1) % o_.save_every == 0) || step + 1 == o_.steps);
    if (save) {
      auto t0 = Clock::now();
      std::string dir = checkpoint(*tr, step + 1, "grpo");
      if (c_.ranks.role_global == 0) {
        m.checkpoint = dir;
        m.checkpoint_s = seconds_since(t0);
      }
      if (o_.kv_handover) release_device_memory();  // the gathered state's temporaries
    }
    auto now = sync::Coordinator::store_traffic();
    m.store_ops = now.ops - counters.ops;
    m.store_bytes = now.bytes - counters.bytes;
    counters = now;
    publish_report(*c_.coord, step, c_.ranks.env.rank, m);
  }
  // No GRPO step ran (--steps 0, or a resume at the last step): the job's end still leaves a
  // checkpoint, the warmed-up model after an SFT-only run (resuming it starts GRPO at step 0).
  if (!o_.save_dir.empty() && c_.versions.start_step() >= o_.steps && c_.versions.runs_sft()) {
    std::string dir = checkpoint(*tr, c_.versions.start_step(), "sft");
    if (c_.ranks.role_global == 0) spdlog::info("checkpoint after the SFT warm-up: {}", dir);
  }
}

std::string RolloutConsumer::checkpoint(Trainer& tr, int64_t step, const char* phase) {
  // Every train rank takes part (the sharded state is gathered); the group's rank 0 writes.
  std::string dir = fmt::format("{}/step-{}", o_.save_dir, step);
  nlohmann::json extra = {{"rows_drawn", c_.data.drawn()}, {"phase", phase}};
  if (!base_dir_.empty()) extra["warmed_base"] = base_dir_;
  save_checkpoint(tr, dir, base_dir_.empty() ? o_.model_dir : base_dir_, extra, o_.save_merged);
  barrier(fmt::format("checkpoint-s{}", step));  // a slow write is not a dead rank
  return dir;
}

at::TensorOptions RolloutConsumer::train_group_options() const {
  // NCCL takes CUDA tensors only (the trainer's device); Gloo is cheapest on CPU ones.
  const bool nccl = c_.ranks.g.train && c_.ranks.g.train->backend() == "nccl";
  return at::TensorOptions().device(nccl ? at::Device(c_.ranks.self.device) : at::Device(at::kCPU));
}

GradScale RolloutConsumer::grad_scale() {
  // The step's loss is the mean over every loss token of every train rank. Micro-batches stream
  // in, so each is accumulated with scale = its loss-token count (a token sum); the summed
  // gradient is divided by the global count N. Micro-batch sizes and per-rank counts then do not
  // change the weighting.
  return [this] {
    at::Tensor n = at::full({1}, static_cast<double>(local_loss_tokens_),
                            train_group_options().dtype(at::kDouble));
    c_.ranks.g.train->all_reduce(n);
    const double total = n.item<double>();
    return total > 0 ? 1.0 / total : 0.0;
  };
}

double RolloutConsumer::group_token_mean(const std::vector<LossMetrics>& parts) const {
  double sums[2] = {0, 0};  // loss x tokens, tokens
  for (const LossMetrics& p : parts) {
    sums[0] += p.loss * static_cast<double>(p.num_tokens);
    sums[1] += static_cast<double>(p.num_tokens);
  }
  if (c_.ranks.train_total > 1) {
    at::Tensor t = at::tensor({sums[0], sums[1]}, at::kDouble).to(train_group_options().device());
    c_.ranks.g.train->all_reduce(t);
    t = t.cpu();
    sums[0] = t[0].item<double>();
    sums[1] = t[1].item<double>();
  }
  return sums[1] > 0 ? sums[0] / sums[1] : 0;
}

std::vector<LossMetrics> RolloutConsumer::accumulate_all(Trainer& tr,
                                                         const std::vector<MicroBatch>& batches,
                                                         LossKind kind) {
  int64_t rounds = static_cast<int64_t>(batches.size());
  if (tr.options().zero_stage >= 2 && c_.ranks.train_total > 1) {
    at::Tensor n = at::full({1}, rounds, train_group_options().dtype(at::kLong));
    c_.ranks.g.train->all_reduce(n, sync::ReduceOp::kMax);
    rounds = n.item<int64_t>();
  }
  std::vector<LossMetrics> parts;
  for (int64_t i = 0; i < rounds; ++i) {
    if (i >= static_cast<int64_t>(batches.size())) {
      tr.accumulate_empty();
      continue;
    }
    const MicroBatch& mb = batches[i];
    parts.push_back(
        tr.accumulate(mb, kind, static_cast<double>(mb.num_loss_tokens()), i + 1 == rounds));
    local_loss_tokens_ += mb.num_loss_tokens();
  }
  return parts;
}

StepStats RolloutConsumer::run_updates(Trainer& tr, const std::vector<MicroBatch>& held,
                                       std::vector<LossMetrics>& parts, UpdatesReport* out) {
  // Each rank splits its own sequences; the gradient scale counts every rank's loss tokens of the
  // update (grad_scale), so uneven shares weigh every token alike, as in one update a step.
  const auto runs = split_mini_batches(held, o_.ppo_mini_batches);
  // A mini-batch no rank has a loss token in (fewer sequences than mini-batches) is no update:
  // AdamW's moments would move the weights on no data. Every rank skips the same ones.
  std::vector<double> tokens(runs.size(), 0.0);
  for (size_t m = 0; m < runs.size(); ++m) {
    for (const MicroBatch& mb : runs[m]) tokens[m] += static_cast<double>(mb.num_loss_tokens());
    out->loss_tokens += static_cast<int64_t>(tokens[m]);
  }
  if (c_.ranks.train_total > 1) {
    at::Tensor t = at::tensor(tokens, at::kDouble).to(train_group_options().device());
    c_.ranks.g.train->all_reduce(t);
    t = t.cpu();
    for (size_t m = 0; m < runs.size(); ++m) tokens[m] = t[static_cast<int64_t>(m)].item<double>();
  }
  std::vector<size_t> live;
  for (size_t m = 0; m < runs.size(); ++m) {
    if (tokens[m] > 0) live.push_back(m);
  }
  // A step with no loss token on any rank makes one update, as one update a step does, not one
  // an epoch.
  const int32_t epochs = live.empty() ? 1 : o_.ppo_epochs;
  if (live.empty()) live.push_back(runs.size() - 1);
  StepStats st;
  for (int32_t epoch = 0; epoch < epochs; ++epoch) {
    for (size_t m : live) {
      const bool first = epoch == 0 && m == live.front();
      if (!first) tr.zero_grad();
      local_loss_tokens_ = 0;
      std::vector<LossMetrics> run = accumulate_all(tr, runs[m], LossKind::kGrpo);
      if (first) out->before = combine_loss_metrics(run);
      parts.insert(parts.end(), run.begin(), run.end());
      st = tr.finish_step(/*advance_schedule=*/epoch + 1 == epochs && m == live.back());
      ++out->updates;
    }
  }
  return st;
}

void RolloutConsumer::count_round(Rounds& r, bool ended) {
  sync::Coordinator& co = *c_.coord;
  if (!ended) {
    ++r.received;
    co.add(kRounds, r.step, have_counter(r.received), 1);
    return;
  }
  r.ended = true;
  r.while_receiving = r.done;
  for (int64_t i = 1; i <= r.received; ++i) co.add(kRounds, r.step, ended_counter(i), 1);
  co.add(kRounds, r.step, kEnded, 1);  // after ended(i): see round_runnable
}

bool RolloutConsumer::run_rounds(Trainer& tr, Rounds& r, std::vector<LossMetrics>& parts) {
  sync::Coordinator& co = *c_.coord;
  const int64_t ranks = c_.ranks.g.train->size();
  for (;;) {
    const int64_t i = r.done + 1;
    // `ended` first, then ended(i), then have(i): a rank is never counted twice (see the header).
    r.ended_ranks = co.read(kRounds, r.step, kEnded);
    const int64_t ended_i = co.read(kRounds, r.step, ended_counter(i));
    const int64_t have_i = co.read(kRounds, r.step, have_counter(i));
    if (!round_runnable(have_i, r.ended_ranks, ended_i, ranks)) {
      return r.ended_ranks == ranks && have_i == 0;  // every rank ended and had no i-th
    }
    if (r.held.empty()) {  // this rank ran out: an empty round matches a peer's micro-batch
      tr.accumulate_empty();
    } else {
      MicroBatch mb = std::move(r.held.front());
      r.held.pop_front();
      parts.push_back(
          tr.accumulate(mb, LossKind::kGrpo, static_cast<double>(mb.num_loss_tokens())));
      local_loss_tokens_ += mb.num_loss_tokens();
    }
    ++r.done;
    r.pause = std::chrono::microseconds(100);
  }
}

// A barrier of the train ranks with the rollout deadline: collectives after it then start
// together, so a slow node or a checkpoint write is not mistaken for a dead peer.
void RolloutConsumer::barrier(const std::string& name) {
  c_.coord->barrier(name, c_.ranks.train_total, c_.rollout_deadline(), last_barrier_);
  last_barrier_ = name;
}

double RolloutConsumer::send(Trainer& tr, int64_t version) {
  ws_->wait_requested(version, c_.rollout_deadline());
  const bool own_buffers =
      o_.sync.mode == sync::SyncMode::kBucket && tr.layout().hash() == layout_->hash();
  // ZeRO-3: the buckets are gathered over the train group a run at a time (--sync-chunk-mb), each
  // rank keeping the ones it sends (the trainer's own buffers; every bucket holding a parameter of
  // the run where they are cast into the sync's layout) until the next run's gather.
  const sync::WeightLayout& layout = ws_->layout();
  sync::SendStream stream;
  stream.gather = [&](int64_t first, int64_t end) {
    tr.gather_parameters(layout.buckets()[first].entries.front().tensor,
                         layout.buckets()[end - 1].entries.back().tensor + 1,
                         [&](int64_t b) { return !own_buffers || ws_->sends(b); });
  };
  const sync::SendStream* streamed = tr.parameters_sharded() ? &stream : nullptr;
  // Colocated, the gathered buckets' memory goes back to the device before the engine beside this
  // trainer takes its KV pool again (the caching allocator would keep it; the memory plan counts
  // the gather in turn with the pool).
  struct Release {
    RolloutConsumer& rc;
    Trainer& tr;
    bool handover;
    ~Release() {
      tr.release_buckets();
      if (handover && tr.parameters_sharded()) rc.release_device_memory();
    }
  } release{*this, tr, o_.kv_handover};
  if (own_buffers) return ws_->send_buckets(tr.buckets(), version, streamed).transfer_s;
  std::vector<at::Tensor> params;
  for (const auto& [name, t] : tr.parameters()) params.push_back(t);
  const int lanes = ws_->options().lanes;
  if (lanes > 1) {
    // Each engine rank's slices (tensor-parallel), cut from the parameters inside their run.
    const auto& specs = layout.specs();
    const sync::LaneSlicer slice = [&](int lane, int64_t i, const at::Tensor& full) {
      return engine::tp_slice_view(specs[i].name, full, engine::TpShard{lane, lanes});
    };
    return ws_->send_lanes(params, slice, version, streamed).transfer_s;
  }
  return ws_->send(params, version, streamed).transfer_s;
}

void RolloutConsumer::send_warmed_base(Trainer& tr, int64_t version) {
  // With --save-dir the warmed-up base becomes DIR/base, a model directory: the adapters of every
  // checkpoint name it as their base (merged/ and --resume read it from there).
  if (!o_.save_dir.empty()) {
    base_dir_ = fs::absolute(o_.save_dir + "/base").string();
    if (tr.is_group_leader()) {
      engine::NamedTensors weights;
      for (const auto& [name, t] : warmed_base_)
        weights.emplace_back(name, t.to(at::kCPU, at::kFloat));
      engine::ModelConfig config = tr.config();
      config.torch_dtype = "float32";
      const std::string tmp = base_dir_ + ".tmp";
      fs::remove_all(tmp);
      engine::write_model_dir(tmp, config, weights, o_.model_dir);
      fs::remove_all(base_dir_);
      fs::rename(tmp, base_dir_);
      spdlog::info("the warmed-up base (the adapter's frozen model): {}", base_dir_);
    }
    barrier("warmed-base");
  }
  base_ws_->wait_requested(version, c_.rollout_deadline());
  std::vector<at::Tensor> tensors;
  for (const sync::TensorSpec& spec : base_layout_->specs()) {
    auto it = std::find_if(warmed_base_.begin(), warmed_base_.end(),
                           [&](const auto& p) { return p.first == spec.name; });
    CRL_CHECK(it != warmed_base_.end(), "the warmed-up base has no weight named ", spec.name);
    tensors.push_back(it->second);
  }
  base_ws_->send(tensors, version);
  warmed_base_.clear();
}

std::unique_ptr<Trainer> RolloutConsumer::sft(std::unique_ptr<Trainer> tr,
                                              const TrainerOptions& topts) {
  TrainerOptions so = topts;
  if (base_ws_) so.lora = LoraTrainOptions{};  // the whole model; GRPO's adapter comes after
  so.schedule = o_.sft_schedule;
  so.schedule.total_steps = o_.sft_steps;
  so.grpo.kl_coef = 0;
  tr.reset();  // replaced by the warmed-up weights below
  auto sft = std::make_unique<Trainer>(o_.model_dir, so);
  sft->set_grad_scale(grad_scale());
  // The same tokenizer the engine uses, loaded from the model directory, and the same prompt
  // ids the engines generate from (the special tokens its encode_prompt adds to a prompt).
  text::Tokenizer tok(o_.model_dir);
  auto cfg = engine::load_model_config(o_.model_dir);
  const PromptEncoder prompts(tok, tok.special_prefix());
  // --env: the environment's demonstrations (whole episodes: the model's turns are the targets,
  // the prompt and the tool results carry weight 0), rendered as the engines render episodes.
  std::unique_ptr<Environment> env;
  std::unique_ptr<text::ChatTemplate> chat;
  std::vector<int32_t> chat_prefix;
  text::ToolCallFormat format = text::ToolCallFormat::kHermes;
  if (!o_.env.empty()) {
    env = make_environment(o_.env, o_.env_options);
    chat = std::make_unique<text::ChatTemplate>(text::ChatTemplate::from_model_dir(o_.model_dir));
    if (!chat->is_jinja()) chat_prefix = tok.special_prefix();
    format = text::detect_tool_call_format(*chat);
  }
  // The warm-up's scalars go to the first train rank's own event file, in --tensorboard's sft/
  // folder: a run of its own to TensorBoard, whose reader follows only the newest file of a folder
  // (the report's file in the top folder keeps growing after the warm-up).
  std::unique_ptr<TfEventsWriter> tb;
  if (c_.ranks.role_global == 0 && !o_.tensorboard_dir.empty()) {
    tb = std::make_unique<TfEventsWriter>(o_.tensorboard_dir + "/sft");
  }
  std::vector<SftStepReport> reports;  // the first train rank's, for the --metrics file
  for (int64_t s = 0; s < o_.sft_steps; ++s) {
    std::vector<int64_t> picked = c_.data.draw(o_.sft_rows_per_step);
    std::vector<SampleGroup> groups;
    for (size_t i = 0; i < picked.size(); ++i) {
      if (static_cast<int>(i % c_.ranks.train_total) != c_.ranks.role_global) continue;
      if (env) {
        const nlohmann::ordered_json demo =
            env->demonstration(EnvSplit::kTrain, picked[i],
                               o_.data_path.empty() ? nlohmann::ordered_json(nullptr)
                                                    : env_task(c_.data.split().train[picked[i]]));
        if (demo.is_null()) {
          throw std::invalid_argument("--env " + o_.env + " gives no demonstration for task " +
                                      std::to_string(picked[i]) +
                                      " (the SFT warm-up needs them; pass --sft-steps 0)");
        }
        SampleGroup g;
        g.samples.push_back(demonstration_sample(demo["messages"], demo["tools"], *chat, tok,
                                                 chat_prefix, format,
                                                 static_cast<int32_t>(cfg.eos_token_ids.at(0))));
        g.prompt_ids = g.samples[0].prompt_ids;
        groups.push_back(std::move(g));
        continue;
      }
      const auto& row = c_.data.split().train[picked[i]];
      const std::string& target =
          o_.sft_on_answers || row.demonstration.empty() ? row.answer : row.demonstration;
      groups.push_back(sft_group(prompts.encode(row),
                                 tok.encode(target, PromptEncoder::answer_options(row)),
                                 static_cast<int32_t>(cfg.eos_token_ids.at(0))));
    }
    auto batches = pack_micro_batches(groups, so.micro_batch_tokens);
    sft->zero_grad();
    local_loss_tokens_ = 0;
    const std::vector<LossMetrics> parts = accumulate_all(*sft, batches, LossKind::kSft);
    auto st = sft->finish_step();
    const double loss = group_token_mean(parts);
    if (c_.ranks.role_global != 0) continue;
    reports.push_back({s + 1, loss, st.grad_norm, st.lr});
    if (tb) {
      tb->scalar("sft/loss", s + 1, loss);
      tb->scalar("sft/grad_norm", s + 1, st.grad_norm);
      tb->scalar("sft/lr", s + 1, st.lr);
    }
    if ((s + 1) % 20 == 0 || s + 1 == o_.sft_steps) {
      if (tb) tb->flush();
      fmt::print("sft step {}/{} | loss {:.4f} | gnorm {:.3g} | lr {:.1e} | {:.1f} s\n", s + 1,
                 o_.sft_steps, loss, st.grad_norm, st.lr, seconds_since(c_.t0));
      std::fflush(stdout);
    }
  }
  if (c_.ranks.role_global == 0) publish_sft_steps(*c_.coord, reports);
  engine::NamedTensors w = sft->master_weights();  // gathered on every train rank
  auto config = sft->config();
  if (base_ws_) {  // the warmed-up model is the frozen base of a new adapter (B = 0)
    sft.reset();
    warmed_base_ = w;
    return std::make_unique<Trainer>(config, std::move(w), topts);
  }
  if (topts.lora.enabled()) {  // the same frozen base, the warmed-up adapter
    engine::NamedTensors base = sft->model_weights();
    sft.reset();
    auto next = std::make_unique<Trainer>(config, std::move(base), topts);
    next->load_master_weights(w);
    return next;
  }
  sft.reset();
  return std::make_unique<Trainer>(config, std::move(w), topts);
}

void RolloutConsumer::check_staleness(const MicroBatch& mb, int64_t step, int64_t* sum,
                                      int64_t* max) const {
  const int64_t trainer_version = c_.versions.version_at(step);
  at::Tensor on = mb.loss_mask > 0.5f;
  at::Tensor stale = trainer_version - mb.versions.masked_select(on);
  if (stale.numel() == 0) return;
  const int64_t mx = stale.max().item<int64_t>();
  const int64_t mn = stale.min().item<int64_t>();
  if (mn < 0) {  // the engines stamp each token with the version they received
    throw std::runtime_error(fmt::format(
        "step {}: a rollout token was sampled by weights version {}, newer than the version "
        "this step trains ({}): the train ranks' version arithmetic disagrees with the "
        "versions the engines received",
        step + 1, trainer_version - mn, trainer_version));
  }
  if (trainer_version - mx < c_.versions.oldest_allowed(step)) {
    throw std::runtime_error(fmt::format(
        "step {}: a rollout token is {} versions older than the trainer's weights (version {}), "
        "beyond --max-staleness {}",
        step + 1, mx, trainer_version, o_.max_staleness));
  }
  *max = std::max(*max, mx);
  *sum += stale.sum().item<int64_t>();
}

void RolloutConsumer::remove_round_counters(const Rounds& rd) {
  sync::Coordinator& co = *c_.coord;
  for (int64_t i = 1; i <= rd.done + 1; ++i) {
    co.remove(kRounds, rd.step, have_counter(i));
    co.remove(kRounds, rd.step, ended_counter(i));
  }
  co.remove(kRounds, rd.step, kEnded);
}

double RolloutConsumer::wait_kv_released(const std::string& phase) {
  auto t0 = Clock::now();
  const int t = c_.ranks.g.topo.role_index(c_.ranks.env.rank);
  std::vector<std::string> keys;
  for (int i : c_.ranks.g.topo.receivers_of(t)) {
    keys.push_back(kv_released_key(c_.ranks.g.node, phase, i));
  }
  const auto missing = sync::wait_keys(c_.coord->store(), keys, c_.rollout_deadline());
  if (!missing.empty()) {
    std::vector<std::string> who;
    const int base = c_.ranks.g.node * c_.ranks.g.topo.ranks_per_node();
    for (int i : c_.ranks.g.topo.receivers_of(t)) {
      if (std::find(missing.begin(), missing.end(), kv_released_key(c_.ranks.g.node, phase, i)) !=
          missing.end()) {
        who.push_back(c_.ranks.g.topo.describe(base + i));
      }
    }
    throw std::runtime_error(fmt::format(
        "colocated hand-over: {} did not free its KV pool for {} within {} s (--rollout-timeout); "
        "{} trains only after that",
        fmt::join(who, ", "),
        phase == "sft" ? "the SFT warm-up"
                       : fmt::format("step {}", std::stoll(phase.substr(1)) + 1),
        o_.rollout_timeout.count() / 1000, c_.ranks.g.topo.describe(c_.ranks.env.rank)));
  }
  for (const auto& k : keys) sync::store_delete(c_.coord->store(), k);
  return seconds_since(t0);
}

double RolloutConsumer::release_device_memory() {
  auto t0 = Clock::now();
  engine::release_cached_device_memory(at::Device(c_.ranks.self.device));
  return seconds_since(t0);
}

TrainReport RolloutConsumer::train_step(Trainer& tr, int64_t step) {
  std::vector<LossMetrics> parts;
  int64_t tokens = 0, stale_sum = 0, stale_max = 0;
  double compute_s = 0;
  // Colocated: the engine beside this trainer has its rollouts in and its KV pool freed first.
  double handover_wait_s = o_.kv_handover ? wait_kv_released(handover_phase(step)) : 0;
  tr.zero_grad();
  local_loss_tokens_ = 0;
  // Stages 0 and 1 train each micro-batch as it arrives; ZeRO stage 2 trains in collective
  // rounds, run as soon as every rank can join them (round_runnable). PPO mini-batches or epochs
  // hold the step's micro-batches until every rank has them all (run_updates).
  const bool updates = o_.ppo_mini_batches > 1 || o_.ppo_epochs > 1;
  const bool rounds = !updates && tr.options().zero_stage >= 2 && c_.ranks.train_total > 1;
  std::vector<MicroBatch> held;
  Rounds rd;
  rd.step = step;
  // Between messages: look again when a held micro-batch waits for its round, backing off from
  // 0.1 to 20 ms while nothing becomes runnable (3 store requests a look).
  auto look = [&] {
    const auto now = Clock::now();
    if (now < rd.next_look) return false;
    auto c0 = now;
    const bool all = run_rounds(tr, rd, parts);
    compute_s += seconds_since(c0);
    rd.next_look = Clock::now() + rd.pause;
    rd.pause = std::min(rd.pause * 2, std::chrono::microseconds(20000));
    return all;
  };
  auto on_idle = [&] {
    if (!rd.held.empty()) look();
  };
  auto rs = receiver_->receive_step(
      step, c_.rollout_deadline(),
      [&](at::Tensor buf) {
        auto c0 = Clock::now();
        MicroBatch mb = deserialize_micro_batch(buf);
        buf = at::Tensor();
        check_staleness(mb, step, &stale_sum, &stale_max);
        tokens += mb.num_tokens();
        if (updates) {
          held.push_back(std::move(mb));
        } else if (rounds) {
          rd.held.push_back(std::move(mb));
          count_round(rd, /*ended=*/false);
          rd.next_look = {};  // look now
          rd.pause = std::chrono::microseconds(100);
          look();
        } else {
          parts.push_back(
              tr.accumulate(mb, LossKind::kGrpo, static_cast<double>(mb.num_loss_tokens())));
          local_loss_tokens_ += mb.num_loss_tokens();
        }
        compute_s += seconds_since(c0);
      },
      rounds ? std::function<void()>(on_idle) : nullptr, /*in_turn=*/o_.reproducible);
  double wait_s = rs.wait_s + handover_wait_s;
  if (rounds) {
    // This rank's stream ended: run the rest of the rounds (empty ones where peers have more).
    count_round(rd, /*ended=*/true);
    rd.next_look = {};
    const auto deadline = c_.rollout_deadline();
    while (!look()) {
      if (Clock::now() > deadline) {
        throw std::runtime_error(fmt::format(
            "step {}: only {} of {} train ranks ended their rollout streams before the deadline "
            "(--rollout-timeout); this rank ran {} ZeRO-2 rounds",
            step + 1, rd.ended_ranks, c_.ranks.g.train->size(), rd.done));
      }
      auto w0 = Clock::now();
      std::this_thread::sleep_until(std::max(rd.next_look, w0));
      wait_s += seconds_since(w0);
    }
  }
  {
    auto b0 = Clock::now();
    barrier(fmt::format("rollouts-s{}", step));  // every node's rollouts are in
    wait_s += seconds_since(b0);
  }
  // Every rank finished its rounds before the barrier: the step's counters can go.
  if (rounds && c_.ranks.g.train->rank() == 0) remove_round_counters(rd);
  auto c0 = Clock::now();
  UpdatesReport ur;
  auto st = updates ? run_updates(tr, held, parts, &ur) : tr.finish_step();
  compute_s += seconds_since(c0);
  auto lm = combine_loss_metrics(parts);
  if (updates) {
    // The engine-vs-trainer gap measures the sampler against the trainer's policy it sampled
    // from: after an update of the step it would measure the update.
    lm.logprob_gap_max = ur.before.logprob_gap_max;
    lm.logprob_gap_mean = ur.before.logprob_gap_mean;
    lm.mismatch_kl = ur.before.mismatch_kl;
    lm.mismatch_k3_kl = ur.before.mismatch_k3_kl;
    // The step's own tokens, once (the report weighs ranks and staleness by them), not once an
    // epoch.
    lm.num_tokens = ur.loss_tokens;
  }
  TrainReport r;
  if (o_.kv_handover) r.switch_s = release_device_memory();
  r.step = st.step;
  r.loss = lm.loss;
  r.kl = lm.kl;
  r.clip_fraction = lm.clip_fraction;
  r.gap_max = lm.logprob_gap_max;
  r.gap_mean = lm.logprob_gap_mean;
  r.mismatch_kl = lm.mismatch_kl;
  r.mismatch_k3_kl = lm.mismatch_k3_kl;
  r.entropy = lm.entropy;
  r.is_weight_mean = lm.is_weight_mean;
  r.is_weight_max = lm.is_weight_max;
  r.staleness_sum = stale_sum;
  r.staleness_max = stale_max;
  r.loss_tokens = lm.num_tokens;
  r.grad_norm = st.grad_norm;
  r.lr = st.lr;
  r.optimizer_updates = updates ? ur.updates : 1;
  r.micro_batches = static_cast<int64_t>(parts.size());
  r.zero_rounds = rd.done;  // stage 2: collective rounds (empty ones included)
  r.zero_rounds_while_receiving = rd.while_receiving;  // ... run before this rank's stream ended
  r.train_tokens = tokens;
  r.rollout_bytes = rs.bytes;
  r.wait_s = wait_s;
  r.train_s = compute_s;
  r.elapsed_s = seconds_since(c_.t0);
  r.peak_rss = peak_rss_bytes();
  return r;
}

}  // namespace crl::trainer
