#include "trainer/metrics.h"

#include <gtest/gtest.h>

#include <fstream>

#include "tests/test_utils.h"

namespace crl::trainer {
namespace {

StepMetrics sample_metrics() {
  StepMetrics m;
  m.step = 12;
  m.reward_mean = 0.625;
  m.reward_std = 0.3;
  m.accuracy = 0.5;
  m.loss = -0.013;
  m.kl = 0.002;
  m.grad_norm = 0.84;
  m.lr = 3e-4;
  m.gen_tok_s = 950;
  m.train_tok_s = 4100;
  m.sync_ms = 1.25;
  m.weight_version = 12;
  m.logprob_gap_max = 2.4e-7;
  m.elapsed_s = 42;
  return m;
}

TEST(MetricsTest, ProgressLineShowsTheHeadlineNumbers) {
  StepMetrics m = sample_metrics();
  std::string line = format_progress(m);
  EXPECT_NE(line.find("step 12 grpo"), std::string::npos) << line;
  EXPECT_NE(line.find("reward 0.625±0.300 acc 0.500"), std::string::npos) << line;
  EXPECT_NE(line.find("gnorm 0.84"), std::string::npos) << line;
  EXPECT_NE(line.find("gen 950 tok/s train 4100 tok/s sync 1.2 ms"), std::string::npos) << line;
  EXPECT_NE(line.find("v12 gap 2.4e-07"), std::string::npos) << line;
  EXPECT_EQ(line.find("eval"), std::string::npos) << line;
  m.eval_accuracy = 0.75;
  EXPECT_NE(format_progress(m).find("eval 0.750"), std::string::npos);
}

TEST(MetricsTest, JsonlWriterWritesOneObjectPerStep) {
  test::TempDir dir;
  {
    MetricsWriter w(dir.file("m.jsonl"));
    StepMetrics m = sample_metrics();
    w.write(m);
    m.step = 13;
    m.eval_accuracy = 0.5;
    w.write(m);
  }
  std::ifstream in(dir.file("m.jsonl"));
  std::string a, b, c;
  std::getline(in, a);
  std::getline(in, b);
  EXPECT_FALSE(std::getline(in, c));
  auto ja = nlohmann::json::parse(a), jb = nlohmann::json::parse(b);
  EXPECT_EQ(ja["step"], 12);
  EXPECT_TRUE(ja["eval_accuracy"].is_null());
  EXPECT_EQ(jb["eval_accuracy"], 0.5);
  EXPECT_EQ(jb["weight_version"], 12);
  EXPECT_DOUBLE_EQ(ja["logprob_gap_max"].get<double>(), 2.4e-7);
  ASSERT_THROWS_WITH(MetricsWriter(dir.file("no/such/dir/m.jsonl")), std::runtime_error,
                     "cannot open");
}

}  // namespace
}  // namespace crl::trainer
