#include "app/rl_job.h"

#include <torch/csrc/distributed/c10d/PrefixStore.hpp>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <cmath>
#include <csignal>
#include <fstream>
#include <map>
#include <thread>

#include "common/check.h"
#include "common/units.h"
#include "engine/llm_engine.h"
#include "engine/model/config.h"
#include "engine/tokenizer.h"
#include "server/api_server.h"
#include "engine/engine_loop.h"
#include "sync/groups.h"
#include "sync/weight_layout.h"
#include "trainer/checkpoint.h"
#include "trainer/metrics.h"
#include "trainer/micro_batch.h"
#include "trainer/prompt_encoder.h"

namespace crl::app {
namespace {

using Clock = std::chrono::steady_clock;
using nlohmann::json;

double since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

void put_json(const sync::StorePtr& store, const std::string& key, const json& j) {
  sync::store_set(store, key, j.dump());
}

json get_json(const sync::StorePtr& store, const std::string& key, Clock::time_point deadline,
              const std::string& what) {
  return json::parse(sync::store_get(store, key, deadline, what));
}

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

struct Fault {
  int rank = -1;
  int64_t step = -1;
};

Fault parse_fault(const std::string& s) {
  if (s.empty()) return {};
  Fault f;
  if (std::sscanf(s.c_str(), "die-at-step:%d:%ld", &f.rank, &f.step) != 2) {
    CRL_INVALID("unknown fault '", s, "' (die-at-step:RANK:STEP)");
  }
  return f;
}

// What every rank knows about the job.
struct Job {
  const RlJobOptions& o;
  sync::RankEnv env;
  sync::World world;
  sync::Groups g;
  trainer::TaskSplit split;
  std::unique_ptr<trainer::RowSampler> rows;
  int infer_total = 0, train_total = 0;
  int role_global = 0;  // index among all infer (or all train) ranks
  int64_t start_step = 0;
  bool resumed = false;
  Clock::time_point t0 = Clock::now();

  std::string key(const std::string& what) const { return "rl/" + what; }
  Clock::time_point rollout_deadline() const { return Clock::now() + o.rollout_timeout; }
  // Rows of the SFT step and of the GRPO step, drawn identically on every rank.
  std::vector<int64_t> draw(int64_t count) {
    std::vector<int64_t> out;
    for (int64_t i = 0; i < count; ++i) out.push_back(rows->next());
    return out;
  }
};

trainer::LossMetrics combine(const std::vector<trainer::LossMetrics>& parts) {
  trainer::LossMetrics m;
  int64_t tokens = 0;
  for (const auto& p : parts) {
    m.loss += p.loss;
    m.kl += p.kl;
    m.clip_fraction += p.clip_fraction * p.num_tokens;
    m.logprob_gap_mean += p.logprob_gap_mean * p.num_tokens;
    m.logprob_gap_max = std::max(m.logprob_gap_max, p.logprob_gap_max);
    tokens += p.num_tokens;
  }
  if (!parts.empty()) {
    m.loss /= parts.size();
    m.kl /= parts.size();
  }
  if (tokens > 0) {
    m.clip_fraction /= tokens;
    m.logprob_gap_mean /= tokens;
  }
  m.num_tokens = tokens;
  return m;
}

// ---------------------------------------------------------------------------------------------
// Infer rank.

class InferRank {
 public:
  explicit InferRank(Job& job) : j_(job), o_(job.o) {
    engine::EngineConfig ec;
    ec.model_dir = job.resumed ? o_.resume_dir : o_.model_dir;
    ec.dtype = o_.engine_dtype;
    ec.deterministic = o_.deterministic;
    ec.seed = o_.seed;
    ec.kv_memory_bytes = o_.kv_memory_bytes;
    ec.max_seqs = std::max<int32_t>(256, o_.prompts_per_step * o_.samples_per_prompt);
    auto eng = std::make_unique<engine::LlmEngine>(ec);
    CRL_CHECK(eng->tokenizer(), "the RL job needs a model with a tokenizer (tokenizer.json or tokenizer.model)");
    prompts_ = std::make_unique<trainer::PromptEncoder>(*eng->tokenizer(), eng->prompt_prefix());
    layout_ = std::make_unique<sync::WeightLayout>(
        eng->attach_weight_buffers(o_.bucket_bytes).layout());
    buckets_ = &eng->weight_buffers()->buckets();  // touched on the engine thread only
    ws_ = std::make_unique<sync::WeightSync>(j_.g, j_.world.store, *layout_, o_.sync);
    for (size_t i = 0; i < j_.split.eval.size(); ++i) {
      if (static_cast<int>(i % j_.infer_total) == j_.role_global) eval_rows_.push_back(i);
    }
    // One engine thread steps the engine for the rollouts and, with --serve-port, for HTTP
    // clients in the same continuous batch; weight updates are posted to it between two steps.
    loop_ = std::make_shared<engine::EngineLoop>(std::move(eng));
    loop_->start();
    loop_->wait_ready();
    if (o_.serve_port >= 0) {
      server::ServerOptions so;
      so.host = o_.serve_host;
      so.port = o_.serve_port == 0 ? 0 : o_.serve_port + j_.role_global;
      server_ = std::make_unique<server::Server>(loop_, so);
      int port = server_->start();
      fmt::print("rank {}: serving the OpenAI API during training on http://{}:{}\n", j_.env.rank,
                 o_.serve_host, port);
      std::fflush(stdout);
    }
  }

