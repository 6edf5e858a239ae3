#include "kv/paged_attention.h"

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/Parallel.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <stdexcept>
#include <string>
#include <tuple>
#include <vector>

#include "tests/test_utils.h"

namespace crl::kv {
namespace {

struct SeqSpec {
  int64_t ctx;    // tokens in the cache after this step
  int64_t q_len;  // new tokens (query rows) of this step
};

// A packed batch whose K/V were scattered into shuffled cache blocks with plain libtorch ops; the
// rest of the cache and the unused block-table entries hold garbage.
struct Problem {
  std::vector<SeqSpec> seqs;
  at::Tensor q;                              // [T, num_heads, head_dim]
  at::Tensor k_cache, v_cache;               // [num_blocks, block_size, num_kv_heads, head_dim]
  std::vector<at::Tensor> dense_k, dense_v;  // per sequence [ctx, num_kv_heads, head_dim]
  PagedAttentionMetadata meta;
  int64_t group = 1;
  double scale = 1.0;
};

Problem make_problem(const std::vector<SeqSpec>& seqs, int64_t block_size, int64_t num_kv_heads,
                     int64_t group, int64_t head_dim, at::ScalarType dtype, uint64_t seed,
                     double q_mult = 1.0) {
  auto gen = at::detail::createCPUGenerator(seed);
  Problem p;
  p.seqs = seqs;
  p.group = group;
  p.scale = 1.0 / std::sqrt(static_cast<double>(head_dim));
  int64_t needed = 0, max_blocks = 1, rows = 0;
  for (const auto& s : seqs) {
    const int64_t nb = (s.ctx + block_size - 1) / block_size;
    needed += nb;
    max_blocks = std::max(max_blocks, nb + 2);
    rows += s.q_len;
  }
  const int64_t num_blocks = needed + 3;
  p.k_cache = at::randn({num_blocks, block_size, num_kv_heads, head_dim}, gen).to(dtype);
  p.v_cache = at::randn({num_blocks, block_size, num_kv_heads, head_dim}, gen).to(dtype);
  const at::Tensor perm = at::randperm(num_blocks, gen, at::kLong);
  at::Tensor tables =
      at::randint(-1000, 1000, {static_cast<int64_t>(seqs.size()), max_blocks}, gen, at::kInt);
  at::Tensor flat_k = p.k_cache.view({num_blocks * block_size, num_kv_heads, head_dim});
  at::Tensor flat_v = p.v_cache.view({num_blocks * block_size, num_kv_heads, head_dim});
  std::vector<int32_t> query_start{0}, context_lens;
  int64_t next_block = 0;
  for (size_t s = 0; s < seqs.size(); ++s) {
    const int64_t nb = (seqs[s].ctx + block_size - 1) / block_size;
    const at::Tensor blocks = perm.narrow(0, next_block, nb);
    next_block += nb;
    tables[s].narrow(0, 0, nb).copy_(blocks);
    const at::Tensor pos = at::arange(seqs[s].ctx, at::kLong);
    const at::Tensor slots = blocks.index_select(0, pos.div(block_size, "floor")) * block_size +
                             pos.remainder(block_size);
    p.dense_k.push_back(at::randn({seqs[s].ctx, num_kv_heads, head_dim}, gen).to(dtype));
    p.dense_v.push_back(at::randn({seqs[s].ctx, num_kv_heads, head_dim}, gen).to(dtype));
    flat_k.index_copy_(0, slots, p.dense_k.back());
    flat_v.index_copy_(0, slots, p.dense_v.back());
    query_start.push_back(static_cast<int32_t>(query_start.back() + seqs[s].q_len));
    context_lens.push_back(static_cast<int32_t>(seqs[s].ctx));
  }
  p.q = (at::randn({rows, num_kv_heads * group, head_dim}, gen) * q_mult).to(dtype);
  p.meta.query_start = at::tensor(query_start, at::kInt);
  p.meta.context_lens = at::tensor(context_lens, at::kInt);
  p.meta.block_tables = tables;
  p.meta.slot_mapping = at::zeros({rows}, at::kLong);  // unused by attention
  int64_t max_q = 0;
  for (const auto& s : seqs) max_q = std::max(max_q, s.q_len);
  p.meta.max_query_len = max_q;  // 1 for decode batches: what FlashInfer's decode dispatches on
  p.meta.max_context_len =
      context_lens.empty() ? 0 : *std::max_element(context_lens.begin(), context_lens.end());
  return p;
}

// Dense causal attention in float64 on the cache-dtype values: per sequence, GQA by
// repeat_interleave, query j at position ctx - q_len + j sees keys [0, that position].
at::Tensor reference_attention(const Problem& p) {
  std::vector<at::Tensor> outs;
  int64_t q0 = 0;
  for (size_t s = 0; s < p.seqs.size(); ++s) {
    const int64_t ctx = p.seqs[s].ctx, ql = p.seqs[s].q_len;
    if (ql == 0) continue;
    const at::Tensor k = p.dense_k[s].to(at::kDouble).repeat_interleave(p.group, 1);  // [ctx, H, D]
    const at::Tensor v = p.dense_v[s].to(at::kDouble).repeat_interleave(p.group, 1);
    const at::Tensor q = p.q.narrow(0, q0, ql).to(at::kDouble);  // [ql, H, D]
    at::Tensor scores =
        at::matmul(q.transpose(0, 1), k.permute({1, 2, 0})) * p.scale;  // [H, ql, ctx]
    const at::Tensor key_pos = at::arange(ctx, at::kLong).view({1, ctx});
    const at::Tensor query_pos = (at::arange(ql, at::kLong) + (ctx - ql)).view({ql, 1});
    scores.masked_fill_(key_pos > query_pos, -std::numeric_limits<double>::infinity());
    const at::Tensor probs = at::softmax(scores, -1);
    outs.push_back(at::matmul(probs, v.permute({1, 0, 2})).transpose(0, 1));  // [ql, H, D]
    q0 += ql;
  }
  return at::cat(outs, 0);
}

PagedAttentionMetadata meta_to(const PagedAttentionMetadata& m, const at::Device& device) {
  PagedAttentionMetadata out = m;
  out.slot_mapping = m.slot_mapping.to(device);
  out.query_start = m.query_start.to(device);
  out.context_lens = m.context_lens.to(device);
  out.block_tables = m.block_tables.to(device);
  return out;
}

// Runs the kernel on `device` and brings the result back to the CPU.
at::Tensor run_on(const Problem& p, const at::Device& device) {
  return paged_attention(p.q.to(device), p.k_cache.to(device), p.v_cache.to(device),
                         meta_to(p.meta, device), p.scale)
      .cpu();
}

void expect_matches_reference(const Problem& p, const at::Tensor& out) {
  ASSERT_EQ(out.scalar_type(), p.q.scalar_type());
  if (p.q.scalar_type() == at::kFloat) {
    test::expect_tensor_near(out, reference_attention(p), 1e-5);
  } else {
    // Output rounding to bfloat16 alone is up to 2^-9 relative.
    test::expect_tensor_near(out, reference_attention(p), 5e-3, 1e-2);
  }
}

// (device, block_size, group size, head_dim, dtype)
using Config = std::tuple<at::DeviceType, int64_t, int64_t, int64_t, at::ScalarType>;

class PagedAttentionTest : public ::testing::TestWithParam<Config> {
 protected:
  void SetUp() override {
    if (device_type() == at::kCUDA && !at::hasCUDA()) GTEST_SKIP() << "no CUDA device";
  }
  at::DeviceType device_type() const { return std::get<0>(GetParam()); }
  Problem make(const std::vector<SeqSpec>& seqs, uint64_t seed) const {
    const auto [dev, block_size, group, head_dim, dtype] = GetParam();
    return make_problem(seqs, block_size, /*num_kv_heads=*/2, group, head_dim, dtype, seed);
  }
};

// Every CUDA kernel (kv::CudaAttentionKernel) on CUDA; the one kernel on the CPU.
std::vector<CudaAttentionKernel> kernels_on(at::DeviceType dev) {
  if (dev != at::kCUDA) return {CudaAttentionKernel::kAuto};
  std::vector<CudaAttentionKernel> k = {CudaAttentionKernel::kUnrolled,
                                        CudaAttentionKernel::kFlash};
  if (kv::cuda_attention_kernel_built(CudaAttentionKernel::kFlashInfer)) {
    k.push_back(CudaAttentionKernel::kFlashInfer);
  }
  return k;
}

// Runs `p` with each kernel of `dev` and compares with the reference.
void expect_every_kernel_matches(const Problem& p, at::DeviceType dev) {
  const CudaAttentionKernel before = cuda_attention_kernel();
  for (CudaAttentionKernel k : kernels_on(dev)) {
    SCOPED_TRACE(std::string("kernel ") + cuda_attention_kernel_name(k));
    set_cuda_attention_kernel(k);
    expect_matches_reference(p, run_on(p, dev));
  }
  set_cuda_attention_kernel(before);
}

TEST_P(PagedAttentionTest, MatchesDenseReferenceForDecode) {
  const Problem p = make({{1, 1}, {5, 1}, {16, 1}, {17, 1}, {37, 1}, {100, 1}}, 11);
  expect_every_kernel_matches(p, device_type());
}

TEST_P(PagedAttentionTest, MatchesDenseReferenceForChunkedPrefillAfterCachedPrefix) {
  // Chunks continuing a cached prefix, a fresh prefill, a decode row and a sequence with no rows.
  const Problem p = make({{23, 7}, {40, 40}, {12, 0}, {9, 1}, {70, 33}}, 12);
  expect_every_kernel_matches(p, device_type());
}

std::string config_name(const ::testing::TestParamInfo<Config>& info) {
  const auto [dev, block_size, group, head_dim, dtype] = info.param;
  return std::string(dev == at::kCUDA ? "Cuda" : "Cpu") + "_Block" + std::to_string(block_size) +
         "_Group" + std::to_string(group) + "_Dim" + std::to_string(head_dim) + "_" +
         (dtype == at::kFloat ? "Float" : "BFloat16");
}

INSTANTIATE_TEST_SUITE_P(Cpu, PagedAttentionTest,
                         ::testing::Combine(::testing::Values(at::kCPU),
                                            ::testing::Values<int64_t>(16, 4),
                                            ::testing::Values<int64_t>(1, 3),
                                            ::testing::Values<int64_t>(64, 32),
                                            ::testing::Values(at::kFloat, at::kBFloat16)),
                         config_name);
#ifdef CRL_WITH_CUDA
INSTANTIATE_TEST_SUITE_P(Cuda, PagedAttentionTest,
                         ::testing::Combine(::testing::Values(at::kCUDA),
                                            ::testing::Values<int64_t>(16, 4),
                                            ::testing::Values<int64_t>(1, 3),
                                            ::testing::Values<int64_t>(64, 32),
                                            ::testing::Values(at::kFloat, at::kBFloat16)),
                         config_name);
#endif

// Contexts past 128 positions (many chunks of every warp's online softmax), the
// group sizes of Qwen2 (7, 6) and Llama-3 (4), 5 and 12 (v4's masked heads and its second pass),
// head_dim 64 and 128, decode and prefill rows.
TEST(CudaPagedAttentionTest, EveryKernelMatchesTheReferenceOnLongContextsAndWideGroups) {
  if (!at::hasCUDA()) GTEST_SKIP() << "no CUDA device";
  for (int64_t group : {7, 6, 4, 5, 12}) {  // 5: v4 masks heads; 12: v4 takes two passes
    for (int64_t head_dim : {64, 128}) {
      for (at::ScalarType dtype : {at::kFloat, at::kBFloat16}) {
        SCOPED_TRACE("group " + std::to_string(group) + " head_dim " + std::to_string(head_dim) +
                     (dtype == at::kFloat ? " float" : " bfloat16"));
        const Problem p = make_problem({{1, 1}, {128, 1}, {129, 1}, {300, 1}, {777, 1}, {260, 9}},
                                       16, 2, group, head_dim, dtype, 31 + group);
        expect_every_kernel_matches(p, at::kCUDA);
      }
    }
  }
}

// Restores FlashInfer's split setting when it goes out of scope.
class SplitWavesGuard {
 public:
  explicit SplitWavesGuard(int64_t waves) : saved_(flashinfer_split_waves()) {
    set_flashinfer_split_waves(waves);
  }
  ~SplitWavesGuard() { set_flashinfer_split_waves(saved_); }

