// End-to-end engine tests against the plain full-sequence forward (no KV cache).
#include "engine/llm_engine.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <random>

#include "engine/kernels/cpu_isa.h"
#include "tests/engine/engine_requests.h"
#include "tests/engine/test_model.h"
#include "tests/test_utils.h"

namespace crl::engine {
namespace {

using LogitsKey = std::pair<std::string, int64_t>;  // (request id, position of the sampled token)

using test::greedy;
using test::random_tokens;

// Reference: logits of the last position of `tokens` from a full forward with no cache.
at::Tensor full_forward_last(const Transformer& model, const std::vector<int32_t>& tokens) {
  std::vector<int64_t> ids(tokens.begin(), tokens.end());
  auto logits =
      model.forward_packed(at::tensor(ids, at::kLong), {static_cast<int64_t>(ids.size())});
  return logits[logits.size(0) - 1];
}

// Steps the engine, adding `arrivals[k]` before step k; returns every final output by id.
std::map<std::string, RequestOutput> run_with_arrivals(
    LlmEngine& eng, std::map<int, std::vector<GenerateRequest>> arrivals) {
  std::map<std::string, RequestOutput> done;
  for (int step = 0; step < 10000; ++step) {
    auto it = arrivals.find(step);
    if (it != arrivals.end()) {
      for (auto& r : it->second) eng.add_request(r);
      arrivals.erase(it);
    }
    for (auto& out : eng.step()) {
      if (out.finished) done[out.request_id] = out;
    }
    if (arrivals.empty() && !eng.has_unfinished()) break;
  }
  return done;
}

class EngineVsFullForwardTest : public ::testing::TestWithParam<std::string> {};

TEST_P(EngineVsFullForwardTest, PagedContinuousBatchingMatchesFullForwardAtEveryStep) {
  EngineConfig cfg = test::test_engine_config(GetParam());
  cfg.max_batched_tokens = 16;  // 37-token prompts are prefilled in chunks
  LlmEngine eng(cfg);
  std::map<LogitsKey, at::Tensor> seen;
  eng.set_logits_observer([&](const std::string& id, int32_t, int64_t pos, const at::Tensor& l) {
    seen[{id, pos}] = l.clone();
  });
  std::mt19937 rng(1);
  auto a = random_tokens(rng, 37);
  auto c = std::vector<int32_t>(a.begin(), a.begin() + 24);  // shares 6 full blocks with a
  auto tail = random_tokens(rng, 9);
  c.insert(c.end(), tail.begin(), tail.end());
  std::map<int, std::vector<GenerateRequest>> arrivals;
  arrivals[0] = {greedy("a", a, 10)};
  arrivals[2] = {greedy("b", random_tokens(rng, 5), 12), greedy("d", random_tokens(rng, 21), 9)};
  arrivals[5] = {greedy("c", c, 8)};
  auto done = run_with_arrivals(eng, std::move(arrivals));
  ASSERT_EQ(done.size(), 4u);
  EXPECT_GT(eng.stats().prefix_hit_tokens, 0) << "request c should reuse a's prompt blocks";
  EXPECT_GE(done["c"].num_cached_tokens, 24);

  for (auto& [id, out] : done) {
    const auto& gen = out.outputs.at(0).token_ids;
    std::vector<int32_t> tokens = out.prompt_token_ids;
    for (size_t i = 0; i < gen.size(); ++i) {
      auto ref = full_forward_last(eng.model(), tokens);
      const int64_t pos = static_cast<int64_t>(tokens.size());
      ASSERT_TRUE(seen.count({id, pos})) << id << " @" << pos;
      test::expect_tensor_near(seen[{id, pos}], ref, 1e-4);
      EXPECT_EQ(ref.argmax().item<int64_t>(), gen[i]) << "request " << id << " token " << i;
      tokens.push_back(gen[i]);
    }
  }
  EXPECT_EQ(eng.scheduler().allocator().num_free_blocks(), cfg.num_kv_blocks);
}

// Runs a reference script (`python script model_dir ids...`, printing the last position's logits
// as one JSON list); its exit status in *status.
at::Tensor reference_logits(const std::string& python, const std::string& script,
                            const std::string& model_dir, const std::vector<int32_t>& ids,
                            int* status, std::string* output) {
  std::string cmd = python + " " + CRL_SOURCE_DIR + "/tests/engine/" + script + " " + model_dir;
  for (int32_t t : ids) cmd += " " + std::to_string(t);
  std::string out;
  FILE* p = ::popen((cmd + " 2>&1").c_str(), "r");
  if (!p) throw std::runtime_error("popen failed: " + cmd);
  char buf[4096];
  for (size_t n; (n = std::fread(buf, 1, sizeof buf, p)) > 0;) out.append(buf, n);
  const int rc = ::pclose(p);
  *status = WIFEXITED(rc) ? WEXITSTATUS(rc) : 128;
  *output = out.substr(0, 2000);
  if (*status != 0) return at::Tensor();
  // The last line: transformers may warn before it.
  const size_t nl = out.find_last_of('\n', out.size() >= 2 ? out.size() - 2 : 0);
  const std::string last = nl == std::string::npos ? out : out.substr(nl + 1);
  return at::tensor(nlohmann::json::parse(last).get<std::vector<double>>(), at::kDouble);
}

// `model_dir` with its config.json as transformers 5 saves it: rope_parameters {rope_type,
// rope_theta, the scaling's fields} in place of rope_theta and rope_scaling, dtype for
// torch_dtype; the other files linked.
void write_transformers5_config_copy(const std::string& model_dir, const std::string& out_dir) {
  namespace fs = std::filesystem;
  for (const auto& e : fs::directory_iterator(model_dir)) {
    if (e.path().filename() != "config.json") {
      fs::create_symlink(fs::absolute(e.path()), fs::path(out_dir) / e.path().filename());
    }
  }
  std::ifstream in(model_dir + "/config.json");
  nlohmann::json c = nlohmann::json::parse(in);
  nlohmann::json rope = {{"rope_type", "default"}, {"rope_theta", c.at("rope_theta")}};
  if (c.contains("rope_scaling") && c["rope_scaling"].is_object()) {
    for (const auto& [k, v] : c["rope_scaling"].items()) {
      if (k != "type") rope[k] = v;
    }
  }
  c.erase("rope_theta");
  c.erase("rope_scaling");
  c["rope_parameters"] = rope;
  if (c.contains("torch_dtype")) {
    c["dtype"] = c["torch_dtype"];
    c.erase("torch_dtype");
  }
  std::ofstream(out_dir + "/config.json") << c.dump(2);
}

// The full forward against an independent float64 PyTorch forward of the same checkpoint
// (tests/engine/hf_reference.py, written from the transformers definitions): each family's
// architecture (Qwen3's per-head q/k norms and head_dim included) is what Hugging Face computes.
TEST_P(EngineVsFullForwardTest, FullForwardMatchesAnIndependentPyTorchReference) {
  EngineConfig cfg = test::test_engine_config(GetParam());
  LlmEngine eng(cfg);
  std::mt19937 rng(11);
  auto ids = random_tokens(rng, 13);
  int status = 0;
  std::string out;
  at::Tensor ref =
      reference_logits("/usr/bin/python3", "hf_reference.py", cfg.model_dir, ids, &status, &out);
  ASSERT_EQ(status, 0) << "the reference needs Debian's /usr/bin/python3 with torch "
                          "(scripts/bootstrap.sh installs python3-torch): "
                       << out;
  test::expect_tensor_near(full_forward_last(eng.model(), ids).to(at::kDouble), ref, 2e-3, 1e-4);
}

// A checkpoint whose config.json transformers 5 wrote (rope_parameters in place of rope_theta and
// rope_scaling) is the same model: the engine's logits are equal, and so are the reference's.
TEST_P(EngineVsFullForwardTest, ATransformers5ConfigIsTheSameModel) {
  EngineConfig cfg = test::test_engine_config(GetParam());
  test::TempDir dir;
  write_transformers5_config_copy(cfg.model_dir, dir.path());
  std::mt19937 rng(11);
  auto ids = random_tokens(rng, 13);
  at::Tensor want = full_forward_last(LlmEngine(cfg).model(), ids);
  EngineConfig cfg5 = cfg;
  cfg5.model_dir = dir.path();
  EXPECT_TRUE(full_forward_last(LlmEngine(cfg5).model(), ids).equal(want));
  int status = 0;
  std::string out;
  at::Tensor ref =
      reference_logits("/usr/bin/python3", "hf_reference.py", dir.path(), ids, &status, &out);
  ASSERT_EQ(status, 0) << out;
  test::expect_tensor_near(want.to(at::kDouble), ref, 2e-3, 1e-4);
}

// The full forward against transformers' own modelling code (tests/engine/
// hf_transformers_reference.py under CRL_HF_PYTHON, a python with transformers: the GPU build
// path's venv has one, and .ci/run sets it), on the checkpoint as written and with its config as
// transformers 5 saves it. The hand-written reference above shares the engine's reading of
// config.json; this one does not (it caught rope_parameters being ignored by both).
TEST_P(EngineVsFullForwardTest, FullForwardMatchesTransformers) {
  const char* python = std::getenv("CRL_HF_PYTHON");
  if (!python || !*python) GTEST_SKIP() << "CRL_HF_PYTHON is not set (a python with transformers)";
  EngineConfig cfg = test::test_engine_config(GetParam());
  test::TempDir dir;
  write_transformers5_config_copy(cfg.model_dir, dir.path());
  std::mt19937 rng(11);
  auto ids = random_tokens(rng, 13);
  for (const std::string& model_dir : {cfg.model_dir, dir.path()}) {
    EngineConfig c = cfg;
    c.model_dir = model_dir;
    at::Tensor want = full_forward_last(LlmEngine(c).model(), ids).to(at::kDouble);
    int status = 0;
    std::string out;
    at::Tensor ref =
        reference_logits(python, "hf_transformers_reference.py", model_dir, ids, &status, &out);
    ASSERT_EQ(status, 0) << "CRL_HF_PYTHON=" << python << " on " << model_dir << ": " << out;
    test::expect_tensor_near(want, ref, 2e-3, 1e-4);
  }
}

INSTANTIATE_TEST_SUITE_P(Models, EngineVsFullForwardTest,
                         ::testing::Values("llama", "qwen2", "llama3", "qwen3"));

// --- The CUDA path (ctest label `gpu`; skipped where no CUDA device is present). ---

// fp32 on the device: the paged, continuously batched, chunked engine against the plain full
// forward of the same device model (cuBLAS may pick other algorithms per shape: 2e-3).
// A later turn (the earlier prompt, its reply as sampled, new text) prefills only what the cache
// cannot hold: every id the earlier sequence computed is a hit, its full blocks and its unfilled
// last block (copied), and the later turn's logits are the full forward's.
TEST(LlmEngineTest, ALaterTurnReusesEveryIdTheEarlierTurnComputed) {
  EngineConfig cfg = test::test_engine_config("llama");
  LlmEngine eng(cfg);
  std::map<LogitsKey, at::Tensor> seen;
  eng.set_logits_observer([&](const std::string& id, int32_t, int64_t pos, const at::Tensor& l) {
    seen[{id, pos}] = l.clone();
  });
  std::mt19937 rng(4);
  GenerateRequest first = greedy("t1", random_tokens(rng, 23), 29);
  const RequestOutput a = eng.generate({first}).at(0);
  ASSERT_EQ(a.outputs[0].token_ids.size(), 29u);
  GenerateRequest second = greedy("t2", first.prompt_token_ids, 5);
  for (int32_t t : a.outputs[0].token_ids) second.prompt_token_ids.push_back(t);
  for (int32_t t : random_tokens(rng, 9)) second.prompt_token_ids.push_back(t);
  const RequestOutput b = eng.generate({second}).at(0);
  // 23 + 29 ids, the last sampled one never fed: 51 computed, 12 full blocks of 4 and 3 ids.
  ASSERT_EQ(cfg.block_size, 4);
  EXPECT_EQ(b.num_cached_tokens, 23 + 29 - 1);
  std::vector<int32_t> tokens = b.prompt_token_ids;
  for (int32_t t : b.outputs[0].token_ids) {
    const int64_t pos = static_cast<int64_t>(tokens.size());
    ASSERT_TRUE(seen.count({"t2", pos}));
    test::expect_tensor_near(seen[{"t2", pos}], full_forward_last(eng.model(), tokens), 1e-4);
    tokens.push_back(t);
  }
  EXPECT_EQ(eng.scheduler().allocator().num_free_blocks(), cfg.num_kv_blocks);
}

TEST(CudaEngineTest, PagedContinuousBatchingMatchesFullForwardOnCuda) {
  if (!at::hasCUDA()) GTEST_SKIP() << "no CUDA device";
  for (const std::string variant : {"llama", "qwen2"}) {
    SCOPED_TRACE(variant);
    EngineConfig cfg = test::test_engine_config(variant);
    cfg.device = "cuda";
    cfg.max_batched_tokens = 16;
    LlmEngine eng(cfg);
    ASSERT_TRUE(eng.model().options().device.is_cuda());
    std::map<LogitsKey, at::Tensor> seen;
    eng.set_logits_observer([&](const std::string& id, int32_t, int64_t pos, const at::Tensor& l) {
      seen[{id, pos}] = l.to(at::kCPU, at::kFloat, false, true);
    });
    std::mt19937 rng(3);
    auto a = random_tokens(rng, 37);
    std::map<int, std::vector<GenerateRequest>> arrivals;
    arrivals[0] = {greedy("a", a, 8)};
    arrivals[2] = {greedy("b", random_tokens(rng, 5), 10), greedy("c", random_tokens(rng, 21), 7)};
    auto done = run_with_arrivals(eng, std::move(arrivals));
    ASSERT_EQ(done.size(), 3u);
    for (auto& [id, out] : done) {
      const auto& gen = out.outputs.at(0).token_ids;
      std::vector<int32_t> tokens = out.prompt_token_ids;
      for (size_t i = 0; i < gen.size(); ++i) {
        auto ref = full_forward_last(eng.model(), tokens).to(at::kCPU, at::kFloat);
        const int64_t pos = static_cast<int64_t>(tokens.size());
        ASSERT_TRUE(seen.count({id, pos})) << id << " @" << pos;
        test::expect_tensor_near(seen[{id, pos}], ref, 2e-3);
        EXPECT_EQ(ref.argmax().item<int64_t>(), gen[i]) << "request " << id << " token " << i;
        tokens.push_back(gen[i]);
      }
    }
    EXPECT_EQ(eng.scheduler().allocator().num_free_blocks(), cfg.num_kv_blocks);
  }
}

// A bf16 engine (weights and KV) on `device` against the fp32 CPU full forward of the same
// checkpoint: the relative error of each step's logits is that of bf16 (< 3e-2), never NaN.
void expect_bf16_engine_tracks_the_fp32_forward(const std::string& device,
                                                const std::string& cpu_kernels) {
  EngineConfig cpu_cfg = test::test_engine_config("llama3");
  LlmEngine cpu_eng(cpu_cfg);
  EngineConfig cfg = cpu_cfg;
  cfg.device = device;
  cfg.dtype = "bfloat16";
  cfg.cpu_kernels = cpu_kernels;
  cfg.max_batched_tokens = 16;
  LlmEngine eng(cfg);
  std::map<LogitsKey, at::Tensor> seen;
  eng.set_logits_observer([&](const std::string& id, int32_t, int64_t pos, const at::Tensor& l) {
    seen[{id, pos}] = l.to(at::kCPU, at::kFloat, false, true);
  });
  std::mt19937 rng(5);
  std::map<int, std::vector<GenerateRequest>> arrivals;
  arrivals[0] = {greedy("a", random_tokens(rng, 30), 6), greedy("b", random_tokens(rng, 9), 6)};
  arrivals[2] = {greedy("c", random_tokens(rng, 12), 6), greedy("d", random_tokens(rng, 5), 6)};
  auto done = run_with_arrivals(eng, std::move(arrivals));
  ASSERT_EQ(done.size(), 4u);
  for (auto& [id, out] : done) {
    std::vector<int32_t> tokens = out.prompt_token_ids;
    for (int32_t t : out.outputs.at(0).token_ids) {
      auto ref = full_forward_last(cpu_eng.model(), tokens);
      const auto& got = seen.at({id, static_cast<int64_t>(tokens.size())});
      ASSERT_FALSE(got.isnan().any().item<bool>());
      const double rel = (got - ref).norm().item<double>() / ref.norm().item<double>();
      EXPECT_LT(rel, 3e-2) << id << " @" << tokens.size();
      tokens.push_back(t);
    }
  }
}

TEST(CudaEngineTest, Bf16EngineOnCudaTracksTheFp32CpuForward) {
  if (!at::hasCUDA()) GTEST_SKIP() << "no CUDA device";
  expect_bf16_engine_tracks_the_fp32_forward("cuda", "auto");
}

// On the CPU, both linear paths of a bf16 engine: the project's kernels (vdpbf16ps where the CPU
// has AVX512-BF16, steps of 3+ tokens; kernels::bf16_dot_supported) and libtorch's.
TEST(LlmEngineTest, Bf16EngineOnCpuTracksTheFp32ForwardOnEveryLinearPath) {
  for (const char* kernels : {"auto", "libtorch"}) {
    SCOPED_TRACE(std::string("cpu_kernels ") + kernels + ", bf16 dot kernel " +
                 (kernels::bf16_dot_supported() ? "available" : "not available"));
    expect_bf16_engine_tracks_the_fp32_forward("cpu", kernels);
  }
}

// Decode steps replaying CUDA graphs (padded to their bucket) against the eager engine: the same
// tokens and log-probs to cuBLAS's tolerance across shapes, over requests that finish at different
// steps (the batch shrinks through the buckets) and n > 1 forks (copy-on-write block copies).
TEST(CudaEngineTest, DecodeGraphsGiveTheEagerEnginesOutputs) {
  if (!at::hasCUDA()) GTEST_SKIP() << "no CUDA device";
  for (const std::string variant : {"llama", "qwen2"}) {
    SCOPED_TRACE(variant);
    EngineConfig cfg = test::test_engine_config(variant);
    cfg.device = "cuda";
    cfg.max_seqs = 12;
    std::vector<GenerateRequest> reqs;
    std::mt19937 rng(8);
    for (int i = 0; i < 9; ++i) {
      GenerateRequest r = greedy("r" + std::to_string(i), random_tokens(rng, 3 + 4 * i), 4 + 3 * i);
      if (i % 3 == 1) {
        r.params.temperature = 0.8;
        r.params.seed = 50 + i;
      }
      if (i == 4) r.params.n = 3;
      reqs.push_back(r);
    }
    cfg.cuda_graphs = "off";
    LlmEngine eager(cfg);
    EXPECT_EQ(eager.runner().num_cuda_graphs(), 0);
    cfg.cuda_graphs = "auto";  // on, on a CUDA device
    LlmEngine graphed(cfg);
    const auto a = eager.generate(reqs);
    const auto b = graphed.generate(reqs);
    EXPECT_GT(graphed.runner().num_cuda_graphs(), 0);
    for (size_t i = 0; i < a.size(); ++i) {
      ASSERT_EQ(a[i].outputs.size(), b[i].outputs.size());
      for (size_t k = 0; k < a[i].outputs.size(); ++k) {
        SCOPED_TRACE(a[i].request_id + " sample " + std::to_string(k));
        EXPECT_EQ(a[i].outputs[k].token_ids, b[i].outputs[k].token_ids);
        const auto& x = a[i].outputs[k].raw_logprobs;
        const auto& y = b[i].outputs[k].raw_logprobs;
        ASSERT_EQ(x.size(), y.size());
        for (size_t t = 0; t < x.size(); ++t) EXPECT_NEAR(x[t], y[t], 2e-3);
      }
    }
    EXPECT_EQ(graphed.scheduler().allocator().num_free_blocks(), cfg.num_kv_blocks);
  }
}

TEST(LlmEngineTest, CudaGraphsOffCudaAreAClearError) {
  EngineConfig cfg = test::test_engine_config();
  cfg.cuda_graphs = "auto";  // off on the CPU
  EXPECT_EQ(LlmEngine(cfg).runner().num_cuda_graphs(), 0);
  cfg.cuda_graphs = "on";
  ASSERT_THROWS_WITH(LlmEngine{cfg}, std::invalid_argument,
                     "CUDA graphs need the model on a CUDA device");
}

TEST(CudaEngineTest, DeterministicModeOnCudaIsAClearError) {
  if (!at::hasCUDA()) GTEST_SKIP() << "no CUDA device";
  EngineConfig cfg = test::test_engine_config();
  cfg.device = "cuda";
  cfg.deterministic = true;
  ASSERT_THROWS_WITH(LlmEngine{cfg}, std::invalid_argument, "deterministic");
}

TEST(LlmEngineTest, DeterministicModeLogitsAreBitIdenticalWhateverTheBatch) {
  std::mt19937 rng(2);
  auto x = random_tokens(rng, 30);
  auto sharer = std::vector<int32_t>(x.begin(), x.begin() + 20);
  auto extra = random_tokens(rng, 7);
  sharer.insert(sharer.end(), extra.begin(), extra.end());

  auto collect = [&](EngineConfig cfg, std::map<int, std::vector<GenerateRequest>> arrivals) {
    cfg.deterministic = true;
    LlmEngine eng(cfg);
    std::map<int64_t, at::Tensor> logits;
    eng.set_logits_observer([&](const std::string& id, int32_t, int64_t pos, const at::Tensor& l) {
      if (id == "x") logits[pos] = l.clone();
    });
    auto done = run_with_arrivals(eng, std::move(arrivals));
    return std::make_pair(logits, done["x"].outputs.at(0).token_ids);
  };
  EngineConfig alone_cfg = test::test_engine_config();
  alone_cfg.max_batched_tokens = 64;
  auto [alone, alone_tokens] = collect(alone_cfg, {{0, {greedy("x", x, 12)}}});

  EngineConfig busy_cfg = test::test_engine_config();
  busy_cfg.max_batched_tokens = 7;  // different chunking
  std::map<int, std::vector<GenerateRequest>> arrivals;
  arrivals[0] = {greedy("s", sharer, 4), greedy("o1", random_tokens(rng, 13), 20)};
  arrivals[6] = {greedy("x", x, 12), greedy("o2", random_tokens(rng, 3), 15)};
  arrivals[9] = {greedy("o3", random_tokens(rng, 40), 6)};
  auto [busy, busy_tokens] = collect(busy_cfg, std::move(arrivals));

  EXPECT_EQ(alone_tokens, busy_tokens);
  ASSERT_EQ(alone.size(), busy.size());
  for (auto& [pos, l] : alone) test::expect_tensor_equal(busy[pos], l);
}

// Deterministic mode owes its guarantee to the project's kernels, not to the CPU: every kernel
// path this CPU can run (scalar, AVX2, AVX-512) gives the same logits, bit for bit.
TEST(LlmEngineTest, DeterministicModeLogitsAreTheSameOnEveryKernelPath) {
  std::mt19937 rng(5);
  const auto prompt = random_tokens(rng, 21);
  const auto other = random_tokens(rng, 9);
  std::vector<std::map<int64_t, at::Tensor>> runs;
  for (kernels::CpuIsa isa : kernels::supported_cpu_isas()) {
    kernels::ScopedCpuIsa path(isa);
    EngineConfig cfg = test::test_engine_config();
    cfg.deterministic = true;
    cfg.max_batched_tokens = 16;
    LlmEngine eng(cfg);
    std::map<int64_t, at::Tensor> logits;
    eng.set_logits_observer([&](const std::string& id, int32_t, int64_t pos, const at::Tensor& l) {
      if (id == "x") logits[pos] = l.clone();
    });
    eng.generate({greedy("x", prompt, 6), greedy("y", other, 8)});
    runs.push_back(std::move(logits));
  }
  for (size_t i = 1; i < runs.size(); ++i) {
    SCOPED_TRACE(kernels::cpu_isa_name(kernels::supported_cpu_isas()[i]));
    ASSERT_EQ(runs[i].size(), runs[0].size());
    for (auto& [pos, l] : runs[0]) test::expect_tensor_equal(runs[i][pos], l);
  }
}

TEST(LlmEngineTest, SamplesShareThePromptBlocksUntilCopyOnWrite) {
  EngineConfig cfg = test::test_engine_config();
  LlmEngine eng(cfg);
  std::mt19937 rng(3);
  GenerateRequest r;
  r.prompt_token_ids = random_tokens(rng, 18);  // 4 full blocks + 2 tokens in a fifth
  r.params.n = 4;
  r.params.max_tokens = 6;
  r.params.ignore_eos = true;
  r.params.seed = 9;
  eng.add_request(r);
  const auto& alloc = eng.scheduler().allocator();
  eng.step();  // prefill + first sample of each of the 4 samples, then the fork
  EXPECT_EQ(eng.scheduler().num_running(), 4u);
  EXPECT_EQ(alloc.num_used_blocks(), 5) << "the 4 samples share the prompt's 5 blocks";
  eng.step();  // 3 samples copy the shared partial block; the last one owns the original
  EXPECT_EQ(alloc.num_used_blocks(), 8);
  std::vector<RequestOutput> outs;
  while (eng.has_unfinished()) {
    for (auto& o : eng.step()) {
      if (o.finished) outs.push_back(o);
    }
  }
  ASSERT_EQ(outs.size(), 1u);
  ASSERT_EQ(outs[0].outputs.size(), 4u);
  EXPECT_NE(outs[0].outputs[0].token_ids, outs[0].outputs[1].token_ids);
  EXPECT_EQ(alloc.num_free_blocks(), alloc.num_blocks());
  alloc.check_invariants();
}

TEST(LlmEngineTest, PreemptionUnderATinyPoolGivesTheSameGreedyOutput) {
  std::mt19937 rng(4);
  std::vector<GenerateRequest> reqs;
  for (int i = 0; i < 6; ++i)
    reqs.push_back(greedy("r" + std::to_string(i), random_tokens(rng, 20), 20));
  EngineConfig ample = test::test_engine_config();
  EngineConfig tiny = ample;
  tiny.num_kv_blocks = 14;  // one sequence needs 10 blocks at the end
  LlmEngine a(ample), t(tiny);
  auto out_a = a.generate(reqs);
  auto out_t = t.generate(reqs);
  EXPECT_GT(t.stats().preemptions, 0);
  EXPECT_EQ(a.stats().preemptions, 0);
  for (size_t i = 0; i < reqs.size(); ++i) {
    EXPECT_EQ(out_a[i].outputs[0].token_ids, out_t[i].outputs[0].token_ids) << "request " << i;
  }
  EXPECT_EQ(t.scheduler().allocator().num_free_blocks(), tiny.num_kv_blocks);
  t.scheduler().allocator().check_invariants();
}

TEST(LlmEngineTest, RawLogprobsEqualLogSoftmaxOfTheFullForward) {
  EngineConfig cfg = test::test_engine_config("qwen2");
  LlmEngine eng(cfg);
  std::mt19937 rng(5);
  GenerateRequest r;
  r.prompt_token_ids = random_tokens(rng, 11);
  r.params.n = 3;
  r.params.temperature = 0.8;
  r.params.top_k = 20;
  r.params.top_p = 0.9;
  r.params.max_tokens = 8;
  r.params.ignore_eos = true;
  r.params.seed = 1;
  r.params.logprobs = 3;
  auto out = eng.generate({r})[0];
  ASSERT_EQ(out.outputs.size(), 3u);
  for (const auto& c : out.outputs) {
    std::vector<int32_t> tokens = out.prompt_token_ids;
    ASSERT_EQ(c.raw_logprobs.size(), c.token_ids.size());
    ASSERT_EQ(c.top_logprobs.size(), c.token_ids.size());
    for (size_t i = 0; i < c.token_ids.size(); ++i) {
      auto lp = at::log_softmax(full_forward_last(eng.model(), tokens), -1);
      EXPECT_NEAR(c.raw_logprobs[i], lp[c.token_ids[i]].item<float>(), 1e-4);
      EXPECT_LE(c.processed_logprobs[i], 0.0f);
      EXPECT_EQ(c.top_logprobs[i].size(), 3u);
      EXPECT_NEAR(c.top_logprobs[i][0].second, lp.max().item<float>(), 1e-4);
      tokens.push_back(c.token_ids[i]);
    }
  }
}

TEST(LlmEngineTest, PromptLogprobsEqualTheFullForwardAcrossChunks) {
  EngineConfig cfg = test::test_engine_config();
  cfg.max_batched_tokens = 8;
  LlmEngine eng(cfg);
  std::mt19937 rng(6);
  GenerateRequest r = greedy("p", random_tokens(rng, 29), 2);
  r.params.prompt_logprobs = 2;
  auto out = eng.generate({r})[0];
  std::vector<int64_t> ids(out.prompt_token_ids.begin(), out.prompt_token_ids.end());
  auto lp = at::log_softmax(eng.model().forward_packed(at::tensor(ids, at::kLong), {29}), -1);
  ASSERT_EQ(out.prompt_logprobs.size(), 28u);
  for (int64_t p = 0; p < 28; ++p) {
    EXPECT_NEAR(out.prompt_logprobs[p], lp[p][ids[p + 1]].item<float>(), 1e-4) << "position " << p;
    EXPECT_EQ(out.prompt_top_logprobs[p].size(), 2u);
  }
}

TEST(LlmEngineTest, SeededSamplingIsReproducibleAndIndependentOfTheBatch) {
  std::mt19937 rng(7);
  GenerateRequest r;
  r.request_id = "x";
  r.prompt_token_ids = random_tokens(rng, 9);
  r.params.n = 2;
  r.params.temperature = 1.0;
  r.params.max_tokens = 16;
  r.params.ignore_eos = true;
  r.params.seed = 77;
  EngineConfig cfg = test::test_engine_config();
  cfg.deterministic = true;
  LlmEngine alone(cfg);
  auto a = alone.generate({r})[0];
  LlmEngine busy(cfg);
  std::map<int, std::vector<GenerateRequest>> arrivals;
  arrivals[0] = {greedy("o1", random_tokens(rng, 25), 10)};
  arrivals[3] = {r, greedy("o2", random_tokens(rng, 6), 30)};
  auto b = run_with_arrivals(busy, std::move(arrivals))["x"];
  ASSERT_EQ(a.outputs.size(), 2u);
  ASSERT_EQ(b.outputs.size(), 2u);
  EXPECT_EQ(a.outputs[0].token_ids, b.outputs[0].token_ids);
  EXPECT_EQ(a.outputs[1].token_ids, b.outputs[1].token_ids);
  EXPECT_NE(a.outputs[0].token_ids, a.outputs[1].token_ids) << "samples need distinct streams";
}

}  // namespace
}  // namespace crl::engine