  ~InferRank() {
    if (server_) server_->stop();
    loop_->stop();
  }

  // Held-out accuracy over every infer rank's share (greedy), summed over the infer group.
  double evaluate() {
    std::vector<engine::GenerateRequest> reqs;
    for (size_t i : eval_rows_) {
      engine::GenerateRequest q;
      q.prompt_token_ids = prompts_->encode(j_.split.eval[i]);
      q.params.temperature = 0;
      q.params.max_tokens = o_.max_tokens;
      reqs.push_back(std::move(q));
    }
    double correct = 0;
    for (size_t k = 0; k < reqs.size(); ++k) reqs[k].request_id = fmt::format("eval{}-{}", evals_, k);
    ++evals_;
    run_requests(std::move(reqs), [&](size_t k, const engine::RequestOutput& out) {
      correct += trainer::score_completion(o_.reward, out.outputs.at(0).text,
                                           j_.split.eval[eval_rows_[k]].answer)
                     .correct;
    });
    at::Tensor t = at::tensor({correct, static_cast<double>(eval_rows_.size())}, at::kDouble);
    j_.g.infer->all_reduce(t);
    return t[1].item<double>() > 0 ? t[0].item<double>() / t[1].item<double>() : 0.0;
  }

  // Waits (idle) until the train ranks started `version`, then receives it between two steps.
  double receive(int64_t version) {
    // Senders start a version only once every engine of the node waits for it, so a broadcast's
    // deadline never covers an engine still busy (start eval, a slow step).
    const int me = j_.g.topo.role_index(j_.env.rank);
    sync::store_set(j_.world.store, j_.key(fmt::format("want/n{}/v{}/i{}", j_.g.node, version, me)),
                    "1");
    // The senders read version - 1's keys before sending it, and it arrived: they can go.
    j_.world.store->deleteKey(j_.key(fmt::format("want/n{}/v{}/i{}", j_.g.node, version - 1, me)));
    auto deadline = j_.rollout_deadline();
    while (!ws_->ready(version)) {
      if (Clock::now() > deadline) {
        throw std::runtime_error(fmt::format("waited {} s for the train ranks to send weights "
                                             "version {}",
                                             o_.rollout_timeout.count() / 1000, version));
      }
      std::this_thread::sleep_for(std::chrono::microseconds(200));
    }
    double pause = 0;
    loop_->post([&](engine::LlmEngine& e) {
          auto t0 = Clock::now();
          ws_->receive(*buckets_, version);
          e.bump_weight_version();
          pause = since(t0);
        })
        .get();
    version_ = version;
    return pause;
  }

  // Submits `reqs` to the engine loop and calls on_finished(index, output) once per request as
  // each finishes; returns when all did. A failed request fails the step.
  void run_requests(std::vector<engine::GenerateRequest> reqs,
                    const std::function<void(size_t, const engine::RequestOutput&)>& on_finished) {
    if (reqs.empty()) return;
    auto ch = loop_->submit(std::move(reqs));
    std::vector<bool> seen(ch->ids().size(), false);
    size_t finished = 0;
    uint64_t version = 0;
    auto deadline = j_.rollout_deadline();
    while (finished < seen.size()) {
      auto snap = ch->wait(version, std::chrono::milliseconds(200));
      version = snap.version;
      for (size_t i = 0; i < seen.size(); ++i) {
        if (seen[i] || !snap.outputs[i] || !snap.outputs[i]->finished) continue;
        seen[i] = true;
        ++finished;
        if (!snap.outputs[i]->error.empty()) {
          throw std::runtime_error("request " + ch->ids()[i] + " failed: " +
                                   snap.outputs[i]->error);
        }
        on_finished(i, *snap.outputs[i]);
      }
      if (finished < seen.size() && Clock::now() > deadline) {
        throw std::runtime_error(fmt::format("{} of {} requests unfinished after {} s",
                                             seen.size() - finished, seen.size(),
                                             o_.rollout_timeout.count() / 1000));
      }
    }
  }

