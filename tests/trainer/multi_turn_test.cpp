// Multi-turn episodes on the real engine (issue 28): masks, caps, concurrency, environment
// failures, and trajectories packed as one training sample per segment.
#include "trainer/multi_turn.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <mutex>
#include <random>
#include <set>

#include "engine/engine_loop.h"
#include "engine/llm_engine.h"
#include "tests/engine/test_model.h"
#include "tests/test_utils.h"
#include "text/chat_template.h"
#include "text/tokenizer.h"
#include "trainer/calculator_env.h"
#include "trainer/make_environment.h"
#include "trainer/process_env.h"
#include "trainer/trainer.h"

namespace crl::trainer {
namespace {

using ojson = nlohmann::ordered_json;

std::string test_env(const std::string& flags = "") {
  return "python3 " + std::string(CRL_FIXTURES_DIR) + "/envs/test_env.py " + flags;
}

// The engine loop over the test model (deterministic: a seeded episode samples the same ids in
// any batch), its plain chat format and tokenizer.
struct Engine {
  std::shared_ptr<engine::EngineLoop> loop;
  text::ChatTemplate chat;
  const text::Tokenizer* tok = nullptr;
  std::vector<int32_t> prefix;

  explicit Engine(int64_t max_model_len = 0) {
    engine::EngineConfig cfg = test::test_engine_config();
    cfg.deterministic = true;
    cfg.max_model_len = max_model_len;  // 0: the model's
    cfg.max_seqs = 32;
    auto eng = std::make_unique<engine::LlmEngine>(cfg);
    chat = text::ChatTemplate::from_model_dir(cfg.model_dir);
    prefix = eng->prompt_prefix();
    tok = eng->tokenizer();
    loop = std::make_shared<engine::EngineLoop>(std::move(eng));
    loop->start();
    loop->wait_ready();
  }
  ~Engine() { loop->stop(); }
};

std::vector<EpisodeSpec> specs(int count, uint64_t seed = 1) {
  std::vector<EpisodeSpec> out;
  for (int i = 0; i < count; ++i) {
    EpisodeSpec s;
    s.id = "ep" + std::to_string(i);
    s.index = i;
    s.seed = seed + static_cast<uint64_t>(i);
    out.push_back(s);
  }
  return out;
}

// Options with the turn cap, the tokens per turn and the token cap.
MultiTurnOptions caps(int32_t max_turns, int32_t max_tokens_per_turn, int32_t max_episode_tokens) {
  MultiTurnOptions o;
  o.max_turns = max_turns;
  o.max_tokens_per_turn = max_tokens_per_turn;
  o.max_episode_tokens = max_episode_tokens;
  return o;
}

// Runs of equal mask values: (value, length) in order.
std::vector<std::pair<int, size_t>> runs(const std::vector<uint8_t>& mask) {
  std::vector<std::pair<int, size_t>> out;
  for (uint8_t m : mask) {
    if (out.empty() || out.back().first != m) out.push_back({m, 0});
    ++out.back().second;
  }
  return out;
}

void expect_consistent(const Episode& ep) {
  ASSERT_EQ(ep.ids.size(), ep.mask.size());
  ASSERT_EQ(ep.ids.size(), ep.logprobs.size());
  ASSERT_EQ(ep.ids.size(), ep.versions.size());
  for (size_t j = 0; j < ep.ids.size(); ++j) {
    if (ep.mask[j]) {
      EXPECT_EQ(ep.versions[j], 0);
      EXPECT_LE(ep.logprobs[j], 0.0f);
    } else {
      EXPECT_EQ(ep.versions[j], -1);
      EXPECT_EQ(ep.logprobs[j], 0.0f);
    }
  }
}

TEST(MultiTurnTest, EpisodesRunToTheTurnCapWithEnvironmentTextMaskedOut) {
  Engine e;
  ProcessEnv env(test_env("--never-done"), EnvOptions{});
  MultiTurnOptions o = caps(3, 6, 400);
  EpisodeRunner runner(*e.loop, env, e.chat, *e.tok, e.prefix, text::ToolCallFormat::kHermes, o);
  std::map<size_t, Episode> got;
  int between = 0;
  runner.run(
      specs(6), [&](size_t i, Episode& ep) { got[i] = ep; }, [&] { ++between; });
  ASSERT_EQ(got.size(), 6u);
  EXPECT_GT(between, 0);
  for (auto& [i, ep] : got) {
    SCOPED_TRACE("episode " + std::to_string(i));
    expect_consistent(ep);
    EXPECT_EQ(ep.end, "turn_cap");
    EXPECT_EQ(ep.turns, 3);
    EXPECT_EQ(ep.segments, std::vector<size_t>{0});  // the plain format preserves prefixes
    // prompt, turn, "go on", turn, "go on", turn: the model's turns are the 1-runs.
    auto r = runs(ep.mask);
    ASSERT_EQ(r.size(), 6u);
    for (size_t k = 1; k < r.size(); k += 2) EXPECT_LE(r[k].second, 6u);
    // The environment's text is the rendered follow-up, never the model's.
    const size_t env_begin = r[0].second + r[1].second;
    std::vector<int32_t> env_ids(ep.ids.begin() + env_begin,
                                 ep.ids.begin() + env_begin + r[2].second);
    EXPECT_NE(e.tok->decode(env_ids).find("User: go on"), std::string::npos)
        << e.tok->decode(env_ids);
    EXPECT_EQ(ep.env_tokens(), static_cast<int64_t>(r[2].second + r[4].second));
    EXPECT_EQ(ep.model_tokens(), static_cast<int64_t>(r[1].second + r[3].second + r[5].second));
  }
  // The same seeded episode alone samples the same ids as among five others.
  std::vector<EpisodeSpec> one = {specs(6)[4]};
  runner.run(one, [&](size_t, Episode& ep) { EXPECT_EQ(ep.ids, got[4].ids); });
}

// Counts the episodes open at once (reset until done, an error or close) and logs the order of
// resets and ends.
class CountingEnv : public Environment {
 public:
  explicit CountingEnv(std::unique_ptr<Environment> inner) : inner_(std::move(inner)) {}
  std::string name() const override { return inner_->name(); }
  EnvReply reset(const std::string& id, EnvSplit split, int64_t index,
                 const ojson& task = nullptr) override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      live_.insert(id);
      max_open = std::max(max_open, ++open);
      log.push_back("reset " + id);
    }
    return inner_->reset(id, split, index, task);
  }
  EnvReply step(const std::string& id, const ojson& assistant) override {
    EnvReply r = inner_->step(id, assistant);
    if (r.done || !r.error.empty()) ended(id);
    return r;
  }
  void close(const std::string& id) override {
    ended(id);
    inner_->close(id);
  }
  int open = 0, max_open = 0;
  std::vector<std::string> log;

