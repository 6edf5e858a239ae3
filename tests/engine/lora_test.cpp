// LoRA adapters served unmerged (engine/model/lora.h): against the base, against the merged
// weights, mixed in one batch, in PEFT's format, and refused when they do not fit.
#include "engine/model/lora.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <random>

#include "engine/llm_engine.h"
#include "engine/model/model_cache.h"
#include "engine/model/model_writer.h"
#include "engine/model/safetensors.h"
#include "tests/engine/test_model.h"
#include "tests/test_utils.h"

namespace crl::engine {
namespace {

namespace fs = std::filesystem;

std::vector<GenerateRequest> greedy_requests(const std::string& prefix, int count, uint32_t seed,
                                             const std::vector<std::string>& loras) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int32_t> tok(3, 200);
  std::vector<GenerateRequest> reqs;
  for (int i = 0; i < count; ++i) {
    GenerateRequest r;
    r.request_id = prefix + std::to_string(i);
    for (int j = 0; j < 6 + 5 * i; ++j) r.prompt_token_ids.push_back(tok(rng));
    r.params.max_tokens = 10;
    r.params.temperature = 0.0;
    r.params.ignore_eos = true;
    r.lora = loras[static_cast<size_t>(i) % loras.size()];
    reqs.push_back(r);
  }
  return reqs;
}

void expect_same_outputs(const std::vector<RequestOutput>& a, const std::vector<RequestOutput>& b,
                         double tol) {
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    SCOPED_TRACE(a[i].request_id);
    EXPECT_EQ(a[i].outputs[0].token_ids, b[i].outputs[0].token_ids);
    const auto& x = a[i].outputs[0].raw_logprobs;
    const auto& y = b[i].outputs[0].raw_logprobs;
    ASSERT_EQ(x.size(), y.size());
    for (size_t t = 0; t < x.size(); ++t) {
      if (tol == 0) {
        EXPECT_EQ(x[t], y[t]) << "@" << t;
      } else {
        EXPECT_NEAR(x[t], y[t], tol) << "@" << t;
      }
    }
  }
}

EngineConfig lora_config(const std::string& variant, int32_t slots) {
  EngineConfig cfg = test::test_engine_config(variant);
  cfg.max_loras = slots;
  cfg.max_lora_rank = 8;
  return cfg;
}

TEST(LoraTest, ZeroInitialisedBLeavesTheBaseOutputs) {
  EngineConfig cfg = lora_config("qwen2", 1);
  LlmEngine eng(cfg);
  eng.loras().add("fresh", make_lora_adapter(eng.model_config(), 8, 16,
                                             parse_lora_targets("all-linear"), 1, false));
  const auto base = eng.generate(greedy_requests("r", 4, 3, {""}));
  const auto adapted = eng.generate(greedy_requests("r", 4, 3, {"fresh"}));
  expect_same_outputs(base, adapted, 0);
}

// The adapter unmerged in the engine against an engine whose checkpoint has it merged
// (write_merged_lora_model, the merge-lora command).
TEST(LoraTest, UnmergedAdapterMatchesTheMergedWeights) {
  for (const std::string variant : {"llama", "qwen2", "qwen3"}) {
    SCOPED_TRACE(variant);
    EngineConfig cfg = lora_config(variant, 2);
    LlmEngine eng(cfg);
    const ModelConfig mc = eng.model_config();
    const LoraAdapter ad = make_lora_adapter(mc, 6, 12, parse_lora_targets("all-linear"), 7, true);
    eng.loras().add("a", ad);
    const auto unmerged = eng.generate(greedy_requests("m", 5, 9, {"a"}));

    // Through the PEFT files and `merge-lora`'s function: load, merge, write a model directory.
    test::TempDir tmp;
    save_peft_adapter(ad, tmp.file("adapter"));
    const std::string dir = tmp.file("merged");
    write_merged_lora_model(cfg.model_dir, tmp.file("adapter"), dir);
    EXPECT_EQ(load_model_config(dir).torch_dtype, "float32");  // the files' dtype, not the base's
    if (variant == "qwen2") {
      write_merged_lora_model(cfg.model_dir, tmp.file("adapter"), tmp.file("merged16"), "bfloat16");
      EXPECT_EQ(load_model_config(tmp.file("merged16")).torch_dtype, "bfloat16");
    }
    EngineConfig merged_cfg = test::test_engine_config(variant);
    merged_cfg.model_dir = dir;
    const auto merged = LlmEngine(merged_cfg).generate(greedy_requests("m", 5, 9, {""}));
    expect_same_outputs(unmerged, merged, 2e-4);
    // And the adapter changed something: the base's outputs differ.
    const auto plain = eng.generate(greedy_requests("m", 5, 9, {""}));
    int differ = 0;
    for (size_t i = 0; i < plain.size(); ++i)
      differ += plain[i].outputs[0].token_ids != unmerged[i].outputs[0].token_ids;
    EXPECT_GT(differ, 0);
  }
}

