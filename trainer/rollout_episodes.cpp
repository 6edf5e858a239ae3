// The multi-turn half of RolloutProducer (--env): each step's episodes against the environment,
// n per task of this rank's share, and the held-out success rate. The rollouts leave through the
// same RolloutBatcher as single-turn groups.
#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <algorithm>

#include "common/units.h"
#include "sync/communicator.h"
#include "trainer/environment.h"
#include "trainer/multi_turn.h"
#include "trainer/rollout_batcher.h"
#include "trainer/rollout_producer.h"
#include "trainer/step_reports.h"

namespace crl::trainer {

using Clock = std::chrono::steady_clock;

double RolloutProducer::evaluate_episodes() {
  std::vector<EpisodeSpec> specs;
  for (size_t k = 0; k < eval_rows_.size(); ++k) {
    EpisodeSpec e;
    e.id = fmt::format("eval{}-{}", evals_, k);
    e.split = EnvSplit::kEval;
    e.index = static_cast<int64_t>(eval_rows_[k]);
    if (!o_.data_path.empty()) e.task = env_task(c_.data.split().eval[eval_rows_[k]]);
    e.temperature = 0;
    specs.push_back(std::move(e));
  }
  ++evals_;
  double correct = 0;
  auto t0 = Clock::now();
  // Evaluation takes no weight update: it measures one version.
  episodes_->run(specs, [&](size_t, Episode& ep) { correct += ep.correct; });
  busy_s_ += seconds_since(t0);
  at::Tensor t = at::tensor({correct, static_cast<double>(eval_rows_.size())}, at::kDouble);
  c_.ranks.g.infer->all_reduce(t);
  return t[1].item<double>() > 0 ? t[0].item<double>() / t[1].item<double>() : 0.0;
}

InferReport RolloutProducer::rollout_episodes(int64_t step) {
  auto t_start = Clock::now();
  const int64_t n = o_.samples_per_prompt;
  std::vector<int64_t> picked = c_.data.draw(o_.prompts_per_step);
  std::vector<EpisodeSpec> specs;
  std::vector<size_t> task_of;  // spec -> index into `tasks`
  std::vector<int64_t> tasks;   // this rank's tasks (rows)
  // Every task costs about the same (n episodes up to the token cap): the LPT shard spreads them.
  for (size_t i : own_share(std::vector<int64_t>(picked.size(), 1))) {
    for (int64_t k = 0; k < n; ++k) {
      EpisodeSpec e;
      e.id = fmt::format("s{}p{}e{}", step, i, k);
      e.split = EnvSplit::kTrain;
      e.index = picked[i];
      if (!o_.data_path.empty()) e.task = env_task(c_.data.split().train[picked[i]]);
      e.temperature = o_.temperature;
      e.seed = request_seed(step, i) * 131 + static_cast<uint64_t>(k);
      specs.push_back(std::move(e));
      task_of.push_back(tasks.size());
    }
    tasks.push_back(picked[i]);
  }
  std::vector<std::vector<Episode>> done(tasks.size());
  RolloutBatcher out = batcher(step);
  InferReport r;
  episodes_->run(
      specs,
      [&](size_t index, Episode& ep) {
        const size_t t = task_of[index];
        ++r.episodes;
        r.turns += ep.turns;
        r.tool_errors += ep.tool_errors;
        r.env_errors += ep.end == "env_error";
        if (ep.end == "env_error") {
          spdlog::warn("episode {}: {} (reward 0; not trained on)", specs[index].id, ep.env_error);
        }
        r.env_tokens += ep.env_tokens();
        r.model_tokens += ep.model_tokens();
        const int64_t len = ep.model_tokens();
        r.gen_len_max = std::max(r.gen_len_max, len);
        r.gen_len_min = r.samples == 0 ? len : std::min(r.gen_len_min, len);
        r.gen_tokens += len;
        r.truncated += ep.end == "token_cap";
        r.correct += ep.correct;
        r.reward_sum += ep.reward;
        r.reward_sq += ep.reward * ep.reward;
        ++r.samples;
        for (size_t j = 0; j < ep.ids.size(); ++j) {
          if (ep.mask[j]) r.stale_tokens += ep.versions[j] < c_.versions.version_at(step);
        }
        done[t].push_back(std::move(ep));
        if (static_cast<int64_t>(done[t].size()) < n) return;
        // The group is complete: advantages over its episodes' rewards (GRPO; episodes the
        // environment failed left out), then one sample per segment, each with its episode's
        // advantage.
        SampleGroup grp;
        grp.prompt_index = tasks[t];
        grp.samples = group_episode_samples(done[t]);
        done[t].clear();
        if (!grp.samples.empty()) grp.prompt_ids = grp.samples[0].prompt_ids;
        out.add(std::move(grp), RolloutBatcher::Advantages::kAsGiven);
      },
      [&] {
        if (!o_.reproducible) follow_updates();
      });
  busy_s_ += seconds_since(t_start);
  r.gen_s = seconds_since(t_start);
  r.rollout_bytes = out.finish();
  r.reward_mean = r.reward_sum / std::max<double>(1, static_cast<double>(r.samples));
  r.groups_dropped = out.groups_dropped();
  r.groups = out.groups_kept();
  r.groups_without_signal = out.groups_without_signal();
  return r;
}

}  // namespace crl::trainer