 private:
  // Once per episode: a step still in flight when the runner closes its episode may come back
  // with an error after the close (counted twice, `open` went to -1 under load).
  void ended(const std::string& id) {
    std::lock_guard<std::mutex> lock(mu_);
    if (live_.erase(id) == 0) return;
    --open;
    log.push_back("end " + id);
  }
  std::unique_ptr<Environment> inner_;
  std::mutex mu_;
  std::set<std::string> live_;
};

// --concurrency (environment instances): at most that many episodes in flight; async starts one as
// one ends, the turn-synchronous baseline plays waves. The episodes sample what they sample
// without a cap (a seeded episode is the same in any batch).
TEST(MultiTurnTest, TheInFlightCapBoundsOpenEpisodesAndWavesAreLockstep) {
  Engine e;
  MultiTurnOptions o;
  o.max_turns = 2;
  o.max_tokens_per_turn = 5;
  std::map<size_t, std::vector<int32_t>> free_ids;
  {
    CountingEnv env(make_environment(test_env("--never-done"), EnvOptions{}));
    EpisodeRunner runner(*e.loop, env, e.chat, *e.tok, e.prefix, text::ToolCallFormat::kHermes, o);
    runner.run(specs(5), [&](size_t i, Episode& ep) { free_ids[i] = ep.ids; });
    EXPECT_EQ(env.max_open, 5);
  }
  for (bool sync : {false, true}) {
    SCOPED_TRACE(sync ? "turn-synchronous" : "async");
    CountingEnv env(make_environment(test_env("--never-done"), EnvOptions{}));
    MultiTurnOptions c = o;
    c.max_in_flight = 2;
    c.turn_synchronous = sync;
    EpisodeRunner runner(*e.loop, env, e.chat, *e.tok, e.prefix, text::ToolCallFormat::kHermes, c);
    size_t done = 0;
    runner.run(specs(5), [&](size_t i, Episode& ep) {
      EXPECT_EQ(ep.ids, free_ids[i]) << "episode " << i;
      EXPECT_EQ(ep.end, "turn_cap");
      ++done;
    });
    EXPECT_EQ(done, 5u);
    EXPECT_EQ(env.max_open, 2);
    EXPECT_EQ(env.open, 0);
    auto at = [&](const std::string& line) {
      return std::find(env.log.begin(), env.log.end(), line) - env.log.begin();
    };
    if (sync) {  // waves {0, 1}, {2, 3}, {4}: a wave starts once the last has ended
      EXPECT_GT(at("reset ep2"), std::max(at("end ep0"), at("end ep1")));
      EXPECT_GT(at("reset ep4"), std::max(at("end ep2"), at("end ep3")));
    } else {
      EXPECT_GT(at("reset ep2"), std::min(at("end ep0"), at("end ep1")));
    }
  }
}

