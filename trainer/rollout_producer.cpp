#include "trainer/rollout_producer.h"

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <csignal>
#include <limits>
#include <thread>

#include "common/check.h"
#include "common/units.h"
#include "engine/engine_loop.h"
#include "engine/llm_engine.h"
#include "sync/rollout_transport.h"
#include "sync/weight_layout.h"
#include "sync/weight_sync.h"
#include "text/chat_template.h"
#include "trainer/environment.h"
#include "trainer/make_environment.h"
#include "trainer/multi_turn.h"
#include "trainer/prompt_encoder.h"
#include "trainer/reward_program.h"
#include "trainer/rollout_batcher.h"
#include "trainer/step_reports.h"

namespace crl::trainer {
namespace {

using Clock = std::chrono::steady_clock;

// Longest-processing-time first: prompt i goes to the least loaded of `ranks` (ties: lowest rank).
std::vector<int> shard_by_cost(const std::vector<int64_t>& cost, int ranks) {
  std::vector<int> order(cost.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = static_cast<int>(i);
  std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return cost[a] > cost[b]; });
  std::vector<int64_t> load(ranks, 0);
  std::vector<int> owner(cost.size(), 0);
  for (int i : order) {
    int best = static_cast<int>(std::min_element(load.begin(), load.end()) - load.begin());
    owner[i] = best;
    load[best] += cost[i];
  }
  return owner;
}

}  // namespace

engine::EngineConfig rollout_engine_config(const RlOptions& o, const sync::RankPlacement& self,
                                           bool resumed) {
  CRL_CHECK(self.role == sync::Role::kInfer, "rank ", self.world_rank, " is not an infer rank");
  engine::EngineConfig ec;
  // A LoRA run's checkpoint holds the adapter alone: the engine loads the base from --model.
  ec.model_dir = resumed && !o.trainer.lora.enabled() ? o.resume_dir : o.model_dir;
  if (o.trainer.lora.enabled()) {  // the policy adapter's last K + 1 versions
    ec.max_loras = static_cast<int32_t>(o.max_staleness + 1);
    ec.max_lora_rank = static_cast<int32_t>(o.trainer.lora.rank);
    ec.lora_targets = o.trainer.lora.targets;
  }
  ec.device = self.device;
  ec.dtype = o.engine_dtype;
  ec.deterministic = o.deterministic;
  ec.cpu_kernels = o.cpu_kernels;
  ec.seed = o.seed;
  ec.kv_memory_bytes = o.kv_memory_bytes;
  ec.tensor_parallel_size = o.infer_tp;
  // Room for K + 1 steps' sequences: the next steps are admitted while the last ones finish.
  ec.max_seqs = std::max<int32_t>(
      256, static_cast<int32_t>(o.prompts_per_step * o.samples_per_prompt * (o.max_staleness + 1)));
  return ec;
}