  void run() {
    json start = {{"phase", "start"}, {"accuracy", evaluate()}, {"elapsed_s", since(j_.t0)}};
    if (j_.env.rank == 0) put_json(j_.world.store, j_.key("eval/start"), start);
    int64_t version = j_.start_step;
    version_ = version;
    if (j_.resumed) {
      loop_->post([version](engine::LlmEngine& e) { e.set_weight_version(version); }).get();
    }
    if (!j_.resumed && o_.sft_steps > 0) {
      for (int64_t s = 0; s < o_.sft_steps; ++s) j_.draw(o_.sft_rows_per_step);
      receive(++version);
      json e = {{"phase", "sft"}, {"accuracy", evaluate()}, {"elapsed_s", since(j_.t0)}};
      if (j_.env.rank == 0) put_json(j_.world.store, j_.key("eval/sft"), e);
    }
    Fault fault = parse_fault(o_.fault);
    for (int64_t step = j_.start_step; step < o_.steps; ++step) {
      if (fault.rank == j_.env.rank && fault.step == step + 1) std::raise(SIGKILL);
      json m = rollout(step);
      m["sync_s"] = receive(++version);
      m["weight_version"] = version_;
      if ((o_.eval_every > 0 && (step + 1) % o_.eval_every == 0) || step + 1 == o_.steps) {
        m["eval_accuracy"] = evaluate();
      }
      m["elapsed_s"] = since(j_.t0);
      put_json(j_.world.store, j_.key(fmt::format("m/s{}/r{}", step, j_.env.rank)), m);
    }
  }

 private:
  // Generates this rank's shard of step `step` and streams packed micro-batches to the node's
  // train ranks as groups finish. Returns this rank's rollout metrics.
  json rollout(int64_t step) {
    auto t_start = Clock::now();
    std::vector<int64_t> picked = j_.draw(o_.prompts_per_step);
    std::vector<std::vector<int32_t>> prompt_ids;
    std::vector<int64_t> cost;
    for (int64_t r : picked) {
      prompt_ids.push_back(prompts_->encode(j_.split.train[r]));
      cost.push_back(static_cast<int64_t>(prompt_ids.back().size()) +
                     int64_t{o_.samples_per_prompt} * o_.max_tokens);
    }
    std::vector<int> owner = shard_by_cost(cost, j_.infer_total);
    std::vector<int64_t> row_of;  // submission index -> task row
    std::vector<engine::GenerateRequest> reqs;
    for (size_t i = 0; i < picked.size(); ++i) {
      if (owner[i] != j_.role_global) continue;
      engine::GenerateRequest q;
      q.request_id = fmt::format("s{}p{}", step, i);
      q.prompt_token_ids = std::move(prompt_ids[i]);
      q.params.n = o_.samples_per_prompt;
      q.params.temperature = o_.temperature;
      q.params.max_tokens = o_.max_tokens;
      q.params.seed = o_.seed * 1000003 + static_cast<uint64_t>(step) * 1009 + i;
      row_of.push_back(picked[i]);
      reqs.push_back(std::move(q));
    }
    std::vector<trainer::SampleGroup> pending;
    int64_t pending_tokens = 0, gen_tokens = 0, correct = 0, samples = 0, sent_bytes = 0;
    double rsum = 0, rsq = 0;
    run_requests(std::move(reqs), [&](size_t index, const engine::RequestOutput& out) {
        const trainer::TaskRow& row = j_.split.train[row_of[index]];
        trainer::SampleGroup grp;
        grp.prompt_ids.assign(out.prompt_token_ids.begin(), out.prompt_token_ids.end());
        grp.prompt_index = row_of[index];
        for (const auto& c : out.outputs) {
          auto rr = trainer::score_completion(o_.reward, c.text, row.answer);
          trainer::Sample smp;
          smp.completion_ids = c.token_ids;
          smp.logprobs = c.raw_logprobs;
          smp.reward = rr.reward;
          gen_tokens += static_cast<int64_t>(c.token_ids.size());
          pending_tokens += static_cast<int64_t>(grp.prompt_ids.size() + c.token_ids.size());
          correct += rr.correct;
          rsum += rr.reward;
          rsq += rr.reward * rr.reward;
          ++samples;
          grp.samples.push_back(std::move(smp));
        }
        pending.push_back(std::move(grp));
        trainer::compute_group_advantages(pending);  // per group: earlier groups are unchanged
        if (pending_tokens >= o_.trainer.micro_batch_tokens) {
          sent_bytes += flush(pending, step);
          pending_tokens = 0;
        }
    });
    double gen_s = since(t_start);
    sent_bytes += flush(pending, step);
    // End of this step's stream to every train rank of the node.
    for (int t = 0; t < j_.g.topo.train_per_node; ++t) {
      sync::store_set(j_.world.store, msg_key(step, t, next_msg_[t]++), "end");
    }
    sync::wait_all(sends_);
    in_flight_.clear();
    next_msg_.clear();
    double n = std::max<int64_t>(1, samples);
    double mean = rsum / n;
    return {{"role", "infer"},
            {"samples", samples},
            {"reward_sum", rsum},
            {"reward_sq", rsq},
            {"correct", correct},
            {"gen_tokens", gen_tokens},
            {"gen_s", gen_s},
            {"rollout_bytes", sent_bytes},
            {"reward_mean", mean}};
  }

  std::string msg_key(int64_t step, int t, int64_t k) const {
    return j_.key(fmt::format("mb/n{}/s{}/i{}/t{}/{}", j_.g.node, step, j_.g.topo.role_index(j_.env.rank), t, k));
  }

