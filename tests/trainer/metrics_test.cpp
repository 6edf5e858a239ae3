#include "trainer/metrics.h"

#include <gtest/gtest.h>

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
  m.response_length_mean = 4.92;
  m.elapsed_s = 42;
  return m;
}

TEST(MetricsTest, FullLineShowsEveryHeadlineNumber) {
  StepMetrics m = sample_metrics();
  std::string line = format_progress(m);
  EXPECT_NE(line.find("step 12 grpo"), std::string::npos) << line;
  EXPECT_NE(line.find("reward 0.625±0.300 acc 0.500 len 4.9"), std::string::npos) << line;
  EXPECT_NE(line.find("gnorm 0.84"), std::string::npos) << line;
  EXPECT_NE(line.find("gen 950 tok/s train 4100 tok/s sync 1.2 ms"), std::string::npos) << line;
  EXPECT_NE(line.find("v12 gap 2.4e-07"), std::string::npos) << line;
  m.eval_accuracy = 0.75;  // the held-out eval has its own line
  EXPECT_EQ(format_progress(m).find("eval"), std::string::npos);
}

// Columns as a terminal counts them: "±" and other UTF-8 sequences are one each.
size_t columns(const std::string& s) {
  size_t n = 0;
  for (unsigned char c : s) n += (c & 0xC0) != 0x80;
  return n;
}

TEST(MetricsTest, StepLineFitsATerminalAndCountsDown) {
  StepMetrics m = sample_metrics();
  StepLineContext c;
  c.total_steps = 90;
  c.seconds_per_step = 0.23;
  EXPECT_EQ(
      format_step_line(m, c),
      "step 12/90 | reward 0.625 | loss -0.013 gnorm 0.84 | len 4.9 gap 2.4e-07 | 0.23 s/step "
      "ETA 0:18");
  // The widest a real run makes it: 4-digit steps, KL on, long completions, slow steps, a long ETA.
  m.step = 1000;
  m.loss = -0.000123456;
  m.kl = 0.00123;
  m.grad_norm = 1234.5;
  m.response_length_mean = 8191.7;
  m.logprob_gap_max = 12.5;
  c.total_steps = 9999;
  c.seconds_per_step = 987.6;
  c.kl = true;
  const std::string wide = format_step_line(m, c);
  EXPECT_LE(columns(wide), 120u) << wide;
  EXPECT_NE(wide.find("kl 1.2e-03"), std::string::npos) << wide;
  EXPECT_NE(wide.find("gnorm 1234 | len 8192 "), std::string::npos) << wide;
  EXPECT_NE(wide.find("988 s/step ETA 2468:43:32"), std::string::npos) << wide;
  for (const std::string& line : {step_line_legend().substr(0, step_line_legend().find('\n')),
                                  step_line_legend().substr(step_line_legend().find('\n') + 1)}) {
    EXPECT_LE(columns(line), 121u) << line;  // + its newline
  }
}

TEST(MetricsTest, DurationsReadAsAClock) {
  EXPECT_EQ(format_duration(-3), "0:00");
  EXPECT_EQ(format_duration(17.6), "0:18");
  EXPECT_EQ(format_duration(725), "12:05");
  EXPECT_EQ(format_duration(3723), "1:02:03");
}

}  // namespace
}  // namespace crl::trainer