// Rows of three adapters and the base in one batch: each row as when its adapter runs alone (then
// through the slot's own product, not the masked one). In deterministic mode (the masked product
// either way) the equality is exact.
class LoraMixTest : public ::testing::TestWithParam<bool> {};

TEST_P(LoraMixTest, OneBatchMixingThreeAdaptersEqualsEachAlone) {
  const bool deterministic = GetParam();
  EngineConfig cfg = lora_config("qwen2", 3);
  cfg.deterministic = deterministic;
  LlmEngine eng(cfg);
  const ModelConfig mc = eng.model_config();
  eng.loras().add("x", make_lora_adapter(mc, 8, 16, parse_lora_targets("all-linear"), 11, true));
  eng.loras().add("y", make_lora_adapter(mc, 4, 4, parse_lora_targets("q,v"), 12, true));
  eng.loras().add("z", make_lora_adapter(mc, 2, 8, parse_lora_targets("gate,up,down,o"), 13, true));
  EXPECT_EQ(eng.loras().names(), (std::vector<std::string>{"x", "y", "z"}));
  const std::vector<std::string> names = {"x", "", "y", "z"};
  const auto mixed = eng.generate(greedy_requests("q", 8, 21, names));
  for (const std::string& name : names) {
    SCOPED_TRACE("adapter '" + name + "'");
    auto all = greedy_requests("q", 8, 21, names);
    std::vector<GenerateRequest> alone;
    std::vector<RequestOutput> want;
    for (size_t i = 0; i < all.size(); ++i) {
      if (all[i].lora != name) continue;
      alone.push_back(all[i]);
      want.push_back(mixed[i]);
    }
    eng.apply_weight_update(eng.weight_version() + 1);  // no prefix-cache hits from the mixed run
    expect_same_outputs(eng.generate(alone), want, deterministic ? 0 : 1e-4);
  }
}