  // Packs and sends every pending group; each micro-batch goes to the next train rank of the node.
  int64_t flush(std::vector<trainer::SampleGroup>& pending, int64_t step) {
    if (pending.empty()) return 0;
    auto batches = trainer::pack_micro_batches(pending, o_.trainer.micro_batch_tokens, version_);
    pending.clear();
    int64_t bytes = 0;
    for (auto& mb : batches) {
      // Infer ranks start at different train ranks, so small steps spread over all of them.
      if (rr_ < 0) rr_ = j_.g.topo.role_index(j_.env.rank);
      int t = static_cast<int>(rr_++ % j_.g.topo.train_per_node);
      at::Tensor buf = trainer::serialize_micro_batch(mb);
      // Announce the size, then one send: the train rank posts the matching recv when it sees it.
      sync::store_set(j_.world.store, msg_key(step, t, next_msg_[t]++), std::to_string(buf.numel()));
      // At most kMaxInFlight micro-batches wait on their train ranks: infer-rank memory stays
      // bounded by a few micro-batches, not by the step's rollouts.
      while (sends_.size() >= kMaxInFlight) {
        sends_.front()->wait();
        sends_.erase(sends_.begin());
        in_flight_.erase(in_flight_.begin());
      }
      sends_.push_back(j_.g.sync->send_async(buf, /*sync rank of train t=*/t));
      in_flight_.push_back(buf);
      bytes += buf.numel();
    }
    return bytes;
  }

  Job& j_;
  const RlJobOptions& o_;
  std::shared_ptr<engine::EngineLoop> loop_;
  std::unique_ptr<server::Server> server_;
  std::vector<at::Tensor>* buckets_ = nullptr;
  std::unique_ptr<trainer::PromptEncoder> prompts_;  // over the engine's tokenizer
  int64_t version_ = 0;  // weights the engine runs (mirrors the engine's weight_version)
  int64_t evals_ = 0;
  std::unique_ptr<sync::WeightLayout> layout_;
  std::unique_ptr<sync::WeightSync> ws_;
  std::vector<size_t> eval_rows_;
  std::vector<std::unique_ptr<sync::Work>> sends_;
  std::vector<at::Tensor> in_flight_;
  std::map<int, int64_t> next_msg_;
  int64_t rr_ = -1;  // round-robin cursor over the node's train ranks (starts at this rank's index)
  static constexpr size_t kMaxInFlight = 4;
};

// ---------------------------------------------------------------------------------------------
// Train rank.

class TrainRank {
 public:
  explicit TrainRank(Job& job) : j_(job), o_(job.o) {}

  void run() {
    at::ScalarType edtype = engine::parse_dtype(o_.engine_dtype);
    trainer::TrainerOptions topts = o_.trainer;
    topts.deterministic = o_.deterministic;
    topts.dp_world_size = j_.train_total;
    std::unique_ptr<trainer::Trainer> tr;
    if (j_.resumed) {
      if (topts.grpo.kl_coef > 0) {
        if (o_.sft_steps > 0) {
          throw std::invalid_argument(
              "--resume with --kl-coef > 0 after an SFT warm-up: the KL reference (the warmed-up "
              "weights) is not in the checkpoint; resume with --sft-steps 0 to use --model as the "
              "reference");
        }
        topts.reference_model_dir = o_.model_dir;  // the run's reference: its initial model
      }
      tr = std::make_unique<trainer::Trainer>(o_.resume_dir, topts);
      trainer::load_trainer_state(*tr, o_.resume_dir);
    } else {
      tr = std::make_unique<trainer::Trainer>(o_.model_dir, topts);
    }
    std::vector<sync::TensorSpec> specs;
    for (const auto& [name, t] : tr->master_weights()) {
      specs.push_back({name, std::vector<int64_t>(t.sizes().begin(), t.sizes().end()), edtype});
    }
    layout_ = std::make_unique<sync::WeightLayout>(sync::WeightLayout::plan(specs, o_.bucket_bytes));
    ws_ = std::make_unique<sync::WeightSync>(j_.g, j_.world.store, *layout_, o_.sync);
    int64_t version = j_.start_step;

    if (!j_.resumed && o_.sft_steps > 0) {
      tr = sft(std::move(tr), topts);
      send(*tr, ++version);
    }
    tr->set_grad_all_reduce(all_reduce_hook());
    Fault fault = parse_fault(o_.fault);
    for (int64_t step = j_.start_step; step < o_.steps; ++step) {
      if (fault.rank == j_.env.rank && fault.step == step + 1) std::raise(SIGKILL);
      j_.draw(o_.prompts_per_step);  // keep the data cursor in step with the infer ranks
      json m = train_step(*tr, step);
      m["sync_send_s"] = send(*tr, ++version);
      bool save = !o_.save_dir.empty() &&
                  ((o_.save_every > 0 && (step + 1) % o_.save_every == 0) || step + 1 == o_.steps);
      if (save) {
        if (j_.role_global == 0) {
          auto t0 = Clock::now();
          std::string dir = fmt::format("{}/step-{}", o_.save_dir, step + 1);
          trainer::save_checkpoint(*tr, dir, o_.model_dir,
                                   {{"rows_drawn", j_.rows->drawn()}, {"phase", "grpo"}});
          m["checkpoint"] = dir;
          m["checkpoint_s"] = since(t0);
        }
        store_barrier(fmt::format("checkpoint-s{}", step));  // a slow write is not a dead rank
      }
      put_json(j_.world.store, j_.key(fmt::format("m/s{}/r{}", step, j_.env.rank)), m);
    }
  }

