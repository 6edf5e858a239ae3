// Tensor-parallel engines (docs/design.md §4): a model split over a group of ranks against the
// whole model: the shard math, logits within fp32 tolerance, greedy and seeded tokens identical,
// the KV pool's hand-over through the leader, a rank that cannot build its shard, and the refusals.
// The ranks are threads of this process, standing in for GPUs: either as separate processes would
// be (each with a Gloo communicator, the leader's commands as broadcasts) or as an engine's own
// in-process group (commands and sums through memory).
#include "engine/model/tensor_parallel.h"

#include <gtest/gtest.h>

#include <chrono>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "engine/llm_engine.h"
#include "engine/model/attention.h"
#include "engine/model/model_writer.h"
#include "engine/model/transformer.h"
#include "sync/communicator.h"
#include "sync/tp_group.h"
#include "tests/engine/test_model.h"
#include "tests/test_utils.h"

namespace crl::engine {
namespace {

using std::chrono::milliseconds;

TEST(TensorParallelShardTest, SplitsHeadsKvHeadsAndTheIntermediateAndRefusesWhatDoesNotDivide) {
  const ModelConfig full = load_model_config(test::test_model_dir("llama"));  // 4 heads, 2 KV
  const ModelConfig half = tp_local_config(full, {1, 2});
  EXPECT_EQ(half.num_heads, full.num_heads / 2);
  EXPECT_EQ(half.num_kv_heads, full.num_kv_heads / 2);
  EXPECT_EQ(half.intermediate_size, full.intermediate_size / 2);
  EXPECT_EQ(half.head_dim, full.head_dim);
  EXPECT_EQ(half.hidden_size, full.hidden_size);
  try {
    tp_local_config(full, {0, 4});
    FAIL() << "4 ranks cannot split 2 KV heads";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("num_key_value_heads (2)"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("--tp"), std::string::npos) << e.what();
  }
  EXPECT_THROW(tp_local_config(full, {2, 2}), std::invalid_argument);

  EXPECT_EQ(tp_split_dim("model.layers.0.self_attn.q_proj.weight", full, 2), 0);
  EXPECT_EQ(tp_split_dim("model.layers.0.self_attn.k_proj.bias", full, 2), 0);
  EXPECT_EQ(tp_split_dim("model.layers.3.mlp.up_proj.weight", full, 2), 0);
  EXPECT_EQ(tp_split_dim("model.layers.0.self_attn.o_proj.weight", full, 2), 1);
  EXPECT_EQ(tp_split_dim("model.layers.0.mlp.down_proj.weight", full, 2), 1);
  EXPECT_EQ(tp_split_dim("model.layers.0.self_attn.q_norm.weight", full, 2), -1);
  EXPECT_EQ(tp_split_dim("model.norm.weight", full, 2), -1);
  // The vocabulary rows, where the group divides them.
  ModelConfig odd = full;
  odd.vocab_size = 514;
  EXPECT_EQ(tp_split_dim("model.embed_tokens.weight", full, 2), 0);
  EXPECT_EQ(tp_split_dim("lm_head.weight", full, 4), 0);
  EXPECT_EQ(tp_split_dim("model.embed_tokens.weight", odd, 2), 0);
  EXPECT_EQ(tp_split_dim("model.embed_tokens.weight", odd, 4), -1);
  EXPECT_EQ(tp_split_dim("lm_head.weight", odd, 4), -1);
  EXPECT_EQ(tp_split_dim("model.embed_tokens.weight", full, 1), -1);
  const VocabRange second = tp_vocab_range(full, {1, 4});
  EXPECT_EQ(second.start, full.vocab_size / 4);
  EXPECT_EQ(second.rows, full.vocab_size / 4);
  EXPECT_EQ(tp_vocab_range(odd, {3, 4}).start, 0);
  EXPECT_EQ(tp_vocab_range(odd, {3, 4}).rows, 514);

  // Rank r's rows (or columns) are the r-th part, in order.
  const at::Tensor w = at::arange(24, at::kFloat).view({4, 6});
  EXPECT_TRUE(tp_slice("x.q_proj.weight", w, {1, 2}).equal(w.narrow(0, 2, 2)));
  EXPECT_TRUE(tp_slice("x.o_proj.weight", w, {2, 3}).equal(w.narrow(1, 4, 2)));
  EXPECT_TRUE(tp_slice("x.o_proj.weight", w, {2, 3}).is_contiguous());
  EXPECT_TRUE(tp_slice("model.norm.weight", w, {1, 2}).equal(w));
  EXPECT_TRUE(tp_slice("model.embed_tokens.weight", w, {1, 2}).equal(w.narrow(0, 2, 2)));
  EXPECT_TRUE(tp_slice("lm_head.weight", w, {3, 4}).equal(w.narrow(0, 3, 1)));
  EXPECT_TRUE(tp_slice("lm_head.weight", w, {1, 3}).equal(w));  // 4 rows: whole at 3
}

// Each rank's shard of `variant`, summing over the group: forward_packed's logits against the whole
// model's (a shard that splits the vocabulary: its columns of them).
void expect_shards_match_the_whole_model(const std::string& variant, int tp, bool splits_vocab) {
  const std::string dir = test::test_model_dir(variant);
  const Transformer whole = Transformer::load(dir, {});
  const std::vector<int64_t> lens = {7, 3, 12};
  const at::Tensor tokens = at::randint(0, whole.config().vocab_size, {22}, at::kLong);
  const at::Tensor want = whole.forward_packed(tokens, lens);
  const auto errors =
      test::run_ranks(tp, milliseconds(20000), [&](int r, auto& comm, const sync::StorePtr&) {
        const auto group = sync::make_tp_group(*comm, at::kCPU);
        Transformer shard = Transformer::load(dir, {}, TpShard{r, tp});
        EXPECT_EQ(shard.config().num_heads, whole.config().num_heads / tp);
        EXPECT_EQ(shard.config().vocab_size, whole.config().vocab_size);
        EXPECT_EQ(shard.splits_vocab(), splits_vocab);
        const VocabRange v = shard.vocab_range();
        const int64_t rows =
            splits_vocab ? whole.config().vocab_size / tp : whole.config().vocab_size;
        EXPECT_EQ(v.start, splits_vocab ? r * rows : 0);
        EXPECT_EQ(v.rows, rows);
        EXPECT_EQ(shard.named_parameters().front().second.size(0), rows);  // the embedding
        shard.set_row_parallel_reduce([&](const at::Tensor& t) { group->all_reduce_sum(t); });
        test::expect_tensor_near(shard.forward_packed(tokens, lens), want.narrow(1, v.start, rows),
                                 1e-4, 1e-4);
      });
  for (const auto& e : errors) EXPECT_EQ(e, "");
}

TEST(TensorParallelShardTest, ShardsSummedOverTheGroupGiveTheWholeModelsLogits) {
  expect_shards_match_the_whole_model("llama", 2, true);  // GQA, tied embeddings
  expect_shards_match_the_whole_model("qwen3", 2, true);  // q/k norms, head_dim != hidden/heads
  expect_shards_match_the_whole_model("tp4", 4, true);    // qkv bias, one KV head a rank, untied
  expect_shards_match_the_whole_model("tp4-vocab514", 4, false);  // the vocabulary whole
  expect_shards_match_the_whole_model("tp4-vocab514", 2, true);
}

// Requests that take every path of a step: prompts of several lengths in one batch (chunked under
// the token budget), n = 2 samples sharing the prompt's blocks (copy-on-write), a prompt repeated
// (prefix-cache hits), sampled tokens with a seed.
std::vector<GenerateRequest> mixed_requests(int64_t vocab) {
  std::vector<GenerateRequest> out;
  const std::vector<std::vector<int32_t>> prompts = {
      {5, 9, 14, 3, 8, 21, 7, 30, 2},
      {11, 4},
      {5, 9, 14, 3, 8, 21, 7, 30, 2, 6, 6, 1, 40, 3, 19},
      {static_cast<int32_t>(vocab - 1), 17, 23, 29}};
  for (size_t i = 0; i < prompts.size(); ++i) {
    GenerateRequest r;
    r.request_id = "greedy-" + std::to_string(i);
    r.prompt_token_ids = prompts[i];
    r.params.temperature = 0;
    r.params.max_tokens = 12;
    r.params.ignore_eos = true;
    r.params.logprobs = 0;
    if (i == 2) r.params.prompt_logprobs = 0;  // the chunked prompt: rows of several steps
    out.push_back(r);
  }
  GenerateRequest s;
  s.request_id = "sampled";
  s.prompt_token_ids = prompts[0];
  s.params.n = 2;
  s.params.seed = 7;
  s.params.max_tokens = 10;
  s.params.ignore_eos = true;
  out.push_back(s);
  return out;
}

struct Generated {
  std::map<std::string, std::vector<std::vector<int32_t>>> tokens;
  std::map<std::string, std::vector<std::vector<float>>> logprobs;  // prompt's as "<id>/prompt"
};

Generated collect(const std::vector<RequestOutput>& outputs) {
  Generated g;
  for (const RequestOutput& o : outputs) {
    EXPECT_EQ(o.error, "") << o.request_id;
    if (!o.prompt_logprobs.empty()) g.logprobs[o.request_id + "/prompt"] = {o.prompt_logprobs};
    for (const CompletionOutput& c : o.outputs) {
      g.tokens[o.request_id].push_back(c.token_ids);
      g.logprobs[o.request_id].push_back(c.raw_logprobs);
    }
  }
  return g;
}

// Generates `requests` twice on `engine`, the KV pool released and taken back between the runs (as
// in the colocated hand-over, which tells the followers too).
void generate_twice(LlmEngine& engine, const std::vector<GenerateRequest>& requests,
                    std::vector<Generated>* runs) {
  runs->push_back(collect(engine.generate(requests)));
  engine.release_kv_cache();
  EXPECT_TRUE(engine.kv_cache_released());
  runs->push_back(collect(engine.generate(requests)));
  EXPECT_FALSE(engine.kv_cache_released());
}

// A group of `tp` ranks as in separate processes (each its own communicator; the leader's commands
// are broadcasts): rank 0 an LlmEngine, the others LlmEngine::follow.
std::vector<Generated> generate_over_communicators(const EngineConfig& config, int tp,
                                                   const std::vector<GenerateRequest>& requests) {
  std::vector<Generated> runs;
  const auto errors =
      test::run_ranks(tp, milliseconds(30000), [&](int r, auto& comm, const sync::StorePtr&) {
        const auto group = sync::make_tp_group(*comm, at::kCPU);
        if (r != 0) {
          LlmEngine::follow(config, *group);
          return;
        }
        LlmEngine engine(config, group.get());
        EXPECT_EQ(engine.model_config().num_kv_heads * tp,
                  load_model_config(config.model_dir).num_kv_heads);
        generate_twice(engine, requests, &runs);
      });
  for (const auto& e : errors) EXPECT_EQ(e, "");
  return runs;
}

// The same group as threads the engine starts itself (EngineConfig::tensor_parallel_size).
std::vector<Generated> generate_in_process(EngineConfig config, int tp,
                                           const std::vector<GenerateRequest>& requests) {
  config.tensor_parallel_size = tp;
  std::vector<Generated> runs;
  LlmEngine engine(config);
  EXPECT_EQ(engine.model_config().num_heads * tp, load_model_config(config.model_dir).num_heads);
  EXPECT_TRUE(engine.runner().tensor_parallel());
  generate_twice(engine, requests, &runs);
  return runs;
}

void expect_tensor_parallel_engine_matches(const std::string& variant, int tp, bool in_process) {
  SCOPED_TRACE(variant + " at tp " + std::to_string(tp) + (in_process ? " in one process" : ""));
  EngineConfig config = test::test_engine_config(variant);
  config.max_batched_tokens = 16;  // the long prompts run in chunks
  config.num_kv_blocks = 64;
  const auto requests = mixed_requests(load_model_config(config.model_dir).vocab_size);
  Generated want;
  {
    LlmEngine whole(config);
    want = collect(whole.generate(requests));
  }
  ASSERT_EQ(want.logprobs.at("greedy-2/prompt").at(0).size(), 14u);  // 15 prompt tokens
  const std::vector<Generated> runs = in_process
                                          ? generate_in_process(config, tp, requests)
                                          : generate_over_communicators(config, tp, requests);
  ASSERT_EQ(runs.size(), 2u);
  for (const Generated& got : runs) {
    EXPECT_EQ(got.tokens, want.tokens);
    for (const auto& [id, samples] : want.logprobs) {
      ASSERT_EQ(got.logprobs.at(id).size(), samples.size()) << id;
      for (size_t i = 0; i < samples.size(); ++i) {
        const std::vector<float>& a = got.logprobs.at(id)[i];
        ASSERT_EQ(a.size(), samples[i].size()) << id;
        for (size_t k = 0; k < a.size(); ++k) EXPECT_NEAR(a[k], samples[i][k], 1e-3) << id;
      }
    }
  }
}

TEST(TensorParallelEngineTest, GreedyAndSeededTokensEqualTheWholeModelsAtTwoAndFourRanks) {
  expect_tensor_parallel_engine_matches("llama", 2, /*in_process=*/false);
  expect_tensor_parallel_engine_matches("tp4", 4, /*in_process=*/false);
  expect_tensor_parallel_engine_matches("llama", 2, /*in_process=*/true);
  expect_tensor_parallel_engine_matches("qwen3", 2, /*in_process=*/true);
  expect_tensor_parallel_engine_matches("tp4", 4, /*in_process=*/true);
  expect_tensor_parallel_engine_matches("tp4-vocab514", 4, /*in_process=*/true);  // whole vocab
}

// Version 1 of the weights held in memory, offered as WeightSync's broadcasts would land it: whole
// buckets into an engine's own (receive), or one bucket at a time through a staging buffer
// (receive_staged, a tensor-parallel engine).
class MemoryWeights : public sync::WeightSource {
 public:
  MemoryWeights(const sync::WeightLayout& layout, std::vector<at::Tensor> tensors)
      : layout_(layout), tensors_(std::move(tensors)) {}
  bool ready(int64_t) const override { return true; }
  sync::SyncStats receive(std::vector<at::Tensor>& buckets, int64_t version) override {
    for (size_t b = 0; b < buckets.size(); ++b) {
      layout_.pack(tensors_, static_cast<int64_t>(b), buckets[b]);
    }
    return {version};
  }
  sync::SyncStats receive_staged(int64_t version, const at::Tensor& staging,
                                 const LandFn& land) override {
    at::Tensor buffer = staging;  // the same memory (pack takes a non-const handle)
    for (const auto& b : layout_.buckets()) {
      buffer.zero_();  // nothing of the last bucket may leak into this one
      layout_.pack(tensors_, b.index, buffer);
      land(b.index, buffer);
      ++landed;
    }
    return {version};
  }
  // Each rank's slices of the new weights into its own buckets (the layout is one shard's).
  sync::SyncStats receive_lanes(const std::vector<std::vector<at::Tensor>*>& lanes,
                                int64_t version) override {
    const auto n = static_cast<int64_t>(lanes.size());
    for (int64_t r = 0; r < n; ++r) {
      std::vector<at::Tensor> parts;
      for (size_t i = 0; i < tensors_.size(); ++i) {
        parts.push_back(tp_slice_view(layout_.specs()[i].name, tensors_[i], TpShard{r, n}));
      }
      for (const auto& b : layout_.buckets()) layout_.pack(parts, b.index, (*lanes[r])[b.index]);
      landed += static_cast<int64_t>(layout_.buckets().size());
    }
    return {version};
  }
  int64_t landed = 0;