// LoRA RL's policy versions (LoraRegistry::attach_policy with 2 versions): a request admitted under
// version 0 finishes on version 0 after version 1 arrives (InflightPolicy::kKeep), its tokens
// recording 0 and equal to an engine serving version 0 alone; a request admitted after runs on
// version 1; a third update while a request of version 1 runs must reuse its slot (counted), and
// that request goes on under the new version.
TEST(LoraTest, PolicyVersionsKeepARunningRequestOnTheVersionItStartedOn) {
  EngineConfig cfg = lora_config("qwen2", 2);
  cfg.deterministic = true;
  LlmEngine eng(cfg);
  const ModelConfig mc = eng.model_config();
  const auto targets = parse_lora_targets("all-linear");
  std::vector<LoraAdapter> v;
  for (uint64_t seed : {31, 32, 33, 34})
    v.push_back(make_lora_adapter(mc, 8, 16, targets, seed, true));
  LoraBuffers& lb = eng.loras().attach_policy("policy", v[0], 1 << 20, 2, eng.weight_version());
  eng.set_weight_version(0);
  auto send = [&](const LoraAdapter& ad, int64_t version) {  // what a weight sync does
    std::vector<at::Tensor> tensors;
    for (const auto& [name, t] : lora_tensors(ad)) tensors.push_back(t);
    for (size_t b = 0; b < lb.buckets().size(); ++b)
      lb.layout().pack(tensors, static_cast<int64_t>(b), lb.buckets()[b]);
    eng.apply_weight_update(version, InflightPolicy::kKeep);
  };
  auto request = [&](const std::string& id, int max_tokens) {
    auto r = greedy_requests(id, 1, 77, {""})[0];
    r.request_id = id;
    r.params.max_tokens = max_tokens;
    return r;
  };
  auto run_until = [&](const std::string& id, int64_t generated) {
    RequestOutput last;
    while (eng.has_unfinished()) {
      for (auto& out : eng.step()) {
        if (out.request_id == id) last = out;
      }
      if (!last.outputs.empty() &&
          (static_cast<int64_t>(last.outputs[0].token_ids.size()) >= generated || last.finished))
        break;
    }
    return last;
  };
  eng.add_request(request("a", 12));
  run_until("a", 4);
  send(v[1], 1);
  eng.add_request(request("b", 12));
  std::map<std::string, CompletionOutput> done;
  while (eng.has_unfinished()) {
    for (auto& out : eng.step()) {
      if (out.finished) done[out.request_id] = out.outputs[0];
    }
  }
  EXPECT_EQ(done["a"].token_versions, std::vector<int64_t>(12, 0));
  EXPECT_EQ(done["b"].token_versions, std::vector<int64_t>(12, 1));
  // Each request alone, on an engine whose slots hold the same versions (the same stacked
  // products: deterministic mode makes a row's result independent of the other rows).
  CompletionOutput a0, b1;
  {
    LlmEngine ref(cfg);
    LoraBuffers& rb = ref.loras().attach_policy("policy", v[0], 1 << 20, 2, ref.weight_version());
    ref.set_weight_version(0);
    a0 = ref.generate({request("a", 12)})[0].outputs[0];
    std::vector<at::Tensor> tensors;
    for (const auto& [name, t] : lora_tensors(v[1])) tensors.push_back(t);
    for (size_t b = 0; b < rb.buckets().size(); ++b)
      rb.layout().pack(tensors, static_cast<int64_t>(b), rb.buckets()[b]);
    ref.apply_weight_update(1);
    b1 = ref.generate({request("b", 12)})[0].outputs[0];
  }
  EXPECT_EQ(done["a"].token_ids, a0.token_ids);
  EXPECT_EQ(done["a"].raw_logprobs, a0.raw_logprobs);
  EXPECT_EQ(done["b"].token_ids, b1.token_ids);
  EXPECT_EQ(done["b"].raw_logprobs, b1.raw_logprobs);
  EXPECT_NE(a0.token_ids, b1.token_ids);
  EXPECT_EQ(eng.loras().names(), std::vector<std::string>{"policy"});  // old versions are hidden
  EXPECT_EQ(eng.loras().slot_reuses(), 0);

  // c runs on version 1; version 2 takes the free slot; version 3 finds c's slot the only other
  // one and reuses it: c goes on under version 3.
  eng.add_request(request("c", 12));
  run_until("c", 3);
  send(v[2], 2);
  EXPECT_EQ(eng.loras().slot_reuses(), 0);
  RequestOutput mid = run_until("c", 6);
  send(v[3], 3);
  EXPECT_EQ(eng.loras().slot_reuses(), 1);
  while (eng.has_unfinished()) {
    for (auto& out : eng.step()) {
      if (out.finished) done[out.request_id] = out.outputs[0];
    }
  }
  const auto& cv = done["c"].token_versions;
  ASSERT_EQ(cv.size(), 12u);
  const size_t before = mid.outputs[0].token_ids.size();
  for (size_t i = 0; i < cv.size(); ++i) EXPECT_EQ(cv[i], i < before ? 1 : 3) << "token " << i;
}

INSTANTIATE_TEST_SUITE_P(Lora, LoraMixTest, ::testing::Bool(),
                         [](const ::testing::TestParamInfo<bool>& i) {
                           return i.param ? "Deterministic" : "Default";
                         });