 private:
  trainer::GradAllReduce all_reduce_hook() {
    // The step's loss is the mean over every loss token of every train rank. Micro-batches stream
    // in, so each is accumulated with scale = its loss-token count (a token sum); the hook learns
    // the global count N and scales by dp / N before the SUM all-reduce (the trainer divides by
    // dp after it). Micro-batch sizes and per-rank counts then do not change the weighting.
    return [this](std::vector<at::Tensor>& grads) {
      at::Tensor n = at::full({1}, static_cast<double>(local_loss_tokens_), at::kDouble);
      j_.g.train->all_reduce(n);
      double total = n.item<double>();
      for (auto& gb : grads) {
        if (total > 0) gb.mul_(static_cast<double>(j_.train_total) / total);
        j_.g.train->all_reduce(gb);
      }
    };
  }

  // A barrier through the store with the rollout deadline: collectives after it then start
  // together, so a slow node or a checkpoint write is not mistaken for a dead peer.
  void store_barrier(const std::string& name) {
    sync::store_set(j_.world.store, j_.key(fmt::format("bar/{}/t{}", name, j_.role_global)), "1");
    std::vector<std::string> keys;
    for (int t = 0; t < j_.train_total; ++t) keys.push_back(j_.key(fmt::format("bar/{}/t{}", name, t)));
    auto missing = sync::wait_keys(j_.world.store, keys, j_.rollout_deadline());
    if (!missing.empty()) {
      throw std::runtime_error(fmt::format("train ranks did not reach '{}' within {} s: {}", name,
                                           o_.rollout_timeout.count() / 1000,
                                           fmt::join(missing, ", ")));
    }
    // Everyone passed the previous barrier before reaching this one: its key can go.
    if (!last_barrier_.empty()) j_.world.store->deleteKey(last_barrier_);
    last_barrier_ = j_.key(fmt::format("bar/{}/t{}", name, j_.role_global));
  }

  double send(trainer::Trainer& tr, int64_t version) {
    std::vector<std::string> want;
    for (int i = 0; i < j_.g.topo.infer_per_node; ++i) {
      want.push_back(j_.key(fmt::format("want/n{}/v{}/i{}", j_.g.node, version, i)));
    }
    if (!sync::wait_keys(j_.world.store, want, j_.rollout_deadline()).empty()) {
      throw std::runtime_error(fmt::format("the engines of node {} never asked for weights "
                                           "version {}", j_.g.node, version));
    }
    std::vector<at::Tensor> masters;
    for (const auto& [name, t] : tr.master_weights()) masters.push_back(t.detach());
    auto st = ws_->send(masters, version);
    return st.transfer_s;
  }

  std::unique_ptr<trainer::Trainer> sft(std::unique_ptr<trainer::Trainer> tr,
                                        const trainer::TrainerOptions& topts) {
    trainer::TrainerOptions so = topts;
    so.schedule.lr = o_.sft_lr;
    so.schedule.warmup_steps = 0;
    so.schedule.total_steps = 0;
    so.grpo.kl_coef = 0;
    auto sft = std::make_unique<trainer::Trainer>(o_.model_dir, so);
    sft->set_grad_all_reduce(all_reduce_hook());
    // The same tokenizer the engine uses, loaded from the model directory, and the same prompt
    // ids the engines generate from (the special tokens its encode_prompt adds to a prompt).
    engine::Tokenizer tok(o_.model_dir);
    auto cfg = engine::load_model_config(o_.model_dir);
    const trainer::PromptEncoder prompts(tok, tok.special_prefix());
    for (int64_t s = 0; s < o_.sft_steps; ++s) {
      std::vector<int64_t> picked = j_.draw(o_.sft_rows_per_step);
      std::vector<trainer::SampleGroup> groups;
      for (size_t i = 0; i < picked.size(); ++i) {
        if (static_cast<int>(i % j_.train_total) != j_.role_global) continue;
        const auto& row = j_.split.train[picked[i]];
        groups.push_back(trainer::sft_group(prompts.encode(row), tok.encode(row.answer),
                                            static_cast<int32_t>(cfg.eos_token_ids.at(0))));
      }
      auto batches = trainer::pack_micro_batches(groups, so.micro_batch_tokens);
      sft->zero_grad();
      local_loss_tokens_ = 0;
      for (const auto& mb : batches) {
        sft->accumulate(mb, trainer::LossKind::kSft, static_cast<double>(mb.num_loss_tokens()));
        local_loss_tokens_ += mb.num_loss_tokens();
      }
      auto st = sft->finish_step();
      if (j_.role_global == 0 && ((s + 1) % 20 == 0 || s + 1 == o_.sft_steps)) {
        spdlog::info("sft step {}/{} | grad norm {:.3g} lr {:.1e} | {:.1f} s", s + 1,
                     o_.sft_steps, st.grad_norm, st.lr, since(j_.t0));
      }
    }
    engine::NamedTensors w;
    for (const auto& [name, t] : sft->master_weights()) w.emplace_back(name, t.detach().clone());
    auto grpo = std::make_unique<trainer::Trainer>(sft->config(), std::move(w), topts);
    return grpo;
  }