RolloutProducer::RolloutProducer(RlContext& ctx) : c_(ctx), o_(ctx.o) {
  auto eng = std::make_unique<engine::LlmEngine>(
      rollout_engine_config(o_, c_.ranks.self, c_.versions.resumed()));
  CRL_CHECK(eng->tokenizer(),
            "the RL job needs a model with a tokenizer (tokenizer.json or tokenizer.model)");
  prompts_ = std::make_unique<PromptEncoder>(*eng->tokenizer(), eng->prompt_prefix());
  rewarder_ = std::make_unique<Rewarder>(o_.reward, o_.env_options.pass_env);
  if (!o_.traces.path.empty()) {
    // A fresh run's traces start empty: the node's first rank (an infer rank) empties the file
    // here, before the start eval's collective that every infer rank passes before it writes.
    TraceOptions to = o_.traces;
    to.truncate = !c_.versions.resumed() && c_.ranks.env.local_rank == 0;
    traces_ = std::make_unique<TraceWriter>(to, *eng->tokenizer());
  }
  if (o_.trainer.lora.enabled()) {
    // LoRA RL: the engine's updates are the policy adapter's versions (adapter bytes only); it
    // starts as the trainer does (B = 0: the base's outputs), or from the checkpoint's adapter.
    const LoraTrainOptions& lo = o_.trainer.lora;
    const engine::LoraAdapter initial =
        c_.versions.resumed() ? engine::load_peft_adapter(o_.resume_dir, eng->model_config())
                              : engine::make_lora_adapter(eng->model_config(), lo.rank, lo.alpha,
                                                          engine::parse_lora_targets(lo.targets),
                                                          lo.seed, /*random_b=*/false);
    layout_ = std::make_unique<sync::WeightLayout>(
        eng->loras()
            .attach_policy("policy", initial, o_.bucket_bytes,
                           static_cast<int32_t>(o_.max_staleness + 1), eng->weight_version())
            .layout());
  } else if (rl_sync_lanes(o_, c_.ranks.g) > 1) {
    // Tensor-parallel, a lane per rank: one shard's layout, every rank's buckets its own.
    layout_ = std::make_unique<sync::WeightLayout>(eng->attach_weight_lanes(o_.bucket_bytes));
  } else {
    // The whole model's layout: into the engine's own buckets, or (tensor-parallel) staged a
    // bucket at a time and sliced onto its ranks.
    layout_ = std::make_unique<sync::WeightLayout>(eng->attach_weight_layout(o_.bucket_bytes));
  }
  followed_ = requested_ = c_.versions.start_step();  // the checkpoint's version on resume, else 0
  eng->set_weight_version(followed_);
  sync::WeightSyncOptions so = rl_sync_options(o_, c_.ranks.self);
  so.lanes = rl_sync_lanes(o_, c_.ranks.g);
  ws_ = std::make_shared<sync::WeightSync>(c_.ranks.g, c_.coord->store(), *layout_, so);
  if (hands_over_warmed_base(o_, c_.versions.runs_sft())) {
    base_layout_ =
        std::make_unique<sync::WeightLayout>(warmed_base_layout(eng->model_config(), o_));
    base_ws_ = warmed_base_sync(c_, *base_layout_);
  }
  if (c_.ranks.env.rank == 0) {
    fmt::print("weight sync: {} bucket(s) of {} per version, node 0 transport {}\n",
               layout_->buckets().size(), format_bytes(static_cast<double>(layout_->total_bytes())),
               sync::sync_transport_name(ws_->transport(0)));
    if (so.lanes > 1) {
      fmt::print(
          "weight sync lanes: each of an engine's {} ranks receives its {} of the model's "
          "weights over a lane of its own\n",
          so.lanes, format_bytes(static_cast<double>(layout_->total_bytes())));
    }
    if (o_.trainer.lora.enabled()) {
      int64_t n = 0;
      for (const auto& spec : layout_->specs()) {
        int64_t e = 1;
        for (int64_t d : spec.shape) e *= d;
        n += e;
      }
      const LoraTrainOptions& lo = o_.trainer.lora;
      fmt::print(
          "LoRA: rank {}, alpha {}, targets {}: {} adapter parameters trained and synced, the "
          "base frozen, {} versions held; warm-up {} steps {}at {:g}, GRPO at {:g}, rollouts at "
          "temperature {:g}\n",
          lo.rank, lo.alpha, lo.targets, n, o_.max_staleness + 1, o_.sft_steps,
          base_ws_ ? "of the whole model (the engines receive it once) " : "of the adapter ",
          o_.sft_schedule.lr, o_.trainer.schedule.lr, o_.temperature);
    }
    std::fflush(stdout);
  }
  sync::RolloutRoute route{c_.ranks.g.node, c_.ranks.g.topo.infer_per_node,
                           c_.ranks.g.topo.train_per_node};
  // With --reproducible the queue is not bounded by --rollout-queue: a full queue must not hold
  // the engine inside a step whose end the train ranks wait for (they send the next version only
  // once asked, at that end). The producer is at most K + 1 steps ahead, so the queue holds at
  // most K + 1 steps' rollouts.
  // The colocated hand-over likewise: its trainers take nothing before the step's rollouts are all
  // in and the engine released its KV pool.
  const size_t queue =
      o_.reproducible || o_.kv_handover ? std::numeric_limits<size_t>::max() : o_.rollout_queue;
  // The sender's thread talks to the store over a connection of its own.
  sender_ = std::make_unique<sync::RolloutSender>(
      c_.connect_own_coordinator()->store(), *c_.ranks.g.sync, route,
      c_.ranks.g.topo.role_index(c_.ranks.env.rank), o_.rollout_timeout, queue);
  for (size_t i = 0; i < c_.data.split().eval.size(); ++i) {
    if (static_cast<int>(i % c_.ranks.infer_total) == c_.ranks.role_global) eval_rows_.push_back(i);
  }
  std::vector<int32_t> chat_prefix;
  if (!o_.env.empty()) {
    chat_ = std::make_unique<text::ChatTemplate>(
        text::ChatTemplate::from_model_dir(eng->config().model_dir));
    if (!chat_->is_jinja()) chat_prefix = eng->prompt_prefix();  // a built-in format: BOS first
  }
  const text::Tokenizer* tok = eng->tokenizer();
  loop_ = std::make_shared<engine::EngineLoop>(std::move(eng));
  loop_->set_weight_source(ws_, o_.inflight);
  loop_->start();
  loop_->wait_ready();
  if (!o_.env.empty()) {
    env_ = make_environment(o_.env, o_.env_options);
    const text::ToolCallFormat format = text::detect_tool_call_format(*chat_);
    MultiTurnOptions mo = o_.multi_turn;
    mo.timeout = o_.rollout_timeout;
    episodes_ =
        std::make_unique<EpisodeRunner>(*loop_, *env_, *chat_, *tok, chat_prefix, format, mo);
    if (c_.ranks.env.rank == 0) {
      fmt::print(
          "multi-turn: environment {}, tool calls in the {} form, up to {} turns and {} "
          "tokens an episode\n",
          env_->name(), text::tool_call_format_name(format), mo.max_turns, mo.max_episode_tokens);
      std::fflush(stdout);
    }
  }
}