// Replies "boom" to every step: a message the template below refuses to render.
class RejectedReplyEnv : public Environment {
 public:
  std::string name() const override { return "rejected-reply"; }
  EnvReply reset(const std::string&, EnvSplit, int64_t, const ojson& = nullptr) override {
    return reply("hi");
  }
  EnvReply step(const std::string&, const ojson&) override { return reply("boom"); }

 private:
  static EnvReply reply(const char* content) {
    EnvReply r;
    r.messages = ojson::array({{{"role", "user"}, {"content", content}}});
    return r;
  }
};

// An episode the runner ends itself (the environment's reply does not render) is closed on the
// environment, as a capped one is: an external program drops its state and a pool its count of
// the process's open episodes (which otherwise stayed up and steered every later episode away).
TEST(MultiTurnTest, AnEpisodeTheRunnerEndsIsClosedOnTheEnvironment) {
  Engine e;
  const text::ChatTemplate strict = text::ChatTemplate::from_jinja(
      "{% for m in messages %}{% if m.content == 'boom' %}{{ raise_exception('no boom') }}{% endif "
      "%}"
      "{{ m.role }}: {{ m.content }}\n{% endfor %}{% if add_generation_prompt %}assistant:{% endif "
      "%}");
  CountingEnv env(std::make_unique<RejectedReplyEnv>());
  EpisodeRunner runner(*e.loop, env, strict, *e.tok, e.prefix, text::ToolCallFormat::kHermes,
                       caps(3, 4, 400));
  size_t done = 0;
  runner.run(specs(3), [&](size_t, Episode& ep) {
    EXPECT_EQ(ep.end, "env_error");
    EXPECT_NE(ep.env_error.find("does not render"), std::string::npos) << ep.env_error;
    EXPECT_EQ(ep.turns, 1);
    ++done;
  });
  EXPECT_EQ(done, 3u);
  EXPECT_EQ(env.open, 0);
}