  // Receives this step's micro-batches from the node's infer ranks as they come, accumulating
  // gradients one micro-batch at a time, then steps the optimizer.
  json train_step(trainer::Trainer& tr, int64_t step) {
    const int I = j_.g.topo.infer_per_node;
    const int t = j_.g.topo.role_index(j_.env.rank);
    std::vector<int64_t> next(I, 0);
    std::vector<bool> done(I, false);
    int remaining = I;
    std::vector<trainer::LossMetrics> parts;
    int64_t tokens = 0, bytes = 0;
    double wait_s = 0, compute_s = 0;
    tr.zero_grad();
    local_loss_tokens_ = 0;
    auto deadline = j_.rollout_deadline();
    auto pause = std::chrono::microseconds(100);
    while (remaining > 0) {
      bool progressed = false;
      for (int i = 0; i < I; ++i) {
        if (done[i]) continue;
        std::string k = j_.key(fmt::format("mb/n{}/s{}/i{}/t{}/{}", j_.g.node, step, i, t, next[i]));
        if (!sync::store_has(j_.world.store, k)) continue;
        auto v = j_.world.store->get(k);
        std::string val(v.begin(), v.end());
        j_.world.store->deleteKey(k);
        ++next[i];
        progressed = true;
        if (val == "end") {
          done[i] = true;
          --remaining;
          continue;
        }
        auto w0 = Clock::now();
        at::Tensor buf = at::empty({std::stoll(val)}, at::kByte);
        j_.g.sync->recv(buf, /*sync rank of infer i=*/j_.g.topo.train_per_node + i);
        wait_s += since(w0);
        bytes += buf.numel();
        auto c0 = Clock::now();
        trainer::MicroBatch mb = trainer::deserialize_micro_batch(buf);
        buf = at::Tensor();
        parts.push_back(tr.accumulate(mb, trainer::LossKind::kGrpo,
                                      static_cast<double>(mb.num_loss_tokens())));
        local_loss_tokens_ += mb.num_loss_tokens();
        tokens += mb.num_tokens();
        compute_s += since(c0);
      }
      if (!progressed && remaining > 0) {
        if (Clock::now() > deadline) {
          std::vector<int> waiting;
          for (int i = 0; i < I; ++i) {
            if (!done[i]) waiting.push_back(j_.g.node * I + i);
          }
          throw std::runtime_error(fmt::format(
              "step {}: waited {} s for rollouts from infer ranks {} (global infer index) of node {}", step + 1,
              o_.rollout_timeout.count() / 1000, fmt::join(waiting, ", "), j_.g.node));
        }
        auto p0 = Clock::now();
        std::this_thread::sleep_for(pause);
        pause = std::min(pause * 2, std::chrono::microseconds(5000));
        wait_s += since(p0);
      } else {
        pause = std::chrono::microseconds(100);
      }
    }
    local_batches_ = static_cast<int64_t>(parts.size());
    double w0 = 0;
    {
      auto b0 = Clock::now();
      store_barrier(fmt::format("rollouts-s{}", step));  // every node's rollouts are in
      w0 = since(b0);
    }
    wait_s += w0;
    auto c0 = Clock::now();
    auto st = tr.finish_step();
    compute_s += since(c0);
    auto lm = combine(parts);
    return {{"role", "train"},
            {"step", st.step},
            {"loss", lm.loss},
            {"kl", lm.kl},
            {"clip_fraction", lm.clip_fraction},
            {"gap_max", lm.logprob_gap_max},
            {"gap_mean", lm.logprob_gap_mean},
            {"loss_tokens", lm.num_tokens},
            {"grad_norm", st.grad_norm},
            {"lr", st.lr},
            {"micro_batches", local_batches_},
            {"train_tokens", tokens},
            {"rollout_bytes", bytes},
            {"wait_s", wait_s},
            {"train_s", compute_s},
            {"peak_rss", peak_rss_bytes()}};
  }

