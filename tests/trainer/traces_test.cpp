#include "trainer/traces.h"

#include <gtest/gtest.h>

#include <fstream>
#include <iterator>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "engine/engine_config.h"
#include "tests/engine/test_model.h"
#include "tests/test_utils.h"
#include "trainer/rollout_batcher.h"

namespace crl::trainer {
namespace {

std::vector<nlohmann::json> read_lines(const std::string& path) {
  std::vector<nlohmann::json> out;
  std::ifstream in(path);
  for (std::string line; std::getline(in, line);) out.push_back(nlohmann::json::parse(line));
  return out;
}

std::string text_of(const std::string& path) {
  std::ifstream in(path);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

SampleGroup group_of(int64_t prompt_index, const text::Tokenizer& tok) {
  SampleGroup g;
  g.prompt_index = prompt_index;
  g.prompt_ids = tok.encode("Copy: red tree. Answer:");
  for (double reward : {1.0, 0.0}) {
    Sample s;
    s.completion_ids = tok.encode(reward > 0 ? " red tree" : " tree red");
    s.logprobs.assign(s.completion_ids.size(), -0.5f);
    s.versions.assign(s.completion_ids.size(), 3);
    s.reward = reward;
    g.samples.push_back(s);
  }
  return g;
}

// The batcher counts the groups it keeps and, of them, those whose samples all scored the same
// (their advantages all 0: nothing for GRPO to learn); a dropped group counts in neither.
TEST(TracesTest, TheBatcherCountsTheGroupsWithoutSignal) {
  text::Tokenizer tok(test::test_model_dir());
  RolloutBatcher b(
      /*oldest_allowed=*/3, /*micro_batch_tokens=*/1 << 20,
      [](std::vector<SampleGroup>& g) {
        g.clear();
        return int64_t{0};
      },
      [] {});
  EXPECT_TRUE(b.add(group_of(1, tok), RolloutBatcher::Advantages::kGroup));  // rewards 1, 0
  SampleGroup same = group_of(2, tok);
  same.samples[1].reward = 1.0;
  EXPECT_TRUE(b.add(same, RolloutBatcher::Advantages::kGroup));
  SampleGroup given = group_of(3, tok);  // multi-turn: the advantages come with the samples
  for (Sample& s : given.samples) s.advantage = 0;
  EXPECT_TRUE(b.add(given, RolloutBatcher::Advantages::kAsGiven));
  SampleGroup stale = group_of(4, tok);
  stale.samples[0].versions[0] = 2;
  stale.samples[1].reward = 1.0;
  EXPECT_FALSE(b.add(stale, RolloutBatcher::Advantages::kGroup));
  b.finish();
  EXPECT_EQ(b.groups_kept(), 3);
  EXPECT_EQ(b.groups_without_signal(), 2);
  EXPECT_EQ(b.groups_dropped(), 1);
}

// Every sample of a traced group is one line with its text, ids, reward, the advantage it
// trained with and its per-token log-probs and versions; a dropped group says so.
TEST(TracesTest, TheBatchersGroupsBecomeOneLinePerSampleWithTheirAdvantages) {
  test::TempDir dir;
  text::Tokenizer tok(test::test_model_dir());
  TraceWriter w({dir.file("t.jsonl"), 1.0, 1}, tok);
  int64_t sends = 0;
  RolloutBatcher b(
      /*oldest_allowed=*/3, /*micro_batch_tokens=*/1 << 20,
      [&](std::vector<SampleGroup>& g) {
        ++sends;
        g.clear();
        return int64_t{0};
      },
      [] {});
  b.set_observer([&](const SampleGroup& g, bool dropped) { w.write(7, 1, g, dropped); });
  EXPECT_TRUE(b.add(group_of(11, tok), RolloutBatcher::Advantages::kGroup));
  SampleGroup stale = group_of(12, tok);
  stale.samples[0].versions[0] = 2;  // older than the step allows
  EXPECT_FALSE(b.add(stale, RolloutBatcher::Advantages::kGroup));
  b.finish();
  const auto lines = read_lines(dir.file("t.jsonl"));
  ASSERT_EQ(lines.size(), 4u);
  EXPECT_EQ(w.lines_written(), 4);
  const nlohmann::json& a = lines[0];
  EXPECT_EQ(a["step"], 7);
  EXPECT_EQ(a["infer_rank"], 1);
  EXPECT_EQ(a["prompt_index"], 11);
  EXPECT_EQ(a["group"], 0);
  EXPECT_EQ(lines[3]["group"], 1);
  EXPECT_EQ(a["sample"], 0);
  EXPECT_EQ(a["dropped"], false);
  EXPECT_EQ(a["prompt"], tok.decode(tok.encode("Copy: red tree. Answer:"), false));
  EXPECT_EQ(a["completion"], tok.decode(tok.encode(" red tree"), false));
  EXPECT_EQ(a["reward"], 1.0);
  EXPECT_GT(a["advantage"].get<double>(), 0.5);  // GRPO: (1 - 0.5) / std
  EXPECT_LT(lines[1]["advantage"].get<double>(), -0.5);
  EXPECT_EQ(a["completion_ids"].size(), a["logprobs"].size());
  EXPECT_EQ(a["versions"][0], 3);
  EXPECT_FALSE(a.contains("loss_mask"));
  EXPECT_EQ(lines[2]["dropped"], true);
  EXPECT_EQ(lines[2]["advantage"], 0.0);
  EXPECT_EQ(lines[3]["prompt_index"], 12);
}

// A rate below 1 traces about that share of the groups, the same ones for the same seed.
TEST(TracesTest, RateChoosesAStableShareOfTheGroups) {
  test::TempDir dir;
  text::Tokenizer tok(test::test_model_dir());
  TraceWriter a({dir.file("a.jsonl"), 0.25, 5}, tok), b({dir.file("b.jsonl"), 0.25, 5}, tok);
  TraceWriter c({dir.file("c.jsonl"), 0.25, 6}, tok);
  int traced = 0, same = 0, other_seed_differs = 0;
  for (int64_t step = 1; step <= 40; ++step) {
    for (int64_t p = 0; p < 100; ++p) {
      traced += a.traced(step, p);
      same += a.traced(step, p) == b.traced(step, p);
      other_seed_differs += a.traced(step, p) != c.traced(step, p);
    }
  }
  EXPECT_NEAR(traced / 4000.0, 0.25, 0.03);
  EXPECT_EQ(same, 4000);
  EXPECT_GT(other_seed_differs, 500);
  ASSERT_THROWS_WITH(TraceWriter({dir.file("d.jsonl"), 0.0, 1}, tok), std::invalid_argument,
                     "--trace-rate must be in (0, 1]");
  ASSERT_THROWS_WITH(TraceWriter({dir.file("no/such/dir/t.jsonl"), 1.0, 1}, tok),
                     std::runtime_error, "cannot open the traces file");
  // A fresh run's first writer empties the file; the others (and a resumed run) append.
  {
    std::ofstream(dir.file("e.jsonl")) << "a previous run\n";
    TraceWriter keep({dir.file("e.jsonl"), 1.0, 1}, tok);
  }
  EXPECT_EQ(text_of(dir.file("e.jsonl")), "a previous run\n");
  {
    TraceOptions o{dir.file("e.jsonl"), 1.0, 1};
    o.truncate = true;
    TraceWriter fresh(o, tok);
  }
  EXPECT_EQ(text_of(dir.file("e.jsonl")), "");
}

}  // namespace
}  // namespace crl::trainer