// A run that fails while episodes wait on slow tool steps (here the caller's hook throws after
// 300 ms; a failed engine request or a turn past the timeout does the same) closes every live
// episode on the environment and waits for the calls in flight together, within a bound, before
// the error goes on (issue 52): 6 steps of 1 s in 6 processes end in about 1 s.
TEST(MultiTurnTest, AFailedRunClosesItsLiveEpisodesAndAwaitsTheirCallsTogether) {
  Engine e;
  EnvOptions eo;
  eo.processes = 6;
  CountingEnv env(make_environment(test_env("--never-done --step-sleep-ms 1000"), eo));
  EpisodeRunner runner(*e.loop, env, e.chat, *e.tok, e.prefix, text::ToolCallFormat::kHermes,
                       caps(4, 4, 400));
  const auto t0 = std::chrono::steady_clock::now();
  auto hook = [&] {
    if (std::chrono::steady_clock::now() - t0 > std::chrono::milliseconds(300))
      throw std::runtime_error("the caller failed");
  };
  try {
    runner.run(
        specs(6), [&](size_t, Episode&) {}, hook);
    FAIL() << "expected the hook's error";
  } catch (const std::runtime_error& err) {
    EXPECT_STREQ(err.what(), "the caller failed");  // the error itself goes on
  }
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(4));
  EXPECT_EQ(env.open, 0) << "every live episode closed";
  for (int i = 0; i < 6; ++i) {
    EXPECT_NE(std::find(env.log.begin(), env.log.end(), "end ep" + std::to_string(i)),
              env.log.end())
        << "ep" << i;
  }
}

TEST(MultiTurnTest, TheTokenCapEndsAnEpisode) {
  Engine e;
  ProcessEnv env(test_env("--never-done"), EnvOptions{});
  MultiTurnOptions o = caps(50, 8, 60);
  EpisodeRunner runner(*e.loop, env, e.chat, *e.tok, e.prefix, text::ToolCallFormat::kHermes, o);
  runner.run(specs(3), [&](size_t, Episode& ep) {
    expect_consistent(ep);
    EXPECT_EQ(ep.end, "token_cap");
    EXPECT_LT(ep.turns, 50);
    // The cap bounds what the model samples; one environment reply may pass it, and is cut off
    // the training sample (trailing mask-0 ids carry no loss).
    auto samples = episode_samples(ep, 1.0);
    ASSERT_EQ(samples.size(), 1u);
    EXPECT_LE(samples[0].prompt_ids.size() + samples[0].completion_ids.size(), 60u);
    EXPECT_EQ(samples[0].loss_mask.back(), 1);
  });
}

TEST(MultiTurnTest, TheEnginesContextCapsAnEpisodeAsTheTokenCapDoes) {
  // --max-episode-tokens past the engine's context: a late turn gets only the room the context
  // has left, and an episode whose environment text fills the context ends with the token cap,
  // instead of a request the engine refuses (which failed the whole rollout).
  const int64_t context = 48;
  Engine e(context);
  ASSERT_EQ(e.loop->engine().max_model_len(), context);
  ProcessEnv env(test_env("--never-done"), EnvOptions{});
  MultiTurnOptions o = caps(50, 8, 1000);
  EpisodeRunner runner(*e.loop, env, e.chat, *e.tok, e.prefix, text::ToolCallFormat::kHermes, o);
  int ended = 0;
  runner.run(specs(3), [&](size_t, Episode& ep) {
    expect_consistent(ep);
    EXPECT_EQ(ep.end, "token_cap");
    EXPECT_GE(ep.turns, 1);
    EXPECT_LE(ep.model_tokens(), context);
    ++ended;
  });
  EXPECT_EQ(ended, 3);
}

TEST(MultiTurnTest, ADyingEnvironmentEndsItsEpisodesWithANamedErrorAndTheJobGoesOn) {
  Engine e;
  // The four resets are queued at once: the third kills the process. Its episode and the two
  // reset before it (their state died with the process) end with env_died; the fourth is reset
  // on a new process and plays to its end.
  ProcessEnv env(test_env("--die-at-request 3"), EnvOptions{});
  MultiTurnOptions o;
  o.max_turns = 2;
  o.max_tokens_per_turn = 4;
  EpisodeRunner runner(*e.loop, env, e.chat, *e.tok, e.prefix, text::ToolCallFormat::kHermes, o);
  int errors = 0, answered = 0;
  runner.run(specs(4), [&](size_t, Episode& ep) {
    expect_consistent(ep);
    if (ep.end == "env_error") {
      ++errors;
      EXPECT_EQ(env_error_kind(ep.env_error), "env_died") << ep.env_error;
      EXPECT_EQ(ep.reward, 0.0);
    } else {
      ++answered;
    }
  });
  EXPECT_EQ(errors, 3);
  EXPECT_EQ(answered, 1);
  EXPECT_EQ(env.starts(), 2);
}

