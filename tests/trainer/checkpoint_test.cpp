#include "trainer/checkpoint.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <random>

#include "engine/llm_engine.h"
#include "engine/model/safetensors.h"
#include "tests/engine/test_model.h"
#include "tests/test_utils.h"

namespace crl::trainer {
namespace {

// A seeded batch of SFT-style sequences over the test model's vocabulary.
std::vector<MicroBatch> batch(uint64_t seed) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int> tok(4, 500);
  std::vector<SampleGroup> groups;
  for (int i = 0; i < 3; ++i) {
    SampleGroup g;
    g.prompt_ids = {2, tok(rng), tok(rng)};
    for (int k = 0; k < 2; ++k) {
      Sample s;
      for (int j = 0; j < 5; ++j) {
        s.completion_ids.push_back(tok(rng));
        s.logprobs.push_back(-6.0f + 0.1f * j);
      }
      s.reward = k;
      g.samples.push_back(s);
    }
    groups.push_back(g);
  }
  compute_group_advantages(groups);
  return pack_micro_batches(groups, 24);
}

TrainerOptions options() {
  TrainerOptions o;
  o.schedule.lr = 2e-3;
  o.schedule.warmup_steps = 2;
  o.schedule.total_steps = 6;
  o.weight_decay = 0.05;
  return o;
}

TEST(CheckpointTest, ResumeContinuesExactlyAsIfNeverStoppedAndTheEngineLoadsIt) {
  const std::string model = test::test_model_dir();
  test::TempDir dir;
  const std::string ckpt = dir.file("ckpt");

  Trainer straight(model, options());
  for (uint64_t s = 0; s < 4; ++s) straight.train_step(batch(s), LossKind::kGrpo);

  {
    Trainer first(model, options());
    for (uint64_t s = 0; s < 2; ++s) first.train_step(batch(s), LossKind::kGrpo);
    save_checkpoint(first, ckpt, model + "/tokenizer.model", {{"cursor", 2}});
    save_checkpoint(first, ckpt, model + "/tokenizer.model", {{"cursor", 2}});  // replaces it
  }
  EXPECT_FALSE(std::filesystem::exists(ckpt + ".tmp." + std::to_string(::getpid())));
  Trainer resumed(ckpt, options());
  CheckpointState st = load_trainer_state(resumed, ckpt);
  EXPECT_EQ(st.step, 2);
  EXPECT_EQ(st.extra["cursor"], 2);
  EXPECT_EQ(resumed.step(), 2);
  for (uint64_t s = 2; s < 4; ++s) resumed.train_step(batch(s), LossKind::kGrpo);
  for (size_t i = 0; i < straight.master_weights().size(); ++i) {
    test::expect_tensor_near(resumed.master_weights()[i].second,
                             straight.master_weights()[i].second, 1e-6);
  }

  engine::EngineConfig cfg = test::test_engine_config();
  cfg.model_dir = ckpt;
  engine::LlmEngine eng(cfg);
  engine::GenerateRequest r;
  r.prompt = "Question: what is 3 plus 4? Answer:";
  r.params.max_tokens = 4;
  r.params.temperature = 0;
  auto out = eng.generate({r});
  EXPECT_EQ(out[0].outputs[0].token_ids.size() > 0, true);
  Trainer check(ckpt, options());
  test::expect_tensor_equal(eng.model().named_parameters()[1].second,
                            check.master_weights()[1].second.detach());
}

TEST(CheckpointTest, AFreshTrainerSavesAndResumesAtStepZero) {
  test::TempDir dir;
  Trainer t(test::test_model_dir(), options());
  save_checkpoint(t, dir.file("c0"), "");  // no tokenizer: token-id prompts only
  Trainer back(dir.file("c0"), options());
  EXPECT_EQ(load_trainer_state(back, dir.file("c0")).step, 0);
  EXPECT_EQ(back.step(), 0);
  test::expect_tensor_equal(back.master_weights()[0].second, t.master_weights()[0].second);
}

TEST(CheckpointTest, AMissingOrMisShapedOptimizerTensorIsAnErrorNamingIt) {
  test::TempDir dir;
  const std::string ckpt = dir.file("c");
  Trainer t(test::test_model_dir(), options());
  t.train_step(batch(0), LossKind::kGrpo);
  save_checkpoint(t, ckpt, "");
  const std::string path = ckpt + "/optimizer.safetensors";
  engine::NamedTensors opt;
  {
    auto file = engine::SafetensorsFile::open(path);
    for (const auto& [name, info] : file->tensors())
      opt.emplace_back(name, file->load(name, at::kFloat));
  }
  const std::string victim = opt[0].first;
  engine::NamedTensors missing(opt.begin() + 1, opt.end());
  engine::write_safetensors(path, missing);
  Trainer a(ckpt, options());
  ASSERT_THROWS_WITH(load_trainer_state(a, ckpt), std::invalid_argument,
                     "optimizer state has no tensor '" + victim + "'");
  opt[0].second = opt[0].second.reshape({-1}).narrow(0, 0, opt[0].second.numel() - 1).clone();
  engine::write_safetensors(path, opt);
  Trainer b(ckpt, options());
  ASSERT_THROWS_WITH(load_trainer_state(b, ckpt), std::invalid_argument,
                     "optimizer state tensor '" + victim + "' has shape");
}

// A save that fails midway (here: trainer_state.json cannot be written, after the weights and the
// optimizer state were) removes its partial directory and leaves the last good checkpoint.
TEST(CheckpointTest, AFailedSaveLeavesNoPartialDirectoryAndKeepsTheLastCheckpoint) {
  test::TempDir dir;
  const std::string ckpt = dir.file("step-1");
  Trainer t(test::test_model_dir(), options());
  save_checkpoint(t, ckpt, "", {{"cursor", 1}});
  t.train_step(batch(0), LossKind::kGrpo);
  // Not UTF-8: the state's JSON cannot be written.
  EXPECT_THROW(save_checkpoint(t, ckpt, "", {{"note", "\xff"}}), std::exception);
  std::vector<std::string> left;
  for (const auto& e : std::filesystem::directory_iterator(dir.path())) {
    left.push_back(e.path().filename().string());
  }
  EXPECT_EQ(left, std::vector<std::string>{"step-1"});
  EXPECT_EQ(read_checkpoint_state(ckpt).step, 0);
  EXPECT_EQ(read_checkpoint_state(ckpt).extra["cursor"], 1);
}

// A damaged or forged trainer_state.json (issue 49): a negative step was accepted and ended in NaN
// logits 15 s into the resumed job. It is refused naming the file and the field.
TEST(CheckpointTest, AStepOutsideItsRangeIsRefusedNamingTheFile) {
  test::TempDir dir;
  const std::string ckpt = dir.file("step-1");
  Trainer t(test::test_model_dir(), options());
  save_checkpoint(t, ckpt, "", {{"rows_drawn", 4}});
  for (const char* step : {"-5", "100000000000"}) {
    SCOPED_TRACE(step);
    std::ifstream in(ckpt + "/trainer_state.json");
    nlohmann::json j = nlohmann::json::parse(in);
    j["step"] = nlohmann::json::parse(step);
    std::ofstream(ckpt + "/trainer_state.json") << j.dump();
    ASSERT_THROWS_WITH(read_checkpoint_state(ckpt), std::runtime_error,
                       "trainer_state.json: \"step\" " + std::string(step) + " is outside [0, ");
  }
}

TEST(CheckpointTest, RefusesToReplaceADirectoryThatIsNotACheckpoint) {
  test::TempDir dir;
  std::filesystem::create_directories(dir.file("precious"));
  std::ofstream(dir.file("precious/notes.txt")) << "keep";
  Trainer t(test::test_model_dir(), options());
  ASSERT_THROWS_WITH(save_checkpoint(t, dir.file("precious"), ""), std::invalid_argument,
                     "refusing to replace it");
  EXPECT_TRUE(std::filesystem::exists(dir.file("precious/notes.txt")));
}

}  // namespace
}  // namespace crl::trainer
