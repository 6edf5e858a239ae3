#include "engine/kernels/batch_invariant.h"

#include <ATen/Parallel.h>

#include <algorithm>
#include <vector>

#include "common/check.h"
#include "engine/kernels/bi_kernels.h"
#include "engine/kernels/cpu_isa.h"

namespace crl::engine::kernels {
namespace {

const detail::KernelTable& active_table() {
  switch (active_cpu_isa()) {
#if defined(__x86_64__)
    case CpuIsa::kAvx512: return detail::kAvx512Kernels;
    case CpuIsa::kAvx2: return detail::kAvx2Kernels;
#endif
    default: return detail::kScalarKernels;
  }
}

void check_cpu_dtype(const at::Tensor& t, const char* op, const char* what) {
  CRL_CHECK(t.defined(), op, ": ", what, " is undefined");
  CRL_CHECK(t.device().is_cpu(), op, ": ", what, " must be on the CPU (batch-invariant kernels are "
            "CPU kernels), got ", t.device());
  CRL_CHECK(t.scalar_type() == at::kFloat || t.scalar_type() == at::kBFloat16, op, ": ", what,
            " must be float32 or bfloat16, got ", t.scalar_type());
}

// Rows per parallel chunk so that a chunk holds at least ~16k elements.
int64_t row_grain(int64_t row_len) { return std::max<int64_t>(1, 16384 / std::max<int64_t>(1, row_len)); }

}  // namespace

at::Tensor bi_linear(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias) {
  check_cpu_dtype(x, "linear", "x");
  check_cpu_dtype(weight, "linear", "weight");
  CRL_CHECK(x.dim() == 2 && weight.dim() == 2 && x.size(1) == weight.size(1), "linear: x ",
            x.sizes(), " and weight ", weight.sizes(), " do not match ([M, K] and [N, K])");
  CRL_CHECK(x.scalar_type() == weight.scalar_type(), "linear: x is ", x.scalar_type(),
            ", weight ", weight.scalar_type());
  const int64_t m = x.size(0), k = x.size(1), n = weight.size(0);
  at::Tensor b;
  if (bias.defined()) {
    check_cpu_dtype(bias, "linear", "bias");
    CRL_CHECK(bias.dim() == 1 && bias.size(0) == n, "linear: bias ", bias.sizes(), " for ", n,
              " outputs");
    b = bias.to(at::kFloat).contiguous();
  }
  if (m == 0 || n == 0) return at::empty({m, n}, x.options());
  if (k == 0) return b.defined() ? b.expand({m, n}).to(x.scalar_type()).contiguous()
                                 : at::zeros({m, n}, x.options());
  const at::Tensor xf = x.to(at::kFloat).contiguous();  // bfloat16 widens exactly
  const at::Tensor w = weight.contiguous();
  at::Tensor y = at::empty({m, n}, x.options());

  detail::GemmArgs args;
  args.x = xf.data_ptr<float>();
  args.ldx = k;
  args.w = w.data_ptr();
  args.w_bf16 = w.scalar_type() == at::kBFloat16;
  args.bias = b.defined() ? b.data_ptr<float>() : nullptr;
  args.y = y.data_ptr();
  args.ldy = n;
  args.y_bf16 = y.scalar_type() == at::kBFloat16;
  args.m = m;
  args.n = n;
  args.k = k;

  // Work split (it changes no result): row blocks of about 128 rows, each times groups of g
  // panels; a task keeps the float32 partial chains of its rows x columns in its scratch.
  const detail::KernelTable& t = active_table();
  const int64_t mc = std::min<int64_t>(m, std::max<int64_t>(t.mr, 128 / t.mr * t.mr));
  const int64_t row_blocks = (m + mc - 1) / mc;
  const int64_t panels = (n + t.nr - 1) / t.nr;
  const int64_t threads = std::max(1, at::get_num_threads());
  const int64_t g_cap = std::max<int64_t>(1, 65536 / (mc * t.nr));
  const int64_t g = std::clamp<int64_t>((panels + 4 * threads - 1) / (4 * threads), 1, g_cap);
  const int64_t groups = (panels + g - 1) / g;
  const int64_t scratch_floats = t.kc * t.nr + mc * g * t.nr;
  at::parallel_for(0, row_blocks * groups, 1, [&](int64_t begin, int64_t end) {
    // Up to ~300 KB: a fresh vector per call would be an mmap and page faults every time (glibc
    // maps blocks this large), so each thread keeps its own.
    thread_local std::vector<float> scratch;
    if (scratch.size() < static_cast<size_t>(scratch_floats)) scratch.resize(scratch_floats);
    for (int64_t task = begin; task < end; ++task) {
      const int64_t m0 = task / groups * mc;
      const int64_t p0 = task % groups * g;
      t.gemm(args, m0, std::min(m, m0 + mc), p0, std::min(panels, p0 + g), scratch.data());
    }
  });
  return y;
}

at::Tensor bi_rms_norm(const at::Tensor& x, const at::Tensor& weight, double eps) {
  check_cpu_dtype(x, "rms_norm", "x");
  check_cpu_dtype(weight, "rms_norm", "weight");
  CRL_CHECK(x.dim() >= 1 && weight.dim() == 1 && weight.size(0) == x.size(-1), "rms_norm: x ",
            x.sizes(), " weight ", weight.sizes());
  CRL_CHECK(x.scalar_type() == weight.scalar_type(), "rms_norm: x is ", x.scalar_type(),
            ", weight ", weight.scalar_type());
  const at::Tensor xc = x.contiguous();
  const at::Tensor w = weight.contiguous();
  at::Tensor y = at::empty_like(xc);
  const int64_t h = x.size(-1);
  if (xc.numel() == 0 || h == 0) return y;
  const detail::RowArgs args{xc.data_ptr(), w.data_ptr(), y.data_ptr(),
                             x.scalar_type() == at::kBFloat16, h, static_cast<float>(eps)};
  const detail::KernelTable& t = active_table();
  at::parallel_for(0, xc.numel() / h, row_grain(h),
                   [&](int64_t begin, int64_t end) { t.rms_norm(args, begin, end); });
  return y;
}

at::Tensor bi_silu_mul(const at::Tensor& gate, const at::Tensor& up) {
  check_cpu_dtype(gate, "silu_mul", "gate");
  check_cpu_dtype(up, "silu_mul", "up");
  CRL_CHECK(gate.sizes() == up.sizes() && gate.scalar_type() == up.scalar_type(), "silu_mul: gate ",
            gate.sizes(), " ", gate.scalar_type(), ", up ", up.sizes(), " ", up.scalar_type());
  const at::Tensor g = gate.contiguous();
  const at::Tensor u = up.contiguous();
  at::Tensor y = at::empty_like(g);
  const detail::RowArgs args{g.data_ptr(), u.data_ptr(), y.data_ptr(),
                             g.scalar_type() == at::kBFloat16, 0, 0.0f};
  const detail::KernelTable& t = active_table();
  at::parallel_for(0, g.numel(), 16384, [&](int64_t begin, int64_t end) { t.silu_mul(args, begin, end); });
  return y;
}

}  // namespace crl::engine::kernels
