#include "trainer/local_rl.h"

#include <ATen/Parallel.h>
#include <fmt/format.h>

#include <chrono>
#include <cmath>
#include <memory>
#include <random>

#include "common/check.h"
#include "engine/llm_engine.h"
#include "engine/model/model_cache.h"
#include "trainer/checkpoint.h"
#include "trainer/prompt_encoder.h"

namespace crl::trainer {

namespace {

using Clock = std::chrono::steady_clock;

double since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

double held_out_accuracy(engine::LlmEngine& eng, const PromptEncoder& prompts,
                         const std::vector<TaskRow>& rows, const RewardOptions& reward,
                         int32_t max_tokens) {
  if (rows.empty()) return 0;
  std::vector<engine::GenerateRequest> reqs;
  for (const auto& r : rows) {
    engine::GenerateRequest q;
    q.prompt_token_ids = prompts.encode(r);
    q.params.temperature = 0;
    q.params.max_tokens = max_tokens;
    reqs.push_back(std::move(q));
  }
  auto outs = eng.generate(std::move(reqs));
  int64_t correct = 0;
  for (size_t i = 0; i < outs.size(); ++i) {
    correct += score_completion(reward, outs[i].outputs.at(0).text, rows[i].answer).correct;
  }
  return static_cast<double>(correct) / static_cast<double>(rows.size());
}

std::string fmt_eval(const std::string& phase, int64_t step, double acc, double elapsed) {
  return fmt::format("eval after {} step {}: held-out accuracy {:.3f} ({:.1f} s)", phase, step, acc,
                     elapsed);
}

}  // namespace

LocalRlResult run_local_rl(const LocalRlOptions& o) {
  const auto t_start = Clock::now();
  auto log = [&](const std::string& line) {
    if (o.log) o.log(line);
  };
  if (o.num_threads > 0) at::set_num_threads(o.num_threads);
  const std::string model_dir = o.model_dir.empty() ? engine::ensure_preset_model("default") : o.model_dir;

  std::vector<TaskRow> rows = o.data_path.empty() ? default_task_rows(o.default_task_rows, o.seed)
                                                  : load_task_jsonl(o.data_path, o.reward, model_dir);
  TaskSplit split = split_task(std::move(rows), o.eval_rows, o.seed);
  CRL_CHECK(!split.train.empty(), "no training rows");

  engine::EngineConfig ec;
  ec.model_dir = model_dir;
  ec.dtype = o.engine_dtype;
  ec.deterministic = o.deterministic;
  ec.seed = o.seed;
  ec.max_seqs = std::max<int32_t>(256, o.prompts_per_step * o.samples_per_prompt);
  ec.kv_memory_bytes = int64_t{64} << 20;
  engine::LlmEngine eng(ec);
  CRL_CHECK(eng.tokenizer() != nullptr, "run_local_rl needs a model with a tokenizer");
  const engine::Tokenizer& tok = *eng.tokenizer();
  const PromptEncoder prompts(tok, eng.prompt_prefix());  // rollouts and SFT alike
  CRL_CHECK(!eng.eos_token_ids().empty(), "run_local_rl needs an EOS token");
  const int32_t eos = eng.eos_token_ids()[0];

  LocalRlResult result;
  std::unique_ptr<MetricsWriter> writer;
  if (!o.metrics_path.empty()) writer = std::make_unique<MetricsWriter>(o.metrics_path);
  auto evaluate = [&](const std::string& phase, int64_t step) {
    const double acc = held_out_accuracy(eng, prompts, split.eval, o.reward, o.max_tokens);
    result.evals.push_back({phase, step, acc, since(t_start)});
    log(fmt_eval(phase, step, acc, since(t_start)));
    return acc;
  };
  evaluate("start", 0);

  TrainerOptions sft_opts = o.sft_trainer;
  sft_opts.deterministic = o.deterministic;
  TrainerOptions grpo_opts = o.trainer;
  grpo_opts.deterministic = o.deterministic;
  RowSampler rows_sampler(static_cast<int64_t>(split.train.size()), o.seed + 17);
  int64_t version = 0;

  auto sync_weights = [&](const Trainer& t) {
    const auto t0 = Clock::now();
    t.copy_weights_to(eng.model());
    eng.bump_weight_version();
    ++version;
    return since(t0) * 1e3;
  };

  // SFT warm-up: its own trainer and optimizer; its final weights start GRPO.
  engine::NamedTensors start_weights;
  engine::ModelConfig model_config = eng.model_config();
  if (o.sft_steps > 0) {
    const auto t0 = Clock::now();
    Trainer sft(model_dir, sft_opts);
    for (int64_t step = 0; step < o.sft_steps; ++step) {
      std::vector<SampleGroup> groups;
      for (int32_t i = 0; i < o.sft_rows_per_step; ++i) {
        const TaskRow& r = split.train[rows_sampler.next()];
        groups.push_back(sft_group(prompts.encode(r), tok.encode(r.answer), eos));
      }
      auto batches = pack_micro_batches(groups, sft_opts.micro_batch_tokens);
      StepStats st = sft.train_step(batches, LossKind::kSft);
      StepMetrics m;
      m.step = st.step;
      m.phase = "sft";
      m.loss = st.loss.loss;
      m.grad_norm = st.grad_norm;
      m.lr = st.lr;
      m.train_tok_s = st.seconds > 0 ? static_cast<double>(st.num_tokens) / st.seconds : 0;
      m.elapsed_s = since(t_start);
      if (step + 1 == o.sft_steps) {
        m.sync_ms = sync_weights(sft);
        m.weight_version = version;
        m.eval_accuracy = evaluate("sft", st.step);
      }
      if (writer) writer->write(m);
      if ((step + 1) % 10 == 0 || step + 1 == o.sft_steps) log(format_progress(m));
      result.sft_steps.push_back(m);
    }
    for (const auto& [name, w] : sft.master_weights()) start_weights.emplace_back(name, w.detach().clone());
    result.sft_seconds = since(t0);
  }

  const auto t_grpo = Clock::now();
  std::unique_ptr<Trainer> trainer =
      start_weights.empty() ? std::make_unique<Trainer>(model_dir, grpo_opts)
                            : std::make_unique<Trainer>(model_config, std::move(start_weights), grpo_opts);
  for (int64_t step = 0; step < o.grpo_steps; ++step) {
    // Rollouts.
    const auto t_gen = Clock::now();
    std::vector<const TaskRow*> picked;
    std::vector<engine::GenerateRequest> reqs;
    for (int32_t i = 0; i < o.prompts_per_step; ++i) {
      const TaskRow& r = split.train[rows_sampler.next()];
      picked.push_back(&r);
      engine::GenerateRequest q;
      q.prompt_token_ids = prompts.encode(r);
      q.params.n = o.samples_per_prompt;
      q.params.temperature = o.temperature;
      q.params.max_tokens = o.max_tokens;
      q.params.seed = o.seed * 1000003 + static_cast<uint64_t>(step) * 1009 + i;
      reqs.push_back(std::move(q));
    }
    auto outs = eng.generate(std::move(reqs));
    const double gen_s = since(t_gen);
    int64_t gen_tokens = 0, correct = 0, num_samples = 0;
    double rsum = 0, rsq = 0;
    std::vector<SampleGroup> groups;
    for (size_t i = 0; i < outs.size(); ++i) {
      SampleGroup g;
      g.prompt_ids.assign(outs[i].prompt_token_ids.begin(), outs[i].prompt_token_ids.end());
      g.prompt_index = static_cast<int64_t>(i);
      for (const auto& c : outs[i].outputs) {
        RewardResult rr = score_completion(o.reward, c.text, picked[i]->answer);
        Sample s;
        s.completion_ids = c.token_ids;
        s.logprobs = c.raw_logprobs;
        s.reward = rr.reward;
        gen_tokens += static_cast<int64_t>(c.token_ids.size());
        correct += rr.correct;
        rsum += rr.reward;
        rsq += rr.reward * rr.reward;
        ++num_samples;
        g.samples.push_back(std::move(s));
      }
      groups.push_back(std::move(g));
    }
    compute_group_advantages(groups);
    auto batches = pack_micro_batches(groups, grpo_opts.micro_batch_tokens, eng.weight_version());

    // One optimizer step, then the weights go to the engine.
    StepStats st = trainer->train_step(batches, LossKind::kGrpo);
    StepMetrics m;
    m.step = st.step;
    m.phase = "grpo";
    const double n = static_cast<double>(std::max<int64_t>(1, num_samples));
    m.reward_mean = rsum / n;
    m.reward_std = std::sqrt(std::max(0.0, rsq / n - m.reward_mean * m.reward_mean));
    m.accuracy = static_cast<double>(correct) / n;
    m.loss = st.loss.loss;
    m.kl = st.loss.kl;
    m.clip_fraction = st.loss.clip_fraction;
    m.grad_norm = st.grad_norm;
    m.lr = st.lr;
    m.gen_tok_s = gen_s > 0 ? static_cast<double>(gen_tokens) / gen_s : 0;
    m.train_tok_s = st.seconds > 0 ? static_cast<double>(st.num_tokens) / st.seconds : 0;
    m.logprob_gap_max = st.loss.logprob_gap_max;
    m.logprob_gap_mean = st.loss.logprob_gap_mean;
    m.sync_ms = sync_weights(*trainer);
    m.weight_version = version;
    if ((o.eval_every > 0 && (step + 1) % o.eval_every == 0) || step + 1 == o.grpo_steps) {
      m.eval_accuracy = evaluate("grpo", st.step);
    }
    m.elapsed_s = since(t_start);
    if (writer) writer->write(m);
    log(format_progress(m));
    result.grpo_steps.push_back(m);
  }
  result.grpo_seconds = since(t_grpo);
  if (!o.checkpoint_dir.empty()) {
    save_checkpoint(*trainer, o.checkpoint_dir, model_dir);
  }
  result.wall_seconds = since(t_start);
  return result;
}

}  // namespace crl::trainer
