// Row kernels of the sampler (engine/sampler.cpp): max, exp and sum passes over one row of
// logits in blocks of kSampleBlock, written with GCC/Clang vector extensions (8 floats). On x86-64
// GCC they are also cloned for AVX2 and chosen at load time; both clones run the same IEEE
// operations (no FMA), so results are bit-identical whichever runs.
//
// Thread safety: pure functions of their arguments.
#pragma once

#include <cstdint>
#include <limits>

namespace crl::engine::kernels {

constexpr int64_t kSampleBlock = 64;  // elements per block (block maxima and block sums)
constexpr float kNegInf = -std::numeric_limits<float>::infinity();

struct MaxScan {
  float max = kNegInf;
  bool has_nan = false;
};

// Max of x[0, n) and the maximum of each block into block_max[ceil(n / kSampleBlock)].
MaxScan scan_max(const float* x, int64_t n, float* block_max);

// Sum of e_i = exp((x_i - shift) * scale) over x[0, n), per block and then over blocks in order.
// Stores each e_i into out and each block's sum into block_sum when those are non-null.
// Requires (x_i - shift) * scale <= 0. exp: the Cephes expf polynomial, about 1 ulp; 0 below
// ln(FLT_MIN).
double exp_pass(const float* x, int64_t n, float shift, float scale, float* out, double* block_sum);

// Per-block sums of q[0, n) into block_sum; returns their sum over blocks in order.
double sum_blocks(const float* q, int64_t n, double* block_sum);

// Zeroes every q_i ranked below (q_min, id_min) in the order (prob desc, id asc).
void zero_below(float* q, int64_t n, float q_min, int32_t id_min);

}  // namespace crl::engine::kernels