// Decode steps with adapted rows replaying LoRA graphs (the masked product, padded to the bucket)
// against the eager engine on the same GPU: mixed slots and base rows, and one adapter for every
// row (eagerly its own product), equal tokens and log-probs to cuBLAS's tolerance; a new version
// loaded into a slot is read by the captured graphs (no new capture).
TEST(CudaLoraTest, DecodeGraphsServeMixedAdaptersAsTheEagerEngine) {
  if (!at::hasCUDA()) GTEST_SKIP() << "no CUDA device";
  EngineConfig cfg = lora_config("qwen2", 3);
  cfg.device = "cuda";
  cfg.max_seqs = 12;
  cfg.cuda_graphs = "off";
  LlmEngine eager(cfg);
  cfg.cuda_graphs = "on";
  LlmEngine graphed(cfg);
  const ModelConfig mc = eager.model_config();
  for (LlmEngine* e : {&eager, &graphed}) {
    e->loras().add("x", make_lora_adapter(mc, 8, 16, parse_lora_targets("all-linear"), 11, true));
    e->loras().add("y", make_lora_adapter(mc, 4, 4, parse_lora_targets("q,v"), 12, true));
  }
  for (const std::vector<std::string>& names :
       {std::vector<std::string>{"x", "", "y"}, std::vector<std::string>{"x"}}) {
    SCOPED_TRACE(names.size() == 1 ? "one adapter" : "mixed");
    const auto reqs = greedy_requests("g", 7, 31, names);
    expect_same_outputs(eager.generate(reqs), graphed.generate(reqs), 2e-3);
  }
  EXPECT_GT(graphed.runner().num_lora_cuda_graphs(), 0);
  const int64_t captures = graphed.runner().num_cuda_graph_captures();
  for (LlmEngine* e : {&eager, &graphed}) {
    e->loras().add("z", make_lora_adapter(mc, 8, 8, parse_lora_targets("all-linear"), 14, true));
    e->apply_weight_update(e->weight_version() + 1);
  }
  const auto reqs = greedy_requests("h", 7, 32, {"z", "x", ""});
  expect_same_outputs(eager.generate(reqs), graphed.generate(reqs), 2e-3);
  EXPECT_EQ(graphed.runner().num_cuda_graph_captures(), captures);
}

TEST(LoraTest, AdaptersDoNotShareTheBasesPrefixCache) {
  EngineConfig cfg = lora_config("llama", 1);
  LlmEngine eng(cfg);
  eng.loras().add(
      "a", make_lora_adapter(eng.model_config(), 4, 8, parse_lora_targets("all-linear"), 5, true));
  auto reqs = greedy_requests("p", 1, 4, {""});
  reqs[0].prompt_token_ids.resize(40, 7);
  eng.generate(reqs);
  auto again = reqs;
  again[0].request_id = "p-again";
  EXPECT_GT(eng.generate(again)[0].num_cached_tokens, 0);  // the base hits its own blocks
  auto adapted = reqs;
  adapted[0].request_id = "p-lora";
  adapted[0].lora = "a";
  EXPECT_EQ(eng.generate(adapted)[0].num_cached_tokens, 0);
}

TEST(LoraTest, PeftAdapterRoundTripsWithPeftsNames) {
  const ModelConfig mc = LlmEngine(test::test_engine_config("qwen2")).model_config();
  const LoraAdapter ad = make_lora_adapter(mc, 4, 32, parse_lora_targets("q,k,v,o"), 3, true);
  test::TempDir tmp;
  const std::string dir = tmp.file("peft");
  save_peft_adapter(ad, dir, "test-base");
  const auto file = SafetensorsFile::open(dir + "/adapter_model.safetensors");
  EXPECT_TRUE(file->contains("base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight"));
  EXPECT_TRUE(file->contains("base_model.model.model.layers.2.self_attn.o_proj.lora_B.weight"));
  EXPECT_EQ(file->tensors().size(), static_cast<size_t>(mc.num_layers * 4 * 2));
  std::ifstream cfg_in(dir + "/adapter_config.json");
  const auto cfg = nlohmann::json::parse(cfg_in);
  EXPECT_EQ(cfg["peft_type"], "LORA");
  EXPECT_EQ(cfg["r"], 4);
  EXPECT_EQ(cfg["lora_alpha"], 32.0);
  const LoraAdapter back = load_peft_adapter(dir, mc);
  EXPECT_EQ(back.rank, 4);
  EXPECT_EQ(back.alpha, 32.0);
  EXPECT_EQ(back.targets, ad.targets);
  for (int64_t li = 0; li < mc.num_layers; ++li) {
    for (LoraTarget t : ad.targets) {
      EXPECT_TRUE(back.a[li][static_cast<int>(t)].equal(ad.a[li][static_cast<int>(t)]));
      EXPECT_TRUE(back.b[li][static_cast<int>(t)].equal(ad.b[li][static_cast<int>(t)]));
    }
  }
  // Served by name from the directory.
  EngineConfig ecfg = lora_config("qwen2", 1);
  LlmEngine eng(ecfg);
  eng.loras().load("peft", dir);
  EXPECT_EQ(eng.loras().names(), std::vector<std::string>{"peft"});
}