RolloutProducer::~RolloutProducer() {
  sender_.reset();
  loop_->stop();
  episodes_.reset();
  env_.reset();
}

double RolloutProducer::evaluate() {
  if (episodes_) return evaluate_episodes();
  std::vector<engine::GenerateRequest> reqs;
  for (size_t k = 0; k < eval_rows_.size(); ++k) {
    engine::GenerateRequest q;
    q.request_id = fmt::format("eval{}-{}", evals_, k);
    q.prompt_token_ids = prompts_->encode(c_.data.split().eval[eval_rows_[k]]);
    q.params.temperature = 0;
    q.params.max_tokens = o_.max_tokens;
    reqs.push_back(std::move(q));
  }
  ++evals_;
  double correct = 0;
  // Evaluation takes no weight update: it measures one version.
  const int64_t eval = evals_ - 1;
  busy_s_ += run_requests(std::move(reqs), /*follow=*/false, /*in_order=*/false,
                          [&](size_t k, const engine::RequestOutput& out) {
                            const ScoredGroup g = rewarder_->score(
                                fmt::format("eval{}-{}", eval, k),
                                c_.data.split().eval[eval_rows_[k]], {out.outputs.at(0).text});
                            correct += g.results.at(0).correct;
                            eval_reward_requests_ += rewarder_->is_program();
                            eval_reward_errors_ += !g.error.empty();
                          });
  at::Tensor t = at::tensor({correct, static_cast<double>(eval_rows_.size())}, at::kDouble);
  c_.ranks.g.infer->all_reduce(t);
  return t[1].item<double>() > 0 ? t[0].item<double>() / t[1].item<double>() : 0.0;
}

void RolloutProducer::after_update(int64_t v) {
  const int64_t step = c_.versions.step_of_version(v);
  if (step < c_.versions.start_step()) {  // the SFT warm-up's version
    EvalReport e{evaluate(), seconds_since(c_.t0)};
    if (c_.ranks.env.rank == 0) publish_eval(*c_.coord, EvalPoint::sft(), e);
  } else if (c_.versions.evaluates_after(step)) {
    EvalReport e{evaluate(), seconds_since(c_.t0)};
    if (c_.ranks.env.rank == 0) publish_eval(*c_.coord, EvalPoint::after_step(step), e);
  }
  // Ask for the next version only now: an evaluation measures one version and never runs inside
  // a sender's deadline. With --reproducible the engine asks only when it will take it
  // (wait_weights), so no sender waits inside a broadcast while a step generates.
  if (!o_.reproducible) request_next();
}

bool RolloutProducer::follow_updates() {
  const std::string error = loop_->weight_update_error();
  if (!error.empty()) throw std::runtime_error(error);
  bool any = false;
  while (followed_ < loop_->weight_version()) {
    after_update(++followed_);
    any = true;
  }
  return any;
}

void RolloutProducer::request_next() {
  if (followed_ < c_.versions.final_version() && requested_ < followed_ + 1) {
    ws_->request(followed_ + 1);
    requested_ = followed_ + 1;
  }
}