TEST(MultiTurnTest, ALyingEnvironmentEndsItsEpisodesAndTheRestFinish) {
  Engine e;
  ProcessEnv env(test_env("--lie-every 3"), EnvOptions{});
  MultiTurnOptions o;
  o.max_turns = 2;
  o.max_tokens_per_turn = 4;
  EpisodeRunner runner(*e.loop, env, e.chat, *e.tok, e.prefix, text::ToolCallFormat::kHermes, o);
  int malformed = 0, finished = 0;
  runner.run(specs(9), [&](size_t, Episode& ep) {
    ++finished;
    if (ep.end == "env_error") {
      EXPECT_EQ(env_error_kind(ep.env_error), "env_malformed") << ep.env_error;
      ++malformed;
    }
  });
  EXPECT_EQ(finished, 9);
  EXPECT_GE(malformed, 3);
}

TEST(MultiTurnTest, EpisodeSamplesAreOnePerSegmentWithToolTokensWeightZero) {
  Episode ep;
  // Segment 0: prompt 3, model 2, tool 2, model 1, tool 1 (trailing); segment 1: prompt 2, model 2.
  ep.ids = {1, 2, 3, 10, 11, 20, 21, 12, 22, 4, 5, 13, 14};
  ep.mask = {0, 0, 0, 1, 1, 0, 0, 1, 0, 0, 0, 1, 1};
  ep.logprobs = {0, 0, 0, -.5f, -.25f, 0, 0, -1, 0, 0, 0, -2, -3};
  ep.versions = {-1, -1, -1, 4, 4, -1, -1, 5, -1, -1, -1, 5, 5};
  ep.segments = {0, 9};
  ep.reward = 1;
  auto s = episode_samples(ep, 0.75);
  ASSERT_EQ(s.size(), 2u);
  EXPECT_EQ(s[0].prompt_ids, (std::vector<int32_t>{1, 2, 3}));
  EXPECT_EQ(s[0].completion_ids, (std::vector<int32_t>{10, 11, 20, 21, 12}));
  EXPECT_EQ(s[0].loss_mask, (std::vector<uint8_t>{1, 1, 0, 0, 1}));
  EXPECT_EQ(s[1].prompt_ids, (std::vector<int32_t>{4, 5}));
  EXPECT_EQ(s[1].completion_ids, (std::vector<int32_t>{13, 14}));
  SampleGroup g;
  g.samples = s;
  auto mbs = pack_micro_batches({g}, 64, 5);
  ASSERT_EQ(mbs.size(), 1u);
  const MicroBatch& mb = mbs[0];
  EXPECT_EQ(mb.seq_lens, (std::vector<int64_t>{8, 4}));
  EXPECT_EQ(mb.num_loss_tokens(), 5);
  at::Tensor expect_mask = at::tensor({0, 0, 0, 1, 1, 0, 0, 1, 0, 0, 1, 1}, at::kFloat);
  EXPECT_TRUE(at::equal(mb.loss_mask, expect_mask));
  // Off the mask: no log-prob, no advantage, no version.
  EXPECT_EQ(mb.advantages[5].item<float>(), 0.0f);
  EXPECT_EQ(mb.advantages[7].item<float>(), 0.75f);
  EXPECT_EQ(mb.versions[6].item<int64_t>(), -1);
  EXPECT_EQ(mb.versions[7].item<int64_t>(), 5);
  EXPECT_EQ(mb.old_logprobs[7].item<float>(), -1.0f);
  // A mask of the wrong length is refused.
  g.samples[0].loss_mask.pop_back();
  EXPECT_THROW(pack_micro_batches({g}, 64), std::invalid_argument);
}

