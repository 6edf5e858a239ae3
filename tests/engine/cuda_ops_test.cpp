// The fused CUDA ops (engine/kernels/cuda_ops.h) against the ATen composition they replace, and
// whole engines with and without them. CUDA-only (skipped without a device); `ctest -L gpu`.
#include "engine/kernels/cuda_ops.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <random>

#include "engine/llm_engine.h"
#include "engine/model/deterministic_ops.h"
#include "kv/paged_attention.h"
#include "tests/engine/engine_requests.h"
#include "tests/engine/test_model.h"

namespace crl::engine {
namespace {

at::Tensor aten_rope(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin) {
  const int64_t half = x.size(-1) / 2;
  auto x1 = x.narrow(-1, 0, half);
  auto x2 = x.narrow(-1, half, half);
  auto c = cos.unsqueeze(1);
  auto s = sin.unsqueeze(1);
  return at::cat({x1 * c - x2 * s, x2 * c + x1 * s}, -1);
}

// Share of elements equal bit for bit, and the relative error of the whole tensor.
void expect_close(const at::Tensor& got, const at::Tensor& want, double min_equal, double max_rel,
                  const std::string& what) {
  ASSERT_EQ(got.sizes(), want.sizes()) << what;
  const at::Tensor g = got.to(at::kCPU, at::kDouble), w = want.to(at::kCPU, at::kDouble);
  ASSERT_FALSE(g.isnan().any().item<bool>()) << what;
  const double equal = g.eq(w).to(at::kDouble).mean().item<double>();
  const double rel = (g - w).norm().item<double>() / std::max(w.norm().item<double>(), 1e-30);
  EXPECT_GE(equal, min_equal) << what << ": share of equal elements";
  EXPECT_LE(rel, max_rel) << what << ": relative error";
}

TEST(CudaFusedOpsTest, EachOpMatchesTheAtenComposition) {
  if (!at::hasCUDA() || !kernels::cuda_ops_built()) GTEST_SKIP() << "no CUDA device or build";
  at::manual_seed(3);
  for (at::ScalarType dt : {at::kFloat, at::kBFloat16}) {
    const auto opts = at::TensorOptions().dtype(dt).device(at::kCUDA);
    // float32: only the sum of squares' order differs; bfloat16 rounds at the same points.
    const double rel = dt == at::kFloat ? 1e-6 : 4e-3;
    for (int64_t rows : {1, 7, 256, 1031}) {
      for (int64_t h : {48, 896, 4864}) {
        const std::string what = std::string(c10::toString(dt)) + " rows " + std::to_string(rows) +
                                 " h " + std::to_string(h);
        const at::Tensor x = at::randn({rows, h}, opts) * 3;
        const at::Tensor w = at::randn({h}, opts);
        // float32: rsqrt of a differently ordered sum differs in its last bit for many rows, so
        // only the error bounds it; bfloat16's rounding hides that for nearly every element.
        expect_close(kernels::cuda_rms_norm(x, w, 1e-6), aten_rms_norm(x, w, 1e-6),
                     dt == at::kFloat ? 0.0 : 0.95, rel, "rms_norm " + what);
        const at::Tensor g = at::randn({rows, h}, opts) * 4;
        expect_close(kernels::cuda_silu_mul(g, x), at::silu(g) * x, 0.99, rel, "silu_mul " + what);
      }
    }
    // RoPE over q [T, 14, 64] and k [T, 2, 64] at scattered positions of real tables.
    const int64_t max_pos = 4096, half = 32;
    const at::Tensor inv = 1.0 / at::pow(1e6, at::arange(0, half, at::kDouble) * 2.0 / 64);
    const at::Tensor angle = at::arange(max_pos, at::kDouble).unsqueeze(1) * inv.unsqueeze(0);
    const at::Tensor cos_t = angle.cos().to(at::kFloat).to(at::kCUDA);
    const at::Tensor sin_t = angle.sin().to(at::kFloat).to(at::kCUDA);
    for (int64_t t : {1, 256, 3000}) {
      const at::Tensor pos =
          at::randint(0, max_pos, {t}, at::TensorOptions().dtype(at::kLong).device(at::kCUDA));
      at::Tensor q = at::randn({t, 14, 64}, opts), k = at::randn({t, 2, 64}, opts);
      const at::Tensor cos = cos_t.index_select(0, pos).to(dt),
                       sin = sin_t.index_select(0, pos).to(dt);
      const at::Tensor q_ref = aten_rope(q, cos, sin), k_ref = aten_rope(k, cos, sin);
      kernels::cuda_rope_(q, k, pos, cos_t, sin_t);
      const std::string what = std::string(c10::toString(dt)) + " t " + std::to_string(t);
      expect_close(q, q_ref, 0.99, rel, "rope q " + what);
      expect_close(k, k_ref, 0.99, rel, "rope k " + what);
    }
  }
  // Bad operands are errors naming the op, not a launch on garbage.
  const at::Tensor x = at::randn({4, 8}, at::TensorOptions().device(at::kCUDA));
  EXPECT_THROW(kernels::cuda_rms_norm(x, at::ones({9}, x.options()), 1e-6), std::exception);
  EXPECT_THROW(kernels::cuda_silu_mul(x, x.to(at::kBFloat16)), std::exception);
  EXPECT_THROW(kernels::cuda_rms_norm(x.cpu(), at::ones({8}), 1e-6), std::exception);
}

// The parts of a merged product (column ranges of one output, rows apart) read in place: the
// results of the same values made contiguous, bit for bit, and the rotation lands in the product.
TEST(CudaFusedOpsTest, RowsApartGiveTheContiguousResults) {
  if (!at::hasCUDA() || !kernels::cuda_ops_built()) GTEST_SKIP() << "no CUDA device or build";
  at::manual_seed(5);
  for (at::ScalarType dt : {at::kFloat, at::kBFloat16}) {
    const auto opts = at::TensorOptions().dtype(dt).device(at::kCUDA);
    for (int64_t rows : {1, 7, 300}) {
      const std::string what = std::string(c10::toString(dt)) + " rows " + std::to_string(rows);
      const at::Tensor gate_up = at::randn({rows, 2 * 608}, opts) * 3;  // [gate | up]
      const at::Tensor gate = gate_up.narrow(1, 0, 608), up = gate_up.narrow(1, 608, 608);
      ASSERT_FALSE(gate.is_contiguous());
      EXPECT_TRUE(at::equal(kernels::cuda_silu_mul(gate, up),
                            kernels::cuda_silu_mul(gate.contiguous(), up.contiguous())))
          << "silu_mul " << what;
      // q/k/v of 14 + 2 + 2 heads of 64: q and k rotated in place inside the product.
      const at::Tensor qkv = at::randn({rows, 18 * 64}, opts);
      const at::Tensor pos =
          at::randint(0, 4096, {rows}, at::TensorOptions().dtype(at::kLong).device(at::kCUDA));
      const at::Tensor inv = 1.0 / at::pow(1e6, at::arange(0, 32, at::kDouble) * 2.0 / 64);
      const at::Tensor angle = at::arange(4096, at::kDouble).unsqueeze(1) * inv.unsqueeze(0);
      const at::Tensor cos_t = angle.cos().to(at::kFloat).to(at::kCUDA);
      const at::Tensor sin_t = angle.sin().to(at::kFloat).to(at::kCUDA);
      at::Tensor q_ref = qkv.narrow(1, 0, 14 * 64).contiguous().view({rows, 14, 64});
      at::Tensor k_ref = qkv.narrow(1, 14 * 64, 2 * 64).contiguous().view({rows, 2, 64});
      const at::Tensor v_before = qkv.narrow(1, 16 * 64, 2 * 64).clone();
      kernels::cuda_rope_(q_ref, k_ref, pos, cos_t, sin_t);
      at::Tensor q = qkv.narrow(1, 0, 14 * 64).view({rows, 14, 64});
      at::Tensor k = qkv.narrow(1, 14 * 64, 2 * 64).view({rows, 2, 64});
      kernels::cuda_rope_(q, k, pos, cos_t, sin_t);
      EXPECT_TRUE(at::equal(q, q_ref)) << "rope q " << what;
      EXPECT_TRUE(at::equal(k, k_ref)) << "rope k " << what;
      EXPECT_TRUE(at::equal(qkv.narrow(1, 16 * 64, 2 * 64), v_before)) << "v untouched " << what;
    }
  }
  // A row that is not contiguous inside is refused, not read wrongly.
  const at::Tensor x = at::randn({8, 4}, at::TensorOptions().device(at::kCUDA));
  EXPECT_THROW(kernels::cuda_silu_mul(x.t(), x.t()), std::exception);
}

// `count` greedy requests (EOS ignored) of random ids, prompt i holding first + step * i of them.
std::vector<GenerateRequest> greedy_requests(int count, int first, int step, int max_tokens,
                                             uint32_t seed) {
  std::vector<GenerateRequest> reqs;
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int32_t> tok(3, 200);
  for (int i = 0; i < count; ++i) {
    GenerateRequest r;
    r.request_id = "r" + std::to_string(i);
    for (int j = 0; j < first + step * i; ++j) r.prompt_token_ids.push_back(tok(rng));
    r.params.max_tokens = max_tokens;
    r.params.temperature = 0.0;
    r.params.ignore_eos = true;
    reqs.push_back(r);
  }
  return reqs;
}

// Whole engines, float32, with the fused ops and with ATen's: the same greedy tokens and log-probs
// to float32 rounding, for every model variant (qkv bias, Qwen3's per-head norms, llama3 RoPE).
TEST(CudaFusedOpsTest, EnginesWithAndWithoutTheFusedOpsAgree) {
  if (!at::hasCUDA() || !kernels::cuda_ops_built()) GTEST_SKIP() << "no CUDA device or build";
  for (const std::string variant : {"llama", "qwen2", "qwen3", "llama3"}) {
    SCOPED_TRACE(variant);
    EngineConfig cfg = test::test_engine_config(variant);
    cfg.device = "cuda";
    const std::vector<GenerateRequest> reqs = greedy_requests(6, 5, 9, 12, 11);
    cfg.gpu_kernels = "libtorch";
    const auto a = LlmEngine(cfg).generate(reqs);
    cfg.gpu_kernels = "auto";
    const auto b = LlmEngine(cfg).generate(reqs);
    test::expect_same_outputs(a, b, 1e-4);
  }
}

// Merged projections on the GPU (fused ops on: RoPE and the SiLU gate read the merged products'
// parts in place): the five products' tokens and log-probs, eagerly and in decode graphs.
TEST(CudaFusedOpsTest, EnginesWithMergedProjectionsGiveTheFiveProductsTokens) {
  if (!at::hasCUDA() || !kernels::cuda_ops_built()) GTEST_SKIP() << "no CUDA device or build";
  for (const std::string variant : {"llama", "qwen2", "qwen3"}) {
    SCOPED_TRACE(variant);
    EngineConfig cfg = test::test_engine_config(variant);
    cfg.device = "cuda";
    const std::vector<GenerateRequest> reqs = greedy_requests(6, 5, 9, 12, 13);
    const auto a = LlmEngine(cfg).generate(reqs);
    cfg.merge_projections = true;
    LlmEngine merged(cfg);
    EXPECT_EQ(merged.model().merged_layers(), merged.model_config().num_layers);
    const auto b = merged.generate(reqs);
    test::expect_same_outputs(a, b, 1e-4);
  }
}

// FlashInfer's decode attention inside whole bf16 engines (kv::CudaAttentionKernel::kFlashInfer):
// replayed in CUDA graphs it gives the eager engine's tokens and log-probs; against the project's
// v4 kernel (another summation order, bf16 rounding) vLLM's rule for two kernels: the same greedy
// tokens with log-probs to bf16's tolerance up to a first difference, where each run's token is
// among the other's top 5 (a near-tie that rounding flipped, not a wrong attention). A share of
// tokens before the first difference is no rule: a random model's near-ties decide it.
TEST(CudaEngineTest, FlashInferDecodeAttentionInGraphsMatchesTheEagerEngineAndV4) {
  if (!at::hasCUDA()) GTEST_SKIP() << "no CUDA device";
  if (!kv::cuda_attention_kernel_built(kv::CudaAttentionKernel::kFlashInfer)) {
    GTEST_SKIP() << "this build has no FlashInfer";
  }
  EngineConfig cfg = test::test_engine_config("qwen3-hd64");
  cfg.device = "cuda";
  cfg.dtype = "bfloat16";
  cfg.block_size = 16;
  cfg.max_batched_tokens = 512;
  std::vector<GenerateRequest> reqs = greedy_requests(10, 3, 23, 16, 13);
  for (auto& r : reqs) r.params.logprobs = 5;
  const kv::CudaAttentionKernel before = kv::cuda_attention_kernel();
  auto run = [&](kv::CudaAttentionKernel kernel, const char* graphs) {
    kv::set_cuda_attention_kernel(kernel);
    cfg.cuda_graphs = graphs;
    LlmEngine eng(cfg);
    auto out = eng.generate(reqs);
    if (std::string(graphs) == "auto") EXPECT_GT(eng.runner().num_cuda_graphs(), 0);
    return out;
  };
  const auto graphed = run(kv::CudaAttentionKernel::kFlashInfer, "auto");
  const auto eager = run(kv::CudaAttentionKernel::kFlashInfer, "off");
  const auto v4 = run(kv::CudaAttentionKernel::kFlash, "auto");
  kv::set_cuda_attention_kernel(before);
  size_t total = 0, common = 0;
  auto in_top = [](const auto& top, int32_t id) {
    return std::any_of(top.begin(), top.end(), [&](const auto& p) { return p.first == id; });
  };
  for (size_t i = 0; i < reqs.size(); ++i) {
    SCOPED_TRACE(reqs[i].request_id);
    const auto& g = graphed[i].outputs[0];
    EXPECT_EQ(g.token_ids, eager[i].outputs[0].token_ids);
    ASSERT_EQ(g.raw_logprobs.size(), eager[i].outputs[0].raw_logprobs.size());
    for (size_t t = 0; t < g.raw_logprobs.size(); ++t) {
      EXPECT_NEAR(g.raw_logprobs[t], eager[i].outputs[0].raw_logprobs[t], 2e-3) << "@" << t;
    }
    const auto& o = v4[i].outputs[0];
    size_t t = 0;
    for (; t < g.token_ids.size() && t < o.token_ids.size() && g.token_ids[t] == o.token_ids[t];
         ++t) {
      EXPECT_NEAR(g.raw_logprobs[t], o.raw_logprobs[t], 5e-2) << "@" << t;
    }
    if (t < g.token_ids.size() && t < o.token_ids.size()) {
      ASSERT_EQ(g.top_logprobs.size(), g.token_ids.size());
      ASSERT_EQ(o.top_logprobs.size(), o.token_ids.size());
      EXPECT_TRUE(in_top(o.top_logprobs[t], g.token_ids[t])) << "v4's top 5 lack token @" << t;
      EXPECT_TRUE(in_top(g.top_logprobs[t], o.token_ids[t])) << "FlashInfer's top 5 lack @" << t;
    }
    total += g.token_ids.size();
    common += t;
  }
  std::printf("FlashInfer and v4: %zu of %zu tokens before a first difference\n", common, total);
}

}  // namespace
}  // namespace crl::engine