double RolloutProducer::hand_over_kv(const std::string& phase) {
  Fault fault = parse_fault(o_.fault);
  if (fault.kind == "hold-kv" && fault.rank == c_.ranks.env.rank) return 0;  // tests: never
  // Between two engine steps, with nothing in flight (every rollout of the phase finished).
  double released_s = 0;
  loop_
      ->post([&released_s](engine::LlmEngine& e) {
        const double before = e.stats().kv_release_seconds;
        e.release_kv_cache();
        released_s = e.stats().kv_release_seconds - before;
      })
      .get();
  sync::store_set(
      c_.coord->store(),
      kv_released_key(c_.ranks.g.node, phase, c_.ranks.g.topo.role_index(c_.ranks.env.rank)), "1");
  return released_s;
}

void RolloutProducer::wait_weights() {
  request_next();
  if (!loop_->wait_weight_version(followed_ + 1, c_.rollout_deadline())) {
    throw std::runtime_error(
        fmt::format("waited {} s for the train ranks to send weights version {}",
                    o_.rollout_timeout.count() / 1000, followed_ + 1));
  }
  follow_updates();
}

void RolloutProducer::receive_warmed_base() {
  const int64_t v = c_.versions.first_grpo_version();
  base_ws_->request(v);
  const auto deadline = c_.rollout_deadline();
  while (!base_ws_->ready(v)) {  // the train ranks are warming up
    if (Clock::now() > deadline) {
      throw std::runtime_error(fmt::format(
          "waited {} s for the train ranks to send the warmed-up base (the whole-model warm-up "
          "of a LoRA run)",
          o_.rollout_timeout.count() / 1000));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  loop_
      ->post([this, v](engine::LlmEngine& e) {
        std::vector<at::Tensor> buckets =
            base_layout_->allocate_buckets(at::TensorOptions().device(e.model().options().device));
        base_ws_->receive(buckets, v);
        const std::vector<at::Tensor> views = base_layout_->views(buckets);
        const engine::NamedTensors& params = e.model().named_parameters();
        for (size_t i = 0; i < views.size(); ++i) {
          const std::string& name = base_layout_->specs()[i].name;
          auto it = std::find_if(params.begin(), params.end(),
                                 [&](const auto& p) { return p.first == name; });
          CRL_CHECK(it != params.end(), "the engine has no weight named ", name);
          it->second.copy_(views[i]);
        }
        e.reset_prefix_cache();
      })
      .get();
  base_ws_.reset();
  base_layout_.reset();
}

double RolloutProducer::run_requests(
    std::vector<engine::GenerateRequest> reqs, bool follow, bool in_order,
    const std::function<void(size_t, const engine::RequestOutput&)>& on_finished) {
  if (reqs.empty()) return 0;
  auto t0 = Clock::now();
  auto ch = loop_->submit(std::move(reqs));
  std::vector<bool> seen(ch->ids().size(), false);
  size_t finished = 0;
  uint64_t seen_version = 0;
  auto deadline = c_.rollout_deadline();
  while (finished < seen.size()) {
    auto snap = ch->wait(seen_version, std::chrono::milliseconds(20));
    seen_version = snap.version;
    auto done = [&](size_t i) { return snap.outputs[i] && snap.outputs[i]->finished; };
    auto deliver = [&](size_t i) {
      seen[i] = true;
      ++finished;
      if (!snap.outputs[i]->error.empty()) {
        throw std::runtime_error("request " + ch->ids()[i] + " failed: " + snap.outputs[i]->error);
      }
      on_finished(i, *snap.outputs[i]);
    };
    if (in_order) {
      while (finished < seen.size() && done(finished)) deliver(finished);
    } else {
      for (size_t i = 0; i < seen.size(); ++i) {
        if (!seen[i] && done(i)) deliver(i);
      }
    }
    if (follow) follow_updates();
    if (finished < seen.size() && Clock::now() > deadline) {
      throw std::runtime_error(fmt::format("{} of {} requests unfinished after {} s",
                                           seen.size() - finished, seen.size(),
                                           o_.rollout_timeout.count() / 1000));
    }
  }
  return seconds_since(t0);
}

void RolloutProducer::run() {
  EvalReport start{evaluate(), seconds_since(c_.t0)};
  if (c_.ranks.env.rank == 0) publish_eval(*c_.coord, EvalPoint::start(), start);
  // Asked early, version 1 would race the warmed-up base on the same groups: asked after it.
  if (!o_.reproducible && !base_ws_) request_next();
  if (c_.versions.runs_sft()) {
    if (o_.kv_handover) hand_over_kv("sft");
    if (base_ws_) receive_warmed_base();
    wait_weights();  // the warm-up's weights; evaluated on arrival
  }
  Fault fault = parse_fault(o_.fault);
  auto counters = sync::Coordinator::store_traffic();
  for (int64_t step = c_.versions.start_step(); step < o_.steps; ++step) {
    if (fault.kind == "die-at-step" && fault.rank == c_.ranks.env.rank && fault.step == step + 1) {
      std::raise(SIGKILL);
    }
    auto w0 = Clock::now();
    while (followed_ < c_.versions.oldest_allowed(step)) wait_weights();
    double gate_s = seconds_since(w0);
    InferReport m = rollout(step);
    m.gate_wait_s = gate_s;
    // The KV pool's hand-over: its release now and its restores since the last report, as the
    // engine thread timed them.
    const double released_s = o_.kv_handover ? hand_over_kv(handover_phase(step)) : 0;
    const double restored_s = loop_->gauges().kv_restore_seconds;
    m.switch_s = released_s + restored_s - switch_mark_s_;
    switch_mark_s_ = restored_s;
    const double sync_s = loop_->weight_update_seconds();
    m.sync_s = sync_s - sync_mark_s_;
    m.busy_s = busy_s_;
    sync_mark_s_ = sync_s;
    busy_s_ = 0;
    m.engine_version = loop_->weight_version();
    const int64_t reuses = loop_->gauges().lora_slot_reuses;
    m.lora_slot_reuses = reuses - reuses_mark_;
    reuses_mark_ = reuses;
    m.elapsed_s = seconds_since(c_.t0);
    auto now = sync::Coordinator::store_traffic();
    m.store_ops = now.ops - counters.ops;
    m.store_bytes = now.bytes - counters.bytes;
    counters = now;
    publish_report(*c_.coord, step, c_.ranks.env.rank, m);
  }
  // The versions of the last steps (and their evaluations), then the queue drains.
  while (followed_ < c_.versions.final_version()) wait_weights();
  loop_->set_weight_source(nullptr);  // no version comes after the last
  auto deadline = c_.rollout_deadline();
  while (!sender_->idle()) {
    if (Clock::now() > deadline) throw std::runtime_error("rollouts still unsent at the deadline");
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
}

std::vector<size_t> RolloutProducer::own_share(const std::vector<int64_t>& cost) const {
  const std::vector<int> owner = shard_by_cost(cost, c_.ranks.infer_total);
  std::vector<size_t> mine;
  for (size_t i = 0; i < owner.size(); ++i) {
    if (owner[i] == c_.ranks.role_global) mine.push_back(i);
  }
  return mine;
}

uint64_t RolloutProducer::request_seed(int64_t step, size_t i) const {
  return o_.seed * 1000003 + static_cast<uint64_t>(step) * 1009 + i;
}

RolloutBatcher RolloutProducer::batcher(int64_t step) {
  RolloutBatcher b(
      c_.versions.oldest_allowed(step), o_.trainer.micro_batch_tokens,
      [this, step](std::vector<SampleGroup>& groups) { return send(groups, step); },
      [this, step] { sender_->end_step(step); });
  if (traces_) {
    b.set_observer([this, step](const SampleGroup& g, bool dropped) {
      traces_->write(step + 1, c_.ranks.role_global, g, dropped);
    });
  }
  return b;
}

InferReport RolloutProducer::rollout(int64_t step) {
  if (episodes_) return rollout_episodes(step);
  auto t_start = Clock::now();
  std::vector<int64_t> picked = c_.data.draw(o_.prompts_per_step);
  std::vector<std::vector<int32_t>> prompt_ids;
  std::vector<int64_t> cost;
  for (int64_t r : picked) {
    prompt_ids.push_back(prompts_->encode(c_.data.split().train[r]));
    cost.push_back(static_cast<int64_t>(prompt_ids.back().size()) +
                   int64_t{o_.samples_per_prompt} * o_.max_tokens);
  }
  std::vector<int64_t> row_of;  // submission index -> task row
  std::vector<engine::GenerateRequest> reqs;
  for (size_t i : own_share(cost)) {
    engine::GenerateRequest q;
    q.request_id = fmt::format("s{}p{}", step, i);
    q.prompt_token_ids = std::move(prompt_ids[i]);
    q.params.n = o_.samples_per_prompt;
    q.params.temperature = o_.temperature;
    q.params.max_tokens = o_.max_tokens;
    q.params.seed = request_seed(step, i);
    row_of.push_back(picked[i]);
    reqs.push_back(std::move(q));
  }
  RolloutBatcher out = batcher(step);
  InferReport r;
  // With --reproducible no version lands mid-step, and groups are packed in prompt order (not in
  // the order this thread happened to see them finish): the micro-batches are a function of the
  // step.
  busy_s_ += run_requests(
      std::move(reqs), /*follow=*/!o_.reproducible,
      /*in_order=*/o_.reproducible, [&](size_t index, const engine::RequestOutput& done) {
        const TaskRow& row = c_.data.split().train[row_of[index]];
        SampleGroup grp;
        grp.prompt_ids.assign(done.prompt_token_ids.begin(), done.prompt_token_ids.end());
        grp.prompt_index = row_of[index];
        std::vector<std::string> texts;
        for (const auto& c : done.outputs) texts.push_back(c.text);
        ScoredGroup scored = rewarder_->score(done.request_id, row, texts);
        r.reward_requests += rewarder_->is_program();
        r.reward_errors += !scored.error.empty();
        for (const auto& [key, sc] : scored.extra) {
          r.reward_extra[key].first += sc.first;
          r.reward_extra[key].second += sc.second;
        }
        for (size_t k = 0; k < done.outputs.size(); ++k) {
          const auto& c = done.outputs[k];
          const RewardResult& rr = scored.results[k];
          Sample smp;
          smp.completion_ids = c.token_ids;
          smp.logprobs = c.sampled_logprobs(o_.temperature);
          smp.versions = c.token_versions;
          smp.reward = rr.reward;
          for (int64_t v : c.token_versions) r.stale_tokens += v < c_.versions.version_at(step);
          const auto len = static_cast<int64_t>(c.token_ids.size());
          r.gen_len_max = std::max(r.gen_len_max, len);
          r.gen_len_min = r.samples == 0 ? len : std::min(r.gen_len_min, len);
          r.gen_tokens += len;
          r.truncated += c.finish_reason == engine::FinishReason::kLength;
          r.correct += rr.correct;
          r.reward_sum += rr.reward;
          r.reward_sq += rr.reward * rr.reward;
          ++r.samples;
          grp.samples.push_back(std::move(smp));
        }
        out.add(std::move(grp), RolloutBatcher::Advantages::kGroup);
      });
  r.gen_s = seconds_since(t_start);
  r.reward_requests += eval_reward_requests_;  // the evaluations' since the last report
  r.reward_errors += eval_reward_errors_;
  eval_reward_requests_ = eval_reward_errors_ = 0;
  r.rollout_bytes = out.finish();
  r.reward_mean = r.reward_sum / std::max<double>(1, static_cast<double>(r.samples));
  r.groups_dropped = out.groups_dropped();
  r.groups = out.groups_kept();
  r.groups_without_signal = out.groups_without_signal();
  return r;
}

int64_t RolloutProducer::send(std::vector<SampleGroup>& pending, int64_t step) {
  if (pending.empty()) return 0;
  auto batches =
      pack_micro_batches(pending, o_.trainer.micro_batch_tokens, loop_->weight_version());
  pending.clear();
  int64_t bytes = 0;
  for (auto& mb : batches) {
    at::Tensor buf = serialize_micro_batch(mb);
    bytes += buf.numel();
    // Back-pressure: a full queue stops this rank from admitting prompts; weight versions keep
    // landing (and being followed up) meanwhile, so the train ranks this queue waits for are never
    // blocked on it.
    auto deadline = c_.rollout_deadline();
    while (!sender_->try_enqueue(step, buf)) {
      if (!follow_updates()) std::this_thread::sleep_for(std::chrono::microseconds(500));
      if (Clock::now() > deadline) {
        throw std::runtime_error(
            fmt::format("step {}: the train ranks took no rollouts before the "
                        "deadline",
                        step + 1));
      }
    }
  }
  return bytes;
}

}  // namespace crl::trainer
