// The CPU attention kernel gives the same bits whatever instruction set it was compiled for: the
// -march=native build in crl_kv against a baseline x86-64 build of the same source
// (paged_attention_baseline_build.cpp). Its reduction orders are fixed by the code, so neither
// vector width nor instruction set may change a result.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "kv/paged_attention.h"
#include "tests/test_utils.h"

at::Tensor paged_attention_cpu_baseline_build(const at::Tensor& q, const at::Tensor& k_cache,
                                              const at::Tensor& v_cache,
                                              const at::Tensor& query_start,
                                              const at::Tensor& context_lens,
                                              const at::Tensor& block_tables, int64_t max_query_len,
                                              int64_t max_context_len, double scale);

namespace crl::kv {
namespace {

TEST(PagedAttentionIsaTest, NativeAndBaselineBuildsGiveTheSameBits) {
  at::manual_seed(3);
  for (auto dt : {at::kFloat, at::kBFloat16}) {
    for (int64_t head_dim : {64, 80, 128}) {
      SCOPED_TRACE("head_dim " + std::to_string(head_dim));
      const int64_t heads = 6, kv_heads = 2, block = 16, blocks = 40;
      const auto k = at::randn({blocks, block, kv_heads, head_dim}).to(dt);
      const auto v = at::randn({blocks, block, kv_heads, head_dim}).to(dt);
      PagedAttentionMetadata m;
      m.query_start = at::tensor(std::vector<int32_t>{0, 1, 10, 15}, at::kInt);
      m.context_lens = at::tensor(std::vector<int32_t>{37, 100, 5}, at::kInt);
      m.block_tables = at::randperm(blocks, at::kInt).narrow(0, 0, 24).reshape({3, 8}).contiguous();
      m.max_query_len = 9;
      m.max_context_len = 100;
      const auto q = at::randn({15, heads, head_dim}).to(dt);
      const double scale = 1.0 / std::sqrt(static_cast<double>(head_dim));
      const auto native = detail::paged_attention_cpu(q, k, v, m, scale);
      const auto baseline =
          paged_attention_cpu_baseline_build(q, k, v, m.query_start, m.context_lens, m.block_tables,
                                             m.max_query_len, m.max_context_len, scale);
      test::expect_tensor_equal(baseline, native);
    }
  }
}

}  // namespace
}  // namespace crl::kv