// One sample per trajectory against per-turn packing (each turn a sample of its whole history and
// its reply): the same loss and gradient over the same model tokens, from far fewer trainer tokens.
TEST(MultiTurnTest, OneSamplePerTrajectoryHasTheLossOfPerTurnPackingFromFewerTokens) {
  engine::EngineConfig cfg = test::test_engine_config();
  std::mt19937 rng(8);
  std::uniform_int_distribution<int32_t> id(4, 400);
  Episode ep;
  ep.segments = {0};
  auto add = [&](int n, bool model) {
    for (int k = 0; k < n; ++k) {
      ep.ids.push_back(id(rng));
      ep.mask.push_back(model);
      ep.logprobs.push_back(model ? -1.5f - 0.01f * k : 0.0f);
      ep.versions.push_back(model ? 0 : -1);
    }
  };
  const int turns = 10;
  add(12, false);  // the opening prompt
  for (int t = 0; t < turns; ++t) {
    add(6, true);   // the model's turn
    add(5, false);  // the tool's answer and the template's text
  }
  auto trajectory = episode_samples(ep, 0.5);
  ASSERT_EQ(trajectory.size(), 1u);
  std::vector<Sample> per_turn;
  int64_t trajectory_tokens =
      static_cast<int64_t>(trajectory[0].prompt_ids.size() + trajectory[0].completion_ids.size());
  int64_t per_turn_tokens = 0;
  for (size_t j = 0;
       j < ep.ids.size();) {  // each run of model ids: a sample of all before it and the run
    if (!ep.mask[j]) {
      ++j;
      continue;
    }
    size_t e = j;
    while (e < ep.ids.size() && ep.mask[e]) ++e;
    Sample s;
    s.prompt_ids.assign(ep.ids.begin(), ep.ids.begin() + j);
    s.completion_ids.assign(ep.ids.begin() + j, ep.ids.begin() + e);
    s.logprobs.assign(ep.logprobs.begin() + j, ep.logprobs.begin() + e);
    s.versions.assign(e - j, 0);
    s.advantage = 0.5;
    per_turn_tokens += static_cast<int64_t>(e);
    per_turn.push_back(std::move(s));
    j = e;
  }
  ASSERT_EQ(per_turn.size(), static_cast<size_t>(turns));
  auto group = [](std::vector<Sample> samples) {
    SampleGroup g;
    g.samples = std::move(samples);
    return g;
  };
  Trainer a(cfg.model_dir, TrainerOptions{}), b(cfg.model_dir, TrainerOptions{});
  const StepStats sa =
      a.train_step(pack_micro_batches({group(trajectory)}, 1 << 14), LossKind::kGrpo);
  const StepStats sb =
      b.train_step(pack_micro_batches({group(per_turn)}, 1 << 14), LossKind::kGrpo);
  EXPECT_EQ(sa.loss.num_tokens, 6 * turns);
  EXPECT_EQ(sb.loss.num_tokens, 6 * turns);
  EXPECT_NEAR(sa.loss.loss, sb.loss.loss, 1e-6 * std::max(1.0, std::abs(sb.loss.loss)));
  EXPECT_NEAR(sa.grad_norm, sb.grad_norm, 1e-5 * sb.grad_norm);
  EXPECT_GT(sa.grad_norm, 0.0);
  // 117 ids against the ten histories with their replies, 675 (5.8x: about (T + 1) / 2 when the
  // opening prompt is short, up to T when it dominates).
  EXPECT_EQ(trajectory_tokens, 12 + 11 * turns - 5);  // the trailing tool text carries no loss
  EXPECT_EQ(per_turn_tokens, 12 * turns + 11 * (turns * (turns + 1) / 2) - 5 * turns);
}