 private:
  int64_t saved_;
};

// FlashInfer's decode kernel where it runs (decode rows only, bfloat16): the group sizes of
// Qwen3-0.6B (2), Llama-3 (4) and 8, and 5, 6 and Qwen2-0.5B's 7 (run as 8 with zero heads padded
// in), head_dim 64 and 128, contexts from one position to past 2k, on pages of 16 and 4; with no
// split-KV (waves 0), FlashInfer's bound (1), the default and 64 (chunks at their 128-position
// floor, up to 17 a sequence, merged); and a batch of 256 rows (the benchmark's). Float32 falls
// back to v4 and matches too.
TEST(CudaPagedAttentionTest, FlashInferDecodeMatchesTheReference) {
  if (!at::hasCUDA()) GTEST_SKIP() << "no CUDA device";
  if (!kv::cuda_attention_kernel_built(CudaAttentionKernel::kFlashInfer)) {
    GTEST_SKIP() << "this build has no FlashInfer";
  }
  const CudaAttentionKernel before = cuda_attention_kernel();
  set_cuda_attention_kernel(CudaAttentionKernel::kFlashInfer);
  for (int64_t waves : {int64_t{0}, int64_t{1}, kDefaultFlashInferWaves, int64_t{64}}) {
    const SplitWavesGuard split(waves);
    for (int64_t block_size : {16, 4}) {
      for (int64_t group : {1, 2, 4, 8, 7, 5, 6}) {
        for (int64_t head_dim : {64, 128}) {
          SCOPED_TRACE("waves " + std::to_string(waves) + " block " + std::to_string(block_size) +
                       " group " + std::to_string(group) + " head_dim " + std::to_string(head_dim));
          const Problem p =
              make_problem({{1, 1}, {15, 1}, {16, 1}, {17, 1}, {300, 1}, {777, 1}, {2100, 1}},
                           block_size, 2, group, head_dim, at::kBFloat16, 41 + group);
          expect_matches_reference(p, run_on(p, at::kCUDA));
        }
      }
    }
    std::vector<SeqSpec> many;
    for (int64_t i = 0; i < 256; ++i) many.push_back({1 + (i * 37) % 700, 1});
    for (int64_t group : {2, 7}) {
      SCOPED_TRACE("waves " + std::to_string(waves) + " 256 rows, group " + std::to_string(group));
      const Problem wide =
          make_problem(many, 16, 2, group, group == 2 ? 128 : 64, at::kBFloat16, 77);
      expect_matches_reference(wide, run_on(wide, at::kCUDA));
    }
  }
  const Problem f32 = make_problem({{9, 1}, {300, 1}}, 16, 2, 2, 128, at::kFloat, 78);
  expect_matches_reference(f32, run_on(f32, at::kCUDA));
  set_cuda_attention_kernel(before);
}

// FlashInfer's batch prefill (every call decode does not take, in bfloat16, when every sequence
// has query rows): fresh prompts, chunks continuing a cached prefix, decode rows among them,
// contexts past 2k, the groups of Qwen3 (2), Llama-3 (4), Qwen2 (7), 1 and 12 (past decode's 8),
// head_dim 64 and 128, pages of 16 and 4. A step with a sequence of no rows runs v4 and matches.
TEST(CudaPagedAttentionTest, FlashInferPrefillMatchesTheReference) {
  if (!at::hasCUDA()) GTEST_SKIP() << "no CUDA device";
  if (!kv::cuda_attention_kernel_built(CudaAttentionKernel::kFlashInfer)) {
    GTEST_SKIP() << "this build has no FlashInfer";
  }
  const CudaAttentionKernel before = cuda_attention_kernel();
  set_cuda_attention_kernel(CudaAttentionKernel::kFlashInfer);
  for (int64_t block_size : {16, 4}) {
    for (int64_t group : {1, 2, 4, 7, 12}) {
      for (int64_t head_dim : {64, 128}) {
        SCOPED_TRACE("block " + std::to_string(block_size) + " group " + std::to_string(group) +
                     " head_dim " + std::to_string(head_dim));
        const Problem p =
            make_problem({{23, 7}, {40, 40}, {9, 1}, {70, 33}, {600, 128}, {2100, 300}, {1, 1}},
                         block_size, 2, group, head_dim, at::kBFloat16, 51 + group);
        expect_matches_reference(p, run_on(p, at::kCUDA));
      }
    }
  }
  const Problem decode_wide =
      make_problem({{300, 1}, {1200, 1}}, 16, 2, 12, 128, at::kBFloat16, 57);
  expect_matches_reference(decode_wide, run_on(decode_wide, at::kCUDA));
  const Problem empty_row =
      make_problem({{23, 7}, {12, 0}, {70, 33}}, 16, 2, 2, 64, at::kBFloat16, 58);
  expect_matches_reference(empty_row, run_on(empty_row, at::kCUDA));
  set_cuda_attention_kernel(before);
}

// A step's FlashInfer plan is built by its first attention call and reused by the next layers'
// (PagedAttentionMetadata::step_plan): a second call on the same metadata gives the same bits,
// and a query of another shape (a different group) on it plans again rather than reading a plan
// of the wrong size.
TEST(CudaPagedAttentionTest, FlashInferReusesTheStepPlanAcrossLayers) {
  if (!at::hasCUDA()) GTEST_SKIP() << "no CUDA device";
  if (!kv::cuda_attention_kernel_built(CudaAttentionKernel::kFlashInfer)) {
    GTEST_SKIP() << "this build has no FlashInfer";
  }
  const CudaAttentionKernel before = cuda_attention_kernel();
  set_cuda_attention_kernel(CudaAttentionKernel::kFlashInfer);
  const Problem p = make_problem({{5, 1}, {400, 1}, {1500, 1}}, 16, 2, 2, 128, at::kBFloat16, 91);
  const PagedAttentionMetadata meta = meta_to(p.meta, at::kCUDA);
  const at::Tensor q = p.q.cuda(), k = p.k_cache.cuda(), v = p.v_cache.cuda();
  EXPECT_EQ(meta.step_plan, nullptr);
  const at::Tensor first = paged_attention(q, k, v, meta, p.scale).cpu();
  ASSERT_NE(meta.step_plan, nullptr);
  const void* plan = meta.step_plan.get();
  const at::Tensor second = paged_attention(q, k, v, meta, p.scale).cpu();
  EXPECT_EQ(meta.step_plan.get(), plan);
  test::expect_tensor_equal(second, first);
  expect_matches_reference(p, first);
  const Problem wider =
      make_problem({{5, 1}, {400, 1}, {1500, 1}}, 16, 2, 7, 64, at::kBFloat16, 92);
  PagedAttentionMetadata wider_meta = meta_to(wider.meta, at::kCUDA);
  wider_meta.step_plan = meta.step_plan;  // planned for group 2 and head_dim 128
  const at::Tensor other = paged_attention(wider.q.cuda(), wider.k_cache.cuda(),
                                           wider.v_cache.cuda(), wider_meta, wider.scale)
                               .cpu();
  EXPECT_NE(wider_meta.step_plan.get(), plan);
  expect_matches_reference(wider, other);
  set_cuda_attention_kernel(before);
}

TEST(PagedAttentionCpuTest, FlashInferSplitWavesAreChecked) {
  const int64_t before = flashinfer_split_waves();
  EXPECT_THROW(set_flashinfer_split_waves(-1), std::invalid_argument);
  EXPECT_THROW(set_flashinfer_split_waves(kMaxFlashInferWaves + 1), std::invalid_argument);
  EXPECT_EQ(flashinfer_split_waves(), before);
  set_flashinfer_split_waves(0);
  EXPECT_EQ(flashinfer_split_waves(), 0);
  set_flashinfer_split_waves(before);
}

TEST(PagedAttentionCpuTest, SharpScoresStayAccurate) {
  // Scores spread over tens of units: exercises the running-max rescaling and exp underflow.
  Problem p = make_problem({{3, 1}, {45, 1}, {130, 4}}, 16, 1, 3, 64, at::kFloat, 21, 6.0);
  p.scale = 0.5;
  expect_matches_reference(p, paged_attention(p.q, p.k_cache, p.v_cache, p.meta, p.scale));
}

TEST(PagedAttentionCpuTest, MatchesDenseReferenceForOtherHeadDims) {
  // 8 and 40 are padded to whole 16-lane chunks (generic path); 128 is a specialized size.
  for (int64_t head_dim : {8, 40, 128}) {
    for (at::ScalarType dtype : {at::kFloat, at::kBFloat16}) {
      SCOPED_TRACE("head_dim " + std::to_string(head_dim));
      const Problem p = make_problem({{70, 1}, {33, 6}}, 16, 2, 2, head_dim, dtype, 81);
      expect_matches_reference(p, paged_attention(p.q, p.k_cache, p.v_cache, p.meta, p.scale));
    }
  }
}

// Restores the intra-op thread count when it goes out of scope.
class ThreadCountGuard {
 public:
  explicit ThreadCountGuard(int n) : saved_(at::get_num_threads()) { at::set_num_threads(n); }
  ~ThreadCountGuard() { at::set_num_threads(saved_); }