  Job& j_;
  const RlJobOptions& o_;
  std::unique_ptr<sync::WeightLayout> layout_;
  std::unique_ptr<sync::WeightSync> ws_;
  int64_t local_batches_ = 0;
  int64_t local_loss_tokens_ = 0;
  std::string last_barrier_;
};

// ---------------------------------------------------------------------------------------------
// World rank 0: progress lines, metrics file, summary.

void report(Job& j, const sync::StorePtr& store) {
  const auto& o = j.o;
  std::ofstream metrics;
  if (!o.metrics_path.empty()) {
    metrics.open(o.metrics_path, j.resumed ? std::ios::app : std::ios::trunc);
    if (!metrics) throw std::runtime_error("cannot open the metrics file " + o.metrics_path);
  }
  if (!j.resumed) {
    fmt::print("data: {} rows ({}): {} held out for evaluation{}, {} for training\n",
               j.split.eval.size() + j.split.train.size(),
               o.data_path.empty() ? std::string("built-in copy task") : o.data_path,
               j.split.eval.size(),
               o.eval_rows < 0 ? " (default: a fifth, at most 128; --eval-rows sets it)" : "",
               j.split.train.size());
    std::fflush(stdout);
  }
  auto start = get_json(store, j.key("eval/start"), j.rollout_deadline(), "start eval");
  std::vector<std::pair<std::string, double>> evals = {
      {"start", start["accuracy"].get<double>()}};
  fmt::print("eval start: held-out accuracy {:.3f} ({} rows)\n", evals[0].second,
             j.split.eval.size());
  if (!j.resumed && o.sft_steps > 0) {
    auto e = get_json(store, j.key("eval/sft"), j.rollout_deadline(), "SFT eval");
    evals.push_back({fmt::format("sft {} steps", o.sft_steps), e["accuracy"].get<double>()});
    fmt::print("eval after the SFT warm-up ({} steps of {} rows): held-out accuracy {:.3f} "
               "({:.1f} s)\n",
               o.sft_steps, o.sft_rows_per_step, evals.back().second, e["elapsed_s"].get<double>());
  }
  std::fflush(stdout);
  double sum_gen = 0, sum_wait = 0, sum_train = 0, sum_sync = 0, max_gap0 = -1;
  int64_t total_gen_tokens = 0, peak_train_rss = 0, steps_done = 0;
  for (int64_t step = j.start_step; step < o.steps; ++step) {
    std::vector<json> ms;
    for (int r = 0; r < j.env.world_size; ++r) {
      std::string k = j.key(fmt::format("m/s{}/r{}", step, r));
      ms.push_back(get_json(store, k, j.rollout_deadline(),
                            fmt::format("step {} metrics of rank {}", step + 1, r)));
      store->deleteKey(k);
    }
    trainer::StepMetrics m;
    m.step = step + 1;
    m.phase = "grpo";
    double samples = 0, rsum = 0, rsq = 0, correct = 0, gen_tokens = 0, gen_s = 0, sync_s = 0;
    double loss = 0, kl = 0, clip = 0, gap_max = 0, gap_mean_w = 0, loss_tokens = 0, tokens = 0;
    double train_s = 0, wait_s = 0, gnorm = 0, lr = 0;
    int trains = 0;
    for (const auto& x : ms) {
      if (x["role"] == "infer") {
        samples += x["samples"].get<double>();
        rsum += x["reward_sum"].get<double>();
        rsq += x["reward_sq"].get<double>();
        correct += x["correct"].get<double>();
        gen_tokens += x["gen_tokens"].get<double>();
        gen_s = std::max(gen_s, x["gen_s"].get<double>());
        sync_s = std::max(sync_s, x["sync_s"].get<double>());
        m.weight_version = x["weight_version"].get<int64_t>();
        if (x.contains("eval_accuracy")) m.eval_accuracy = x["eval_accuracy"].get<double>();
        m.elapsed_s = std::max(m.elapsed_s, x["elapsed_s"].get<double>());
      } else {
        if (x["micro_batches"].get<int64_t>() == 0) continue;  // nothing to average
        ++trains;
        loss += x["loss"].get<double>();
        kl += x["kl"].get<double>();
        clip += x["clip_fraction"].get<double>() * x["loss_tokens"].get<double>();
        gap_max = std::max(gap_max, x["gap_max"].get<double>());
        gap_mean_w += x["gap_mean"].get<double>() * x["loss_tokens"].get<double>();
        loss_tokens += x["loss_tokens"].get<double>();
        tokens += x["train_tokens"].get<double>();
        train_s = std::max(train_s, x["train_s"].get<double>());
        wait_s = std::max(wait_s, x["wait_s"].get<double>());
        gnorm = x["grad_norm"].get<double>();
        lr = x["lr"].get<double>();
        peak_train_rss = std::max(peak_train_rss, x["peak_rss"].get<int64_t>());
      }
    }
    double n = std::max(1.0, samples);
    m.reward_mean = rsum / n;
    m.reward_std = std::sqrt(std::max(0.0, rsq / n - m.reward_mean * m.reward_mean));
    m.accuracy = correct / n;
    m.loss = trains ? loss / trains : 0;
    m.kl = trains ? kl / trains : 0;
    m.clip_fraction = loss_tokens > 0 ? clip / loss_tokens : 0;
    m.grad_norm = gnorm;
    m.lr = lr;
    m.gen_tok_s = gen_s > 0 ? gen_tokens / gen_s : 0;
    m.train_tok_s = train_s > 0 ? tokens / train_s : 0;
    m.sync_ms = sync_s * 1e3;
    m.logprob_gap_max = gap_max;
    m.logprob_gap_mean = loss_tokens > 0 ? gap_mean_w / loss_tokens : 0;
    if (max_gap0 < 0) max_gap0 = gap_max;
    if (metrics.is_open()) {
      json row = trainer::to_json(m);
      row["time_generate_s"] = gen_s;
      row["time_wait_rollouts_s"] = wait_s;
      row["time_train_s"] = train_s;
      row["time_sync_s"] = sync_s;
      row["generated_tokens"] = gen_tokens;
      row["train_tokens"] = tokens;
      metrics << row.dump() << "\n";
      metrics.flush();
    }
    fmt::print("{} | time gen {:.2f} s wait {:.2f} s train {:.2f} s sync {:.1f} ms\n",
               trainer::format_progress(m), gen_s, wait_s, train_s, sync_s * 1e3);
    std::fflush(stdout);
    if (m.eval_accuracy) evals.push_back({fmt::format("step {}", m.step), *m.eval_accuracy});
    sum_gen += gen_s;
    sum_wait += wait_s;
    sum_train += train_s;
    sum_sync += sync_s;
    total_gen_tokens += static_cast<int64_t>(gen_tokens);
    ++steps_done;
  }
  double wall = since(j.t0);
  fmt::print("\nsummary: {} node(s) x ({} infer + {} train ranks), {} GRPO steps{}, {:.1f} s\n",
             j.g.topo.nnodes, j.g.topo.infer_per_node, j.g.topo.train_per_node, steps_done,
             j.resumed ? fmt::format(" (resumed at step {})", j.start_step) : "", wall);
  fmt::print("| eval point | held-out accuracy |\n|---|---|\n");
  for (const auto& [name, acc] : evals) fmt::print("| {} | {:.3f} |\n", name, acc);
  if (steps_done > 0) {
    double k = static_cast<double>(steps_done);
    fmt::print("| phase (mean per step) | seconds |\n|---|---|\n");
    fmt::print("| generate | {:.2f} |\n| wait for rollouts (train) | {:.2f} |\n| train | {:.2f} |\n"
               "| weight sync | {:.3f} |\n",
               sum_gen / k, sum_wait / k, sum_train / k, sum_sync / k);
    fmt::print("generated {} tokens; log-prob gap at the first step {:.2e}; peak train-rank RSS {}\n",
               total_gen_tokens, max_gap0, format_bytes(static_cast<double>(peak_train_rss)));
  }
  double first = evals.front().second, last = evals.back().second;
  fmt::print("held-out accuracy {:.3f} -> {:.3f} ({:+.1f} points)\n", first, last,
             (last - first) * 100);
  std::fflush(stdout);
}

}  // namespace

int run_rl_rank(const sync::RankEnv& env, const RlJobOptions& o) {
  // Shared with world rank 0's reporter thread, which may outlive a failing main thread for the
  // moment it takes the rank to exit.
  std::shared_ptr<Job> jp(new Job{o, env, sync::join_world(env, o.timeout), {}, {}, {}});
  Job& j = *jp;
  sync::Topology topo{env.nnodes, o.infer_per_node, o.train_per_node};
  j.g = sync::make_groups(std::move(j.world.comm), topo);
  j.infer_total = topo.nnodes * topo.infer_per_node;
  j.train_total = topo.nnodes * topo.train_per_node;
  j.role_global = j.g.node * (j.g.role == sync::Role::kInfer ? topo.infer_per_node
                                                               : topo.train_per_node) +
                  topo.role_index(env.rank);

  auto rows = o.data_path.empty() ? trainer::default_task_rows(o.default_task_rows, o.seed)
                                  : trainer::load_task_jsonl(o.data_path, o.reward, o.model_dir);
  j.split = trainer::split_task(std::move(rows), o.eval_rows, o.seed);
  if (j.split.train.empty()) CRL_INVALID("the task has no training rows after the held-out split");
  j.rows = std::make_unique<trainer::RowSampler>(static_cast<int64_t>(j.split.train.size()),
                                                 o.seed + 17);
  if (!o.resume_dir.empty()) {
    auto state = trainer::read_checkpoint_state(o.resume_dir);
    j.resumed = true;
    j.start_step = state.step;
    int64_t drawn = state.extra.value("rows_drawn", int64_t{0});
    for (int64_t i = 0; i < drawn; ++i) j.rows->next();
    if (env.rank == 0) {
      fmt::print("resumed from {} at step {} (data cursor {})\n", o.resume_dir, j.start_step, drawn);
    }
  }
  if (j.g.role == sync::Role::kInfer) {
    InferRank rank(j);
    if (env.rank == 0) {
      // World rank 0 reports while its engine works: the report reads the store only.
      // Its own store connection: the engine thread polls the store meanwhile.
      sync::StorePtr store = sync::connect_store(env.master_addr, env.master_port, o.timeout);
      if (!env.store_prefix.empty()) {
        store = c10::make_intrusive<c10d::PrefixStore>(env.store_prefix, store);
      }
      auto err_p = std::make_shared<std::exception_ptr>();
      std::thread reporter([jp, store, err_p] {
        try {
          report(*jp, store);
        } catch (...) {
          *err_p = std::current_exception();
        }
      });
      try {
        rank.run();
      } catch (...) {
        reporter.detach();
        throw;
      }
      reporter.join();
      if (*err_p) std::rethrow_exception(*err_p);
    } else {
      rank.run();
    }
  } else {
    TrainRank rank(j);
    rank.run();
  }
  return 0;
}

}  // namespace crl::app