TEST(MultiTurnTest, EpisodesTheEnvironmentFailedAreNeitherTrainedOnNorInTheirGroupsAdvantages) {
  // Four episodes of one prompt: rewards 1, 0, 1 and an environment error (reward 0). The failed
  // one gives no sample, and the advantages are those of the group {1, 0, 1}, as if it had not run.
  auto episode = [](double reward, const std::string& end) {
    Episode ep;
    ep.ids = {5, 6, 7, 8};
    ep.mask = {0, 0, 1, 1};
    ep.logprobs = {0, 0, -0.5f, -0.25f};
    ep.versions = {-1, -1, 0, 0};
    ep.segments = {0};
    ep.reward = reward;
    ep.end = end;
    return ep;
  };
  const std::vector<Episode> group = {episode(1, "answer"), episode(0, "answer"),
                                      episode(1, "answer"), episode(0, "env_error")};
  const std::vector<Sample> got = group_episode_samples(group);
  ASSERT_EQ(got.size(), 3u);
  std::vector<SampleGroup> want(1);
  for (double r : {1.0, 0.0, 1.0}) {
    Sample s;
    s.reward = r;
    want[0].samples.push_back(s);
  }
  compute_group_advantages(want);
  for (size_t k = 0; k < got.size(); ++k) {
    EXPECT_DOUBLE_EQ(got[k].advantage, want[0].samples[k].advantage) << k;
    EXPECT_EQ(got[k].completion_ids, (std::vector<int32_t>{7, 8}));
  }
  EXPECT_GT(got[0].advantage, 0);
  EXPECT_LT(got[1].advantage, 0);
  // A group the environment failed entirely trains on nothing.
  EXPECT_TRUE(group_episode_samples({episode(0, "env_error"), episode(0, "env_error")}).empty());
}

TEST(MultiTurnTest, ADemonstrationIsTheModelTurnsAsTargetsAndTheRestMasked) {
  engine::EngineConfig cfg = test::test_engine_config();
  text::Tokenizer tok(cfg.model_dir);
  const text::ChatTemplate chat = text::ChatTemplate::from_model_dir(cfg.model_dir);
  CalculatorEnv env(EnvOptions{});
  ojson demo = env.demonstration(EnvSplit::kTrain, 3);
  const std::vector<int64_t> ab = env.operands(EnvSplit::kTrain, 3);
  const int64_t a = ab[0], b = ab[1];
  const int32_t eos = 2;
  Sample s = demonstration_sample(demo["messages"], demo["tools"], chat, tok, tok.special_prefix(),
                                  text::ToolCallFormat::kHermes, eos);
  auto r = runs(s.loss_mask);
  ASSERT_EQ(r.size(), 3u);  // call, tool result, answer
  std::vector<int32_t> call(s.completion_ids.begin(), s.completion_ids.begin() + r[0].second);
  auto parsed = text::parse_tool_calls(text::ToolCallFormat::kHermes, tok.decode(call));
  ASSERT_EQ(parsed.calls.size(), 1u) << tok.decode(call);
  EXPECT_EQ(parsed.calls[0].arguments["a"], a);
  EXPECT_EQ(s.completion_ids.back(), eos);
  std::vector<int32_t> answer(s.completion_ids.end() - r[2].second, s.completion_ids.end() - 1);
  EXPECT_EQ(tok.decode(answer), std::to_string(a + b));
  std::vector<int32_t> tool(s.completion_ids.begin() + r[0].second,
                            s.completion_ids.begin() + r[0].second + r[1].second);
  EXPECT_NE(tok.decode(tool).find(std::to_string(a + b)), std::string::npos) << tok.decode(tool);
  // A malformed call (flat, without "function") or a message without a string role: named errors.
  ojson flat = demo["messages"];
  flat[1]["tool_calls"][0] = {{"name", "add"}, {"arguments", {{"a", a}, {"b", b}}}};
  ASSERT_THROWS_WITH(demonstration_sample(flat, demo["tools"], chat, tok, tok.special_prefix(),
                                          text::ToolCallFormat::kHermes, eos),
                     std::invalid_argument, "demonstration message 1: a tool call must be");
  ojson roleless = demo["messages"];
  roleless[0]["role"] = 7;
  ASSERT_THROWS_WITH(demonstration_sample(roleless, demo["tools"], chat, tok, tok.special_prefix(),
                                          text::ToolCallFormat::kHermes, eos),
                     std::invalid_argument,
                     "demonstration message 0 is not an object with a string");
}

}  // namespace
}  // namespace crl::trainer