 private:
  int saved_;
};

TEST(PagedAttentionCpuTest, RowOutputIsBitIdenticalAloneInBatchAndAcrossThreadCounts) {
  for (at::ScalarType dtype : {at::kFloat, at::kBFloat16}) {
    const Problem p =
        make_problem({{50, 1}, {33, 5}, {7, 1}, {90, 1}, {64, 16}}, 16, 3, 3, 64, dtype, 31);
    at::Tensor batch, batch_two_threads;
    {
      ThreadCountGuard threads(1);
      batch = paged_attention(p.q, p.k_cache, p.v_cache, p.meta, p.scale);
    }
    {
      ThreadCountGuard threads(2);
      batch_two_threads = paged_attention(p.q, p.k_cache, p.v_cache, p.meta, p.scale);
    }
    test::expect_tensor_equal(batch_two_threads, batch);

    ThreadCountGuard threads(1);
    const int32_t* qs = p.meta.query_start.data_ptr<int32_t>();
    for (int64_t s = 0; s < static_cast<int64_t>(p.seqs.size()); ++s) {
      PagedAttentionMetadata alone;
      alone.query_start = at::tensor(std::vector<int32_t>{0, qs[s + 1] - qs[s]}, at::kInt);
      alone.context_lens = p.meta.context_lens.narrow(0, s, 1).clone();
      alone.block_tables = p.meta.block_tables.narrow(0, s, 1).clone();
      const at::Tensor q = p.q.narrow(0, qs[s], qs[s + 1] - qs[s]).clone();
      const at::Tensor out = paged_attention(q, p.k_cache, p.v_cache, alone, p.scale);
      SCOPED_TRACE("sequence " + std::to_string(s));
      test::expect_tensor_equal(out, batch.narrow(0, qs[s], qs[s + 1] - qs[s]));
    }
  }
}

TEST(PagedAttentionCpuTest, WriteKvCachePutsRowsAtTheirSlots) {
  for (at::ScalarType dtype : {at::kFloat, at::kBFloat16}) {
    auto gen = at::detail::createCPUGenerator(41);
    at::Tensor k_cache = at::randn({6, 4, 3, 8}, gen).to(dtype);
    at::Tensor v_cache = at::randn({6, 4, 3, 8}, gen).to(dtype);
    const at::Tensor k = at::randn({5, 3, 8}, gen).to(dtype);
    const at::Tensor v = at::randn({5, 3, 8}, gen).to(dtype);
    const at::Tensor slots = at::tensor(std::vector<int64_t>{23, 0, 9, 4, 17}, at::kLong);
    at::Tensor want_k = k_cache.clone(), want_v = v_cache.clone();
    for (int64_t t = 0; t < 5; ++t) {
      const int64_t slot = slots[t].item<int64_t>();
      want_k[slot / 4][slot % 4].copy_(k[t]);
      want_v[slot / 4][slot % 4].copy_(v[t]);
    }
    write_kv_cache(k_cache, v_cache, k, v, slots);
    test::expect_tensor_equal(k_cache, want_k);
    test::expect_tensor_equal(v_cache, want_v);
  }
}

TEST(PagedAttentionCpuTest, DecodeAttendsToTheTokenJustWritten) {
  Problem p = make_problem({{10, 1}}, 4, 2, 1, 32, at::kFloat, 51);
  // Overwrite the last position through write_kv_cache; the reference must see the new row.
  const int64_t pos = 9;
  const int64_t slot = p.meta.block_tables[0][pos / 4].item<int64_t>() * 4 + pos % 4;
  auto gen = at::detail::createCPUGenerator(52);
  const at::Tensor k_new = at::randn({1, 2, 32}, gen) * 3.0, v_new = at::randn({1, 2, 32}, gen);
  write_kv_cache(p.k_cache, p.v_cache, k_new, v_new,
                 at::tensor(std::vector<int64_t>{slot}, at::kLong));
  p.dense_k[0][pos].copy_(k_new[0]);
  p.dense_v[0][pos].copy_(v_new[0]);
  expect_matches_reference(p, paged_attention(p.q, p.k_cache, p.v_cache, p.meta, p.scale));
}

TEST(PagedAttentionCpuTest, CopyBlocksCopiesWholeBlocksInEveryLayer) {
  auto gen = at::detail::createCPUGenerator(61);
  at::Tensor kv = at::randn({2, 3, 8, 4, 2, 8}, gen);
  const at::Tensor before = kv.clone();
  // Block 5 is both a destination and a source: sources are read before any write.
  const at::Tensor pairs =
      at::tensor(std::vector<int64_t>{1, 5, 6, 0, 5, 2}, at::kLong).view({3, 2});
  at::Tensor want = before.clone();
  for (int64_t c = 0; c < 2; ++c) {
    for (int64_t layer = 0; layer < 3; ++layer) {
      want[c][layer][5].copy_(before[c][layer][1]);
      want[c][layer][0].copy_(before[c][layer][6]);
      want[c][layer][2].copy_(before[c][layer][5]);
    }
  }
  copy_blocks(kv, pairs);
  test::expect_tensor_equal(kv, want);
}

TEST(PagedAttentionCpuTest, RejectsBadInputsNamingTheArgument) {
  const Problem p = make_problem({{20, 2}}, 16, 2, 2, 32, at::kFloat, 71);
  ASSERT_THROWS_WITH(paged_attention(p.q, p.k_cache.to(at::kBFloat16), p.v_cache.to(at::kBFloat16),
                                     p.meta, p.scale),
                     std::invalid_argument, "k_cache");
  ASSERT_THROWS_WITH(
      paged_attention(p.q.narrow(1, 0, 3).contiguous(), p.k_cache, p.v_cache, p.meta, p.scale),
      std::invalid_argument, "num_heads");
  ASSERT_THROWS_WITH(paged_attention(p.q.transpose(0, 1).contiguous().transpose(0, 1), p.k_cache,
                                     p.v_cache, p.meta, p.scale),
                     std::invalid_argument, "q must be contiguous");
  PagedAttentionMetadata bad = p.meta;
  bad.block_tables = p.meta.block_tables.to(at::kLong);
  ASSERT_THROWS_WITH(paged_attention(p.q, p.k_cache, p.v_cache, bad, p.scale),
                     std::invalid_argument, "block_tables");
  bad = p.meta;
  bad.context_lens = at::tensor(std::vector<int32_t>{1}, at::kInt);
  ASSERT_THROWS_WITH(paged_attention(p.q, p.k_cache, p.v_cache, bad, p.scale),
                     std::invalid_argument, "context_lens");
  bad = p.meta;
  bad.block_tables = p.meta.block_tables.clone();
  bad.block_tables[0][1] = 1000;  // block 1 holds positions 16..19
  ASSERT_THROWS_WITH(paged_attention(p.q, p.k_cache, p.v_cache, bad, p.scale),
                     std::invalid_argument, "block_tables[0, 1]");

  at::Tensor k_cache = p.k_cache.clone(), v_cache = p.v_cache.clone();
  const at::Tensor k = at::zeros({2, 2, 32}), v = at::zeros({2, 2, 32});
  const int64_t num_slots = k_cache.size(0) * k_cache.size(1);
  ASSERT_THROWS_WITH(write_kv_cache(k_cache, v_cache, k, v,
                                    at::tensor(std::vector<int64_t>{0, num_slots}, at::kLong)),
                     std::invalid_argument, "slot_mapping[1]");
  ASSERT_THROWS_WITH(write_kv_cache(k_cache, v_cache, k.to(at::kBFloat16), v,
                                    at::tensor(std::vector<int64_t>{0, 1}, at::kLong)),
                     std::invalid_argument, "k must have dtype");
  test::expect_tensor_equal(k_cache, p.k_cache);  // nothing written by rejected calls

  at::Tensor kv = at::zeros({2, 1, 4, 2, 1, 4});
  ASSERT_THROWS_WITH(copy_blocks(kv, at::zeros({2, 3}, at::kLong)), std::invalid_argument,
                     "block_pairs");
  ASSERT_THROWS_WITH(copy_blocks(kv, at::tensor(std::vector<int64_t>{0, 1, 2, 1}).view({2, 2})),
                     std::invalid_argument, "block_pairs");
  ASSERT_THROWS_WITH(copy_blocks(kv, at::tensor(std::vector<int64_t>{0, 4}).view({1, 2})),
                     std::invalid_argument, "block_pairs[0, 1]");
}

}  // namespace
}  // namespace crl::kv