TEST(LoraTest, AdaptersThatDoNotFitAreNamedErrors) {
  const ModelConfig mc = LlmEngine(test::test_engine_config("qwen2")).model_config();
  // A tensor of the wrong shape, named.
  LoraAdapter ad = make_lora_adapter(mc, 4, 8, parse_lora_targets("q"), 3, true);
  ad.a[1][static_cast<int>(LoraTarget::kQ)] = at::zeros({4, mc.hidden_size + 1});
  test::TempDir tmp;
  const std::string dir = tmp.file("bad");
  save_peft_adapter(ad, dir);
  ASSERT_THROWS_WITH(load_peft_adapter(dir, mc), std::invalid_argument,
                     "model.layers.1.self_attn.q_proj.lora_A.weight' has shape");
  // A NaN (served in a mixed batch it would reach every row through the mask product), named.
  ad = make_lora_adapter(mc, 4, 8, parse_lora_targets("q"), 3, true);
  ad.b[2][static_cast<int>(LoraTarget::kQ)][0][1] = std::nan("");
  save_peft_adapter(ad, dir);
  ASSERT_THROWS_WITH(load_peft_adapter(dir, mc), std::invalid_argument,
                     "model.layers.2.self_attn.q_proj.lora_B.weight' holds NaN or infinite values");
  // A layer the model does not have.
  ModelConfig deeper = mc;
  deeper.num_layers = mc.num_layers + 1;
  save_peft_adapter(make_lora_adapter(deeper, 4, 8, parse_lora_targets("q"), 3, true), dir);
  ASSERT_THROWS_WITH(load_peft_adapter(dir, mc), std::invalid_argument, "the model has 3");
  // Not a LoRA adapter.
  std::ofstream(dir + "/adapter_config.json") << R"({"peft_type": "PREFIX_TUNING", "r": 4})";
  ASSERT_THROWS_WITH(load_peft_adapter(dir, mc), std::invalid_argument, "is not LORA");
  ASSERT_THROWS_WITH(parse_lora_targets("q,embed"), std::invalid_argument, "LoRA target 'embed'");
  // PEFT fields this loader does not apply are refused, not ignored; wrong types are named.
  std::ofstream(dir + "/adapter_config.json")
      << R"({"peft_type": "LORA", "r": 4, "lora_alpha": 8, "target_modules": ["q_proj"], "alpha_pattern": {"q_proj": 32}})";
  ASSERT_THROWS_WITH(load_peft_adapter(dir, mc), std::invalid_argument,
                     "alpha_pattern is not supported");
  std::ofstream(dir + "/adapter_config.json")
      << R"({"peft_type": "LORA", "r": 4, "target_modules": [3]})";
  ASSERT_THROWS_WITH(load_peft_adapter(dir, mc), std::invalid_argument,
                     "adapter_config.json: a field has the wrong type");

  EngineConfig cfg = lora_config("qwen2", 1);
  cfg.lora_targets = "q,k,v";
  LlmEngine eng(cfg);
  ASSERT_THROWS_WITH(
      eng.loras().add("big", make_lora_adapter(mc, 9, 8, parse_lora_targets("q"), 1, true)),
      std::invalid_argument, "--max-lora-rank");
  ASSERT_THROWS_WITH(
      eng.loras().add("mlp", make_lora_adapter(mc, 2, 8, parse_lora_targets("down"), 1, true)),
      std::invalid_argument, "down_proj");
  eng.loras().add("ok", make_lora_adapter(mc, 2, 8, parse_lora_targets("q"), 1, true));
  ASSERT_THROWS_WITH(
      eng.loras().add("two", make_lora_adapter(mc, 2, 8, parse_lora_targets("q"), 1, true)),
      std::invalid_argument, "all 1 LoRA slots are in use");
  auto r = greedy_requests("e", 1, 1, {"nope"});
  ASSERT_THROWS_WITH(eng.add_request(r[0]), std::invalid_argument,
                     "unknown LoRA adapter 'nope' (loaded: ok)");
  ASSERT_THROWS_WITH(LlmEngine(test::test_engine_config("qwen2")).loras().add("x", ad),
                     std::invalid_argument, "--max-loras");
}

}  // namespace
}  // namespace crl::engine
