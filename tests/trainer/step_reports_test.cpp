#include "trainer/step_reports.h"

#include <gtest/gtest.h>

#include <chrono>

#include "tests/test_utils.h"
#include "trainer/rl_context.h"

namespace crl::trainer {
namespace {

using nlohmann::json;

InferReport infer_report(int64_t samples, double busy_s, double elapsed_s) {
  InferReport r;
  r.samples = samples;
  r.reward_sum = 0.5 * static_cast<double>(samples);
  r.reward_sq = 0.25 * static_cast<double>(samples);
  r.correct = samples / 2;
  r.gen_tokens = 10 * samples;
  r.gen_len_max = 10 + samples;
  r.gen_len_min = 10 - samples;
  r.gen_s = static_cast<double>(samples) / 10;
  r.groups_dropped = 1;
  r.busy_s = busy_s;
  r.engine_version = samples;
  r.elapsed_s = elapsed_s;
  r.store_ops = 7;
  r.store_bytes = 100;
  r.lora_slot_reuses = 1;
  return r;
}

TrainReport train_report(int64_t micro_batches, int64_t loss_tokens, double gap_max) {
  TrainReport r;
  r.loss = 1.0;
  r.clip_fraction = 0.5;
  r.gap_max = gap_max;
  r.gap_mean = 0.25;
  r.entropy = 0.75;
  r.staleness_sum = loss_tokens;
  r.staleness_max = 1;
  r.loss_tokens = loss_tokens;
  r.micro_batches = micro_batches;
  r.optimizer_updates = 3;
  r.zero_rounds = 4;
  r.zero_rounds_while_receiving = 2;
  r.train_tokens = 2 * loss_tokens;
  r.wait_s = 1.0;
  r.send_wait_s = 0.5;
  r.train_s = 3.0;
  r.elapsed_s = 9.0;
  r.store_ops = 3;
  return r;
}

TEST(RlReportsTest, InferAndTrainReportsRoundTripTheirJsonWithTheirRole) {
  json ij = infer_report(8, 1.0, 2.0);
  EXPECT_EQ(ij["role"], "infer");
  auto back = ij.get<InferReport>();
  EXPECT_EQ(back.samples, 8);
  EXPECT_EQ(back.store_bytes, 100);
  EXPECT_EQ(back.lora_slot_reuses, 1);
  TrainReport t = train_report(2, 30, 0.1);
  t.checkpoint = "/ckpt/step-1";
  t.checkpoint_s = 0.7;
  json tj = t;
  EXPECT_EQ(tj["role"], "train");
  EXPECT_EQ(tj["checkpoint"], "/ckpt/step-1");
  auto tb = tj.get<TrainReport>();
  EXPECT_EQ(tb.loss_tokens, 30);
  EXPECT_EQ(tb.optimizer_updates, 3);
  EXPECT_EQ(tb.checkpoint, "/ckpt/step-1");
  EXPECT_FALSE(json(train_report(1, 1, 0)).contains("checkpoint"));  // only when written
}

TEST(RlReportsTest, CombineSumsTakesMaximaAndAveragesOnlyRanksThatTrained) {
  std::vector<RankReport> reports = {infer_report(8, 1.0, 5.0), infer_report(4, 9.0, 6.0),
                                     train_report(2, 30, 0.1), train_report(0, 0, 7.0)};
  StepTotals t = combine(reports, {2.0, 3.0, 4.0, 4.0});
  EXPECT_EQ(t.samples, 12);
  EXPECT_EQ(t.gen_tokens, 120);
  EXPECT_DOUBLE_EQ(t.gen_s, 0.8);  // the slowest engine
  EXPECT_EQ(t.engine_version, 8);
  EXPECT_DOUBLE_EQ(t.infer_busy, 1.0 + 3.0);  // busy time capped at the span
  EXPECT_DOUBLE_EQ(t.infer_span, 5.0);
  EXPECT_DOUBLE_EQ(t.train_idle, 1.5 + 1.5);
  EXPECT_EQ(t.trains, 1);  // the rank without micro-batches averages nothing
  EXPECT_DOUBLE_EQ(t.gap_max, 0.1);
  EXPECT_DOUBLE_EQ(t.clip, 0.5 * 30);  // token-weighted
  EXPECT_DOUBLE_EQ(t.entropy_w, 0.75 * 30);
  EXPECT_EQ(t.len_max, 18);  // the longest completion of any engine, and the shortest
  EXPECT_EQ(t.len_min, 2);
  EXPECT_EQ(t.zero_rounds, 8);  // ... but its rounds count
  EXPECT_EQ(t.store_ops, 7 + 7 + 3 + 3);
  EXPECT_EQ(t.lora_slot_reuses, 2);  // every engine's
  EXPECT_DOUBLE_EQ(t.elapsed, 9.0);
  EXPECT_DOUBLE_EQ(elapsed_of(reports[1]), 6.0);
}

TEST(RlReportsTest, MetricsFileRowUsesVerlNamesCountsAsIntegersAndReadsBack) {
  std::vector<RankReport> reports = {infer_report(8, 1.0, 5.0), train_report(2, 30, 0.1)};
  RlMetricsRow row = make_metrics_row(combine(reports, {5.0, 5.0}));
  row.m.step = 3;
  row.m.weight_version = 4;
  row.step_s = 5;
  const json j = metrics_file_row(row);
  EXPECT_EQ(j["step"], 3);
  const json& d = j.at("data");
  // verl's names where the quantity is the same (its file logger's {"step", "data"} form).
  EXPECT_DOUBLE_EQ(d.at("critic/score/mean").get<double>(), 0.5);
  EXPECT_DOUBLE_EQ(d.at("actor/pg_loss").get<double>(), 1.0);
  EXPECT_DOUBLE_EQ(d.at("actor/pg_clipfrac").get<double>(), 0.5);
  EXPECT_DOUBLE_EQ(d.at("response_length/mean").get<double>(), 10.0);  // 80 tokens, 8 samples
  EXPECT_EQ(d.at("response_length/max").get<int64_t>(), 18);
  EXPECT_EQ(d.at("response_length/min").get<int64_t>(), 2);
  EXPECT_DOUBLE_EQ(d.at("actor/entropy").get<double>(), 0.75);
  EXPECT_DOUBLE_EQ(d.at("crl/engine_idle_share").get<double>(), 0.8);
  EXPECT_DOUBLE_EQ(d.at("crl/zero_rounds_while_receiving_share").get<double>(), 0.5);
  EXPECT_EQ(d.at("crl/optimizer_updates").get<int64_t>(), 3);
  EXPECT_DOUBLE_EQ(d.at("timing_s/step").get<double>(), 5.0);
  for (const char* count : {"training/global_step", "perf/total_num_tokens", "crl/generated_tokens",
                            "crl/weight_version", "crl/staleness_max", "crl/groups_dropped",
                            "crl/store_ops", "crl/lora_slot_reuses", "crl/optimizer_updates",
                            "response_length/max", "response_length/min"}) {
    EXPECT_TRUE(d.at(count).is_number_integer()) << count;
  }
  EXPECT_TRUE(d.at("critic/score/mean").is_number_float());
  EXPECT_FALSE(d.contains(kHeldOutAccuracyName));  // only when the step evaluated
  EXPECT_EQ(d.size(), metric_names().size());
  for (const std::string& name : metric_names()) EXPECT_TRUE(d.contains(name)) << name;

  row.m.eval_accuracy = 0.75;
  const json e = json::parse(metrics_file_row(row).dump());
  EXPECT_DOUBLE_EQ(e["data"][kHeldOutAccuracyName].get<double>(), 0.75);
  const RlMetricsRow back = parse_metrics_file_row(e);
  EXPECT_EQ(back.m.step, 3);
  EXPECT_EQ(back.m.weight_version, 4);
  EXPECT_EQ(back.m.eval_accuracy, 0.75);
  EXPECT_DOUBLE_EQ(back.time_generate_s, row.time_generate_s);
  EXPECT_EQ(metrics_file_row(back).dump(), e.dump());
  json missing = e;
  missing["data"].erase("actor/grad_norm");
  ASSERT_THROWS_WITH(parse_metrics_file_row(missing), std::invalid_argument,
                     "step 3: no number 'actor/grad_norm'");
  json older = e;  // a file from before reward programs
  older["data"].erase("crl/reward_errors");
  EXPECT_EQ(parse_metrics_file_row(older).reward_errors, 0);
}

// A reward program's counts and extra metrics (--reward COMMAND) go through the reports, add up
// over the infer ranks as means over the completions that gave them, and read back from the row.
TEST(RlReportsTest, RewardProgramErrorsAndExtraMetricsTravelToTheRow) {
  InferReport a = infer_report(8, 1.0, 5.0);
  a.reward_requests = 4;
  a.reward_errors = 1;
  a.reward_extra["has_answer"] = {3.0, 6};
  const InferReport back = json(a).get<InferReport>();
  EXPECT_EQ(back.reward_requests, 4);
  EXPECT_EQ(back.reward_errors, 1);
  EXPECT_EQ(back.reward_extra.at("has_answer"), std::make_pair(3.0, int64_t{6}));
  json old = json(a);  // a report from a build before them
  old.erase("reward_requests");
  old.erase("reward_errors");
  old.erase("reward_extra");
  EXPECT_EQ(old.get<InferReport>().reward_errors, 0);
  InferReport b = a;
  b.reward_extra["has_answer"] = {1.0, 2};
  b.reward_extra["length"] = {10.0, 2};
  const StepTotals t = combine({a, b}, {1.0, 1.0});
  EXPECT_EQ(t.reward_requests, 8);
  EXPECT_EQ(t.reward_errors, 2);
  RlMetricsRow row = make_metrics_row(t);
  EXPECT_DOUBLE_EQ(row.reward_extra.at("has_answer"), 4.0 / 8);
  EXPECT_DOUBLE_EQ(row.reward_extra.at("length"), 5.0);
  const json j = json::parse(metrics_file_row(row).dump());
  EXPECT_TRUE(j["data"]["crl/reward_errors"].is_number_integer());
  EXPECT_EQ(j["data"]["crl/reward_errors"], 2);
  EXPECT_DOUBLE_EQ(j["data"]["reward_extra/has_answer/mean"].get<double>(), 0.5);
  const RlMetricsRow r = parse_metrics_file_row(j);
  EXPECT_EQ(r.reward_extra, row.reward_extra);
  EXPECT_EQ(r.reward_errors, 2);
}

// The share of groups GRPO cannot learn from (every sample scored the same: TRL's
// frac_reward_zero_std) is over every infer rank's groups, and reads back from the row.
TEST(RlReportsTest, TheShareOfGroupsWithoutSignalIsOverEveryInferRank) {
  InferReport a = infer_report(8, 1.0, 5.0);
  a.groups = 4;
  a.groups_without_signal = 3;
  InferReport b = infer_report(8, 1.0, 5.0);
  b.groups = 12;
  b.groups_without_signal = 1;
  const InferReport back = json(a).get<InferReport>();
  EXPECT_EQ(back.groups, 4);
  EXPECT_EQ(back.groups_without_signal, 3);
  const RlMetricsRow row = make_metrics_row(combine({a, json(b).get<InferReport>()}, {1.0, 1.0}));
  EXPECT_DOUBLE_EQ(row.frac_reward_zero_std, 4.0 / 16);
  const json j = json::parse(metrics_file_row(row).dump());
  EXPECT_DOUBLE_EQ(j["data"]["crl/frac_reward_zero_std"].get<double>(), 0.25);
  EXPECT_DOUBLE_EQ(parse_metrics_file_row(j).frac_reward_zero_std, 0.25);
  json older = j;  // a file from before the metric
  older["data"].erase("crl/frac_reward_zero_std");
  EXPECT_EQ(parse_metrics_file_row(older).frac_reward_zero_std, 0);
  EXPECT_EQ(make_metrics_row(combine({infer_report(8, 1.0, 5.0)}, {1.0})).frac_reward_zero_std,
            0);  // no groups: 0, not NaN
}

// The job's warning after its first 10 GRPO steps: half or more of the groups without signal
// and a sampled reward below 0.1, both.
TEST(RlReportsTest, LittleGrpoSignalNeedsMostGroupsFlatAndALowReward) {
  EXPECT_TRUE(little_grpo_signal(0.5, 0.099));
  EXPECT_TRUE(little_grpo_signal(1.0, 0.0));
  EXPECT_FALSE(little_grpo_signal(0.49, 0.0));    // most groups teach something
  EXPECT_FALSE(little_grpo_signal(1.0, 0.1));     // mostly right: the task is learned
  EXPECT_FALSE(little_grpo_signal(0.31, 0.224));  // the main job's first 10 steps
}

TEST(RlReportsTest, SftStepsTravelThroughTheCoordinatorToTheirRows) {
  sync::Coordinator coord(sync::host_store(0, std::chrono::milliseconds(5000)), "rl/");
  publish_sft_steps(coord, {{1, 3.5, 2.0, 1e-4}, {2, 3.25, 1.5, 2e-4}});
  auto soon = sync::Clock::now() + std::chrono::milliseconds(50);
  const auto got = wait_sft_steps(coord, soon);
  ASSERT_EQ(got.size(), 2u);
  const json row = sft_metrics_file_row(got[1]);
  EXPECT_EQ(row["step"], 2);
  EXPECT_EQ(row["phase"], "sft");
  EXPECT_DOUBLE_EQ(row["data"]["sft/loss"].get<double>(), 3.25);
  EXPECT_DOUBLE_EQ(row["data"]["sft/grad_norm"].get<double>(), 1.5);
  EXPECT_DOUBLE_EQ(row["data"]["sft/lr"].get<double>(), 2e-4);
}

TEST(RlReportsTest, ReportsAndEvaluationsTravelThroughTheCoordinator) {
  sync::Coordinator coord(sync::host_store(0, std::chrono::milliseconds(5000)), "rl/");
  publish_report(coord, 0, 1, train_report(1, 5, 0));
  publish_report(coord, 0, 0, infer_report(2, 0, 1));
  auto got = collect_reports(coord, 0, 2, std::chrono::milliseconds(1000));
  ASSERT_EQ(got.size(), 2u);
  EXPECT_EQ(std::get<InferReport>(got[0]).samples, 2);
  EXPECT_EQ(std::get<TrainReport>(got[1]).loss_tokens, 5);
  publish_eval(coord, EvalPoint::after_step(4), EvalReport{0.75, 3.0});
  auto soon = sync::Clock::now() + std::chrono::milliseconds(50);
  EXPECT_DOUBLE_EQ(wait_eval(coord, EvalPoint::after_step(4), soon).accuracy, 0.75);
  ASSERT_THROWS_WITH(wait_eval(coord, EvalPoint::sft(), soon), std::runtime_error, "SFT eval: ");
}

// Truncated IS is off by default at any staleness (the PPO clip binds against the behaviour
// log-probs; README "Asynchronous RL" has the sweep behind it); a cap is kept when given, and a
// negative one is refused naming the option.
TEST(RlOptionsTest, TisIsOffByDefaultAtAnyStalenessAndKeptWhenGiven) {
  for (int64_t k : {0, 1, 3}) {
    RlOptions o;
    o.max_staleness = k;
    o.validate();
    EXPECT_EQ(o.trainer.grpo.tis_cap, 0.0) << "K " << k;
  }
  RlOptions o;
  o.trainer.grpo.tis_cap = 1.5;
  o.validate();
  EXPECT_EQ(o.trainer.grpo.tis_cap, 1.5);
  o.trainer.grpo.tis_cap = -1;
  ASSERT_THROWS_WITH(o.validate(), std::invalid_argument, "tis_cap");
}

TEST(RlOptionsTest, ValidateRefusesTheBaselineSyncModes) {
  RlOptions o;
  o.sync.mode = sync::SyncMode::kPerTensor;
  ASSERT_THROWS_WITH(o.validate(), std::invalid_argument,
                     "--sync-mode per-tensor is a benchmark baseline");
  o.sync.mode = sync::SyncMode::kRaw;
  ASSERT_THROWS_WITH(o.validate(), std::invalid_argument,
                     "--sync-mode raw is a benchmark baseline");
}

TEST(RlOptionsTest, ValidateNamesTheFlags) {
  RlOptions o;
  o.trainer.schedule.lr = 1e-4;
  o.trainer.schedule.min_lr = 1e-3;
  ASSERT_THROWS_WITH(o.validate(), std::invalid_argument, "--min-lr 0.001 is above --lr 0.0001");
  o = RlOptions();
  o.trainer.micro_batch_tokens = o.max_tokens;
  ASSERT_THROWS_WITH(o.validate(), std::invalid_argument,
                     "--micro-batch-tokens must exceed --max-tokens");
}

TEST(VersionPlanTest, FreshJobSendsTheWarmUpAsVersionOneAndEachStepTheNext) {
  RlOptions o;
  o.steps = 6;
  o.eval_every = 4;
  VersionPlan v(o, 0, false);
  EXPECT_TRUE(v.runs_sft());
  EXPECT_EQ(v.first_grpo_version(), 1);
  EXPECT_EQ(v.version_at(0), 1);
  EXPECT_EQ(v.version_at(5), 6);
  EXPECT_EQ(v.final_version(), 7);
  for (int64_t s = 0; s < o.steps; ++s) EXPECT_EQ(v.step_of_version(v.version_at(s) + 1), s);
  EXPECT_LT(v.step_of_version(v.first_grpo_version()), 0);  // the warm-up's version
  std::vector<int64_t> evals;
  for (int64_t s = 0; s < o.steps; ++s) {
    if (v.evaluates_after(s)) evals.push_back(s);
  }
  EXPECT_EQ(evals, (std::vector<int64_t>{3, 5}));  // every 4th step and the last
}

TEST(VersionPlanTest, ResumedJobStartsAtTheCheckpointsVersionWithoutAWarmUp) {
  RlOptions o;
  o.steps = 10;
  VersionPlan v(o, 4, true);
  EXPECT_FALSE(v.runs_sft());
  EXPECT_EQ(v.first_grpo_version(), 4);
  EXPECT_EQ(v.version_at(4), 4);
  EXPECT_EQ(v.final_version(), 10);
  EXPECT_EQ(v.step_of_version(5), 4);
  o.sft_steps = 0;
  VersionPlan no_sft(o, 0, false);
  EXPECT_FALSE(no_sft.runs_sft());
  EXPECT_EQ(no_sft.version_at(0), 0);
}

}  // namespace
}  // namespace crl::trainer