 private:
  sync::WeightLayout layout_;
  std::vector<at::Tensor> tensors_;
};

// New weights for `config`'s model, far from its checkpoint's (the tokens change).
std::vector<at::Tensor> new_weights(const EngineConfig& config) {
  std::vector<at::Tensor> out;
  for (auto& [name, t] : random_init_weights(load_model_config(config.model_dir), 99, at::kFloat)) {
    out.push_back(t.mul_(4.0));
  }
  return out;
}

// Issue 55, item 4: a weight update into a tensor-parallel engine, two ways. Staged: the whole
// model's layout (the same buckets and hash a whole engine has, so the trainers send as before),
// each bucket staged on the leader and sliced by every rank, in both kinds of group. Sync lanes
// (in one process): every rank's shard in buckets of its own, laid out as one shard (about half
// the whole model's bytes at two ranks), the update received into all of them at once. Either way
// the group then generates what the whole engine does from the same update.
TEST(TensorParallelEngineTest, AWeightUpdateLandsEachRanksSlicesAndGeneratesAsTheWholeEngine) {
  struct Run {
    std::string variant;
    bool in_process;
    bool lanes;
  };
  // llama: a tied head; tp4: an untied one, its own rows landed.
  for (const Run& run : std::vector<Run>{{"llama", true, false},
                                         {"llama", false, false},
                                         {"tp4", true, false},
                                         {"llama", true, true},
                                         {"tp4", true, true}}) {
    const std::string& variant = run.variant;
    const bool in_process = run.in_process;
    SCOPED_TRACE(variant + (in_process ? " in one process" : " over communicators") +
                 (run.lanes ? ", sync lanes" : ", staged"));
    EngineConfig config = test::test_engine_config(variant);
    config.num_kv_blocks = 64;
    const int64_t bucket_bytes = 24 << 10;  // several buckets
    const auto requests = mixed_requests(load_model_config(config.model_dir).vocab_size);
    Generated before, want;
    uint64_t want_hash = 0;
    int64_t whole_bytes = 0;
    {
      LlmEngine whole(config);
      before = collect(whole.generate(requests));
      const sync::WeightLayout& layout = whole.attach_weight_layout(bucket_bytes);
      ASSERT_GT(layout.buckets().size(), 3u);
      want_hash = layout.hash();
      whole_bytes = layout.total_bytes();
      MemoryWeights source(layout, new_weights(config));
      whole.receive_weight_update(source, 1);
      want = collect(whole.generate(requests));
    }
    EXPECT_NE(want.tokens, before.tokens) << "the update should change the tokens";
    auto leader = [&](LlmEngine& engine) {
      const sync::WeightLayout& layout = run.lanes ? engine.attach_weight_lanes(bucket_bytes)
                                                   : engine.attach_weight_layout(bucket_bytes);
      int64_t lanes = 1;
      if (run.lanes) {
        lanes = 2;
        EXPECT_NE(engine.weight_buffers(), nullptr);  // the leader's shard in its buckets
        EXPECT_LT(layout.total_bytes(), whole_bytes * 6 / 10) << "one rank's share";
        EXPECT_THROW(engine.attach_weight_layout(bucket_bytes), std::invalid_argument);
      } else {
        EXPECT_EQ(layout.hash(), want_hash);
        EXPECT_EQ(engine.weight_buffers(), nullptr);  // the shards stay as loaded
      }
      MemoryWeights source(layout, new_weights(config));
      engine.receive_weight_update(source, 1);
      EXPECT_EQ(source.landed, lanes * static_cast<int64_t>(layout.buckets().size()));
      EXPECT_EQ(engine.weight_version(), 1);
      const Generated got = collect(engine.generate(requests));
      EXPECT_EQ(got.tokens, want.tokens);
      for (const auto& [id, samples] : want.logprobs) {
        for (size_t i = 0; i < samples.size(); ++i) {
          for (size_t k = 0; k < samples[i].size(); ++k) {
            EXPECT_NEAR(got.logprobs.at(id)[i][k], samples[i][k], 1e-3) << id;
          }
        }
      }
    };
    if (in_process) {
      config.tensor_parallel_size = 2;
      LlmEngine engine(config);
      leader(engine);
      continue;
    }
    const auto errors =
        test::run_ranks(2, milliseconds(30000), [&](int r, auto& comm, const sync::StorePtr&) {
          const auto group = sync::make_tp_group(*comm, at::kCPU);
          if (r != 0) {
            LlmEngine::follow(config, *group);
            return;
          }
          LlmEngine engine(config, group.get());
          leader(engine);
        });
    for (const auto& e : errors) EXPECT_EQ(e, "");
  }
}

TEST(TensorParallelEngineTest, AnInProcessGroupEndsWithItsEngineAndRefusesWhatDoesNotSplit) {
  EngineConfig config = test::test_engine_config("llama");  // 2 KV heads
  config.tensor_parallel_size = 4;
  try {
    LlmEngine engine(config);
    FAIL() << "4 ranks took a model of 2 KV heads";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("num_key_value_heads"), std::string::npos) << e.what();
  }
  // The followers of an engine destroyed mid-generation end with it (its destructor would hang
  // on a thread that did not).
  config.tensor_parallel_size = 2;
  for (int i = 0; i < 3; ++i) {
    LlmEngine engine(config);
    GenerateRequest r;
    r.prompt_token_ids = {4, 8, 15, 16, 23, 42};
    r.params.max_tokens = 50;
    r.params.ignore_eos = true;
    engine.add_request(r);
    for (int s = 0; s < i; ++s) engine.step();
  }
}

TEST(TensorParallelEngineTest, RefusesWhatItDoesNotServeYet) {
  const auto errors =
      test::run_ranks(2, milliseconds(20000), [&](int r, auto& comm, const sync::StorePtr&) {
        const auto group = sync::make_tp_group(*comm, at::kCPU);
        EngineConfig config = test::test_engine_config("llama");
        if (r == 1) {
          EXPECT_THROW(LlmEngine(config, group.get()), std::logic_error);  // rank 1 follows
          // Rank 0's refusal (LoRA) ends this rank's start too: the group agrees after building.
          try {
            LlmEngine::follow(config, *group);
            ADD_FAILURE() << "a follower started beside a leader that refused its settings";
          } catch (const std::runtime_error& e) {
            EXPECT_NE(std::string(e.what()).find("rank(s) 0 could not build"), std::string::npos)
                << e.what();
          }
          LlmEngine::follow(config, *group);
          return;
        }
        EXPECT_THROW(LlmEngine::follow(config, *group), std::logic_error);  // rank 0 leads
        EngineConfig with_lora = config;
        with_lora.max_loras = 1;
        EXPECT_THROW(LlmEngine(with_lora, group.get()), std::invalid_argument);
        LlmEngine engine(config, group.get());
        try {
          engine.attach_weight_buffers(1 << 20);
          ADD_FAILURE() << "a tensor-parallel engine took whole-model weight buckets";
        } catch (const std::invalid_argument& e) {
          EXPECT_NE(std::string(e.what()).find("attach_weight_layout"), std::string::npos)
              << e.what();
        }
      });
  for (const auto& e : errors) EXPECT_EQ(e, "");
}

TEST(TensorParallelEngineTest, ARankThatCannotBuildItsShardEndsTheGroupBeforeAnyStep) {
  const auto errors =
      test::run_ranks(2, milliseconds(20000), [&](int r, auto& comm, const sync::StorePtr&) {
        const auto group = sync::make_tp_group(*comm, at::kCPU);
        EngineConfig config = test::test_engine_config("llama");
        // 1. Rank 1 alone cannot load (no checkpoint where its flags point).
        EngineConfig broken = config;
        broken.model_dir = ::testing::TempDir() + "/no-such-model";
        if (r == 1) {
          EXPECT_ANY_THROW(LlmEngine::follow(broken, *group));
        } else {
          try {
            LlmEngine engine(config, group.get());
            ADD_FAILURE() << "the leader started beside a rank without its shard";
          } catch (const std::runtime_error& e) {
            EXPECT_NE(std::string(e.what()).find("rank(s) 1 could not build"), std::string::npos)
                << e.what();
          }
        }
        // 2. Pools that differ: the leader's block tables would index past a follower's pool.
        EngineConfig fewer = config;
        fewer.num_kv_blocks = config.num_kv_blocks / 2;
        if (r == 1) {
          EXPECT_THROW(LlmEngine::follow(fewer, *group), std::invalid_argument);
        } else {
          try {
            LlmEngine engine(config, group.get());
            ADD_FAILURE() << "the leader started with a follower of half its KV pool";
          } catch (const std::invalid_argument& e) {
            EXPECT_NE(std::string(e.what()).find(
                          "rank 1 has " + std::to_string(fewer.num_kv_blocks) + " KV blocks"),
                      std::string::npos)
                << e.what();
          }
        }
      });
  for (const auto& e : errors) EXPECT_EQ(e, "");
}

}  // namespace
}  // namespace crl::engine