namespace crl::engine {
namespace {

TEST(LlmEngineTest, AFailedStepFailsOnlyItsRequestsAndTheEngineCarriesOn) {
  EngineConfig cfg = test::test_engine_config();
  LlmEngine eng(cfg);
  std::mt19937 rng(11);
  at::Tensor norm;
  for (const auto& [name, t] : eng.model().named_parameters()) {
    if (name == "model.norm.weight") norm = t;
  }
  ASSERT_TRUE(norm.defined());
  const at::Tensor saved = norm.clone();
  norm.fill_(std::numeric_limits<float>::quiet_NaN());  // every logit becomes NaN
  auto bad = eng.generate({greedy("bad", random_tokens(rng, 9), 5)})[0];
  EXPECT_TRUE(bad.finished);
  EXPECT_NE(bad.error.find("engine step failed"), std::string::npos) << bad.error;
  EXPECT_EQ(bad.outputs.at(0).finish_reason, FinishReason::kAbort);
  EXPECT_EQ(eng.scheduler().allocator().num_free_blocks(), cfg.num_kv_blocks);

  norm.copy_(saved);
  auto good = eng.generate({greedy("good", random_tokens(rng, 9), 5)})[0];
  EXPECT_TRUE(good.error.empty());
  EXPECT_EQ(good.outputs.at(0).token_ids.size(), 5u);
}

}  // namespace
}  // namespace crl::engine
