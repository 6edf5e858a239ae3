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
    case CpuIsa::kAvx512:
      return detail::kAvx512Kernels;
    case CpuIsa::kAvx2:
      return detail::kAvx2Kernels;
#endif
    default:
      return detail::kScalarKernels;
  }
}

void check_cpu_dtype(const at::Tensor& t, const char* op, const char* what) {
  CRL_CHECK(t.defined(), op, ": ", what, " is undefined");
  CRL_CHECK(t.device().is_cpu(), op, ": ", what,
            " must be on the CPU (batch-invariant kernels are "
            "CPU kernels), got ",
            t.device());
  CRL_CHECK(t.scalar_type() == at::kFloat || t.scalar_type() == at::kBFloat16, op, ": ", what,
            " must be float32 or bfloat16, got ", t.scalar_type());
}

// Rows per parallel chunk so that a chunk holds at least ~16k elements.
int64_t row_grain(int64_t row_len) {
  return std::max<int64_t>(1, 16384 / std::max<int64_t>(1, row_len));
}

}  // namespace

namespace {

// Checks bi_linear's arguments; returns the bias as contiguous float32 (undefined without one).
at::Tensor check_linear(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias) {
  check_cpu_dtype(x, "linear", "x");
  check_cpu_dtype(weight, "linear", "weight");
  CRL_CHECK(x.dim() == 2 && weight.dim() == 2 && x.size(1) == weight.size(1), "linear: x ",
            x.sizes(), " and weight ", weight.sizes(), " do not match ([M, K] and [N, K])");
  CRL_CHECK(x.scalar_type() == weight.scalar_type(), "linear: x is ", x.scalar_type(), ", weight ",
            weight.scalar_type());
  if (!bias.defined()) return {};
  check_cpu_dtype(bias, "linear", "bias");
  CRL_CHECK(bias.dim() == 1 && bias.size(0) == weight.size(0), "linear: bias ", bias.sizes(),
            " for ", weight.size(0), " outputs");
  return bias.to(at::kFloat).contiguous();
}

// The output of a linear with no work to do (no rows, columns or depth), else undefined.
at::Tensor trivial_linear(const at::Tensor& x, int64_t n, const at::Tensor& b) {
  const int64_t m = x.size(0), k = x.size(1);
  if (m == 0 || n == 0) return at::empty({m, n}, x.options());
  if (k == 0)
    return b.defined() ? b.expand({m, n}).to(x.scalar_type()).contiguous()
                       : at::zeros({m, n}, x.options());
  return {};
}

// How a gemm function walks its task (detail::KernelTable::gemm, DotKernel::gemm).
struct GemmShape {
  int64_t nr;            // output columns per panel
  int64_t mr;            // rows per micro-tile
  int64_t panel_floats;  // scratch floats for the packed panel block
  int64_t max_rows;      // rows per task at most
};

using GemmFn = void (*)(const detail::GemmArgs&, int64_t, int64_t, int64_t, int64_t, float*);

// Rows [m0, m1) of one product of a grouped call (its own arguments: weights, segments).
struct GemmPart {
  detail::GemmArgs args;
  int64_t m0, m1;
};

// Runs gemm over every part's rows x all its a.n columns, in one parallel region. Work split (it
// changes no result): per part, row blocks of at most max_rows rows, as even as can be, each times
// groups of panels (about 4 per thread); a task keeps one panel's float32 partial chains of its
// rows in its scratch, after the packed panel.
void run_gemm_parts(const std::vector<GemmPart>& parts, const GemmShape& s, GemmFn gemm) {
  struct Split {
    int64_t mc, row_blocks, panels, g, groups, first_task;
  };
  const int64_t threads = std::max(1, at::get_num_threads());
  std::vector<Split> splits;
  splits.reserve(parts.size());
  int64_t tasks = 0, scratch_floats = 0;
  for (const GemmPart& part : parts) {
    const int64_t m = part.m1 - part.m0;
    Split sp{};
    sp.panels = (part.args.n + s.nr - 1) / s.nr;
    sp.first_task = tasks;
    if (m <= 0 || sp.panels == 0) {  // nothing to compute: no tasks
      sp.mc = sp.g = sp.groups = 1;
      splits.push_back(sp);
      continue;
    }
    sp.row_blocks = (m + s.max_rows - 1) / s.max_rows;
    if (sp.row_blocks * sp.panels < threads) {
      // Fewer panels than threads (a skinny product, such as a LoRA adapter's x A^T of one panel):
      // split the rows further, into no more blocks than micro-tiles, so that no thread only waits.
      sp.row_blocks = std::max(
          sp.row_blocks, std::min((m + s.mr - 1) / s.mr, (threads + sp.panels - 1) / sp.panels));
    }
    sp.mc = std::max<int64_t>(1, (m + sp.row_blocks - 1) / sp.row_blocks);
    sp.row_blocks = (m + sp.mc - 1) / sp.mc;  // no block left without rows
    sp.g = std::max<int64_t>(1, (sp.panels + 4 * threads - 1) / (4 * threads));
    sp.groups = (sp.panels + sp.g - 1) / sp.g;
    tasks += sp.row_blocks * sp.groups;
    scratch_floats = std::max(scratch_floats, s.panel_floats + sp.mc * s.nr);
    splits.push_back(sp);
  }
  if (tasks == 0) return;
  at::parallel_for(0, tasks, 1, [&](int64_t begin, int64_t end) {
    // Up to ~80 KB, asked for by every call of every layer: each thread keeps its own rather than
    // allocate (and fault in) a fresh one each time.
    thread_local std::vector<float> scratch;
    if (scratch.size() < static_cast<size_t>(scratch_floats)) scratch.resize(scratch_floats);
    size_t pi = 0;  // the part of `task` (tasks ascend)
    for (int64_t task = begin; task < end; ++task) {
      while (pi + 1 < splits.size() && splits[pi + 1].first_task <= task) ++pi;
      const Split& sp = splits[pi];
      const GemmPart& part = parts[pi];
      const int64_t local = task - sp.first_task;
      const int64_t m0 = part.m0 + local / sp.groups * sp.mc;
      const int64_t p0 = local % sp.groups * sp.g;
      gemm(part.args, m0, std::min(part.m1, m0 + sp.mc), p0, std::min(sp.panels, p0 + sp.g),
           scratch.data());
    }
  });
}

// Runs gemm over all of a.m x a.n.
void run_gemm(const detail::GemmArgs& a, const GemmShape& s, GemmFn gemm) {
  run_gemm_parts({GemmPart{a, 0, a.m}}, s, gemm);
}

detail::GemmArgs gemm_args(const at::Tensor& w, const at::Tensor& b, at::Tensor& y) {
  detail::GemmArgs args;
  args.w = w.data_ptr();
  args.w_bf16 = w.scalar_type() == at::kBFloat16;
  args.bias = b.defined() ? b.data_ptr<float>() : nullptr;
  args.y = y.data_ptr();
  args.ldy = y.size(1);
  args.y_bf16 = y.scalar_type() == at::kBFloat16;
  args.m = y.size(0);
  args.n = y.size(1);
  args.k = w.size(1);
  return args;
}

}  // namespace

at::Tensor bi_linear(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias,
                     const at::Tensor& x2, const at::Tensor& weight2) {
  const at::Tensor b = check_linear(x, weight, bias);
  const bool second = x2.defined() || weight2.defined();
  if (second) {
    check_cpu_dtype(x2, "linear", "x2");
    check_cpu_dtype(weight2, "linear", "weight2");
    CRL_CHECK(x2.dim() == 2 && weight2.dim() == 2 && x2.size(0) == x.size(0) &&
                  weight2.size(0) == weight.size(0) && x2.size(1) == weight2.size(1),
              "linear: second segment x2 ", x2.sizes(), " and weight2 ", weight2.sizes(),
              " do not fit x ", x.sizes(), " and weight ", weight.sizes(),
              " ([M, K2] and [N, K2])");
    CRL_CHECK(weight2.scalar_type() == weight.scalar_type(), "linear: weight2 is ",
              weight2.scalar_type(), ", weight ", weight.scalar_type());
  }
  // [x | x2] with an empty x is x2 alone: the one segment (the output still in x's dtype).
  const bool only_second = second && x.size(1) == 0;
  const at::Tensor& x1 = only_second ? x2 : x;
  const at::Tensor& w1 = only_second ? weight2 : weight;
  if (at::Tensor t = trivial_linear(x1, w1.size(0), b); t.defined()) return t.to(x.scalar_type());
  const at::Tensor xf = x1.to(at::kFloat).contiguous();  // bfloat16 widens exactly
  const at::Tensor w = w1.contiguous();
  at::Tensor y = at::empty({x.size(0), w.size(0)}, x.options());
  detail::GemmArgs args = gemm_args(w, b, y);
  args.x = xf.data_ptr<float>();
  args.ldx = args.k;
  at::Tensor x2f, w2;
  if (second && !only_second && x2.size(1) > 0) {
    x2f = x2.to(at::kFloat).contiguous();
    w2 = weight2.contiguous();
    args.x2 = x2f.data_ptr<float>();
    args.ldx2 = x2f.size(1);
    args.w2 = w2.data_ptr();
    args.k2 = w2.size(1);
  }
  const detail::KernelTable& t = active_table();
  run_gemm(args, {t.nr, t.mr, t.kc * t.nr, 256}, t.gemm);
  return y;
}

namespace {

// Checks that `groups` cover rows [0, m) in order; `op` names the caller.
void check_row_groups(const std::vector<RowGroup>& groups, int64_t m, const char* op) {
  int64_t next = 0;
  for (const RowGroup& g : groups) {
    CRL_CHECK(g.begin == next && g.end >= g.begin, op,
              ": row groups must cover the rows in order; a group [", g.begin, ", ", g.end,
              ") follows row ", next);
    next = g.end;
  }
  CRL_CHECK(next == m, op, ": row groups cover ", next, " of ", m, " rows");
}

}  // namespace

at::Tensor bi_grouped_linear(const at::Tensor& x, const std::vector<RowGroup>& groups, int64_t n) {
  check_cpu_dtype(x, "grouped_linear", "x");
  CRL_CHECK(x.dim() == 2, "grouped_linear: x ", x.sizes(), " must be [M, K]");
  const int64_t m = x.size(0), k = x.size(1);
  check_row_groups(groups, m, "grouped_linear");
  for (const RowGroup& g : groups) {
    if (!g.weight.defined()) continue;
    check_cpu_dtype(g.weight, "grouped_linear", "weight");
    CRL_CHECK(g.weight.dim() == 2 && g.weight.size(0) == n && g.weight.size(1) == k &&
                  g.weight.scalar_type() == x.scalar_type() && g.weight.is_contiguous(),
              "grouped_linear: the weight of rows [", g.begin, ", ", g.end, ") is ",
              g.weight.sizes(), " ", g.weight.scalar_type(), ", not a contiguous [", n, ", ", k,
              "] ", x.scalar_type());
  }
  at::Tensor y = at::empty({m, n}, x.options());
  if (m == 0 || n == 0) return y;
  const at::Tensor xf = x.to(at::kFloat).contiguous();
  std::vector<GemmPart> parts;
  for (const RowGroup& g : groups) {
    if (g.begin == g.end) continue;
    if (!g.weight.defined() || k == 0) {
      y.narrow(0, g.begin, g.end - g.begin).zero_();
      continue;
    }
    detail::GemmArgs args = gemm_args(g.weight, {}, y);
    args.x = xf.data_ptr<float>();
    args.ldx = k;
    parts.push_back({args, g.begin, g.end});
  }
  const detail::KernelTable& t = active_table();
  run_gemm_parts(parts, {t.nr, t.mr, t.kc * t.nr, 256}, t.gemm);
  return y;
}

at::Tensor bi_linear(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias,
                     const at::Tensor& x2, const std::vector<RowGroup>& second) {
  const at::Tensor b = check_linear(x, weight, bias);
  const int64_t m = x.size(0), n = weight.size(0);
  check_row_groups(second, m, "linear");
  check_cpu_dtype(x2, "linear", "x2");
  CRL_CHECK(x2.dim() == 2 && x2.size(0) == m, "linear: second segment x2 ", x2.sizes(), " for ", m,
            " rows");
  for (const RowGroup& g : second) {
    if (!g.weight.defined()) continue;
    check_cpu_dtype(g.weight, "linear", "weight2");
    CRL_CHECK(g.weight.dim() == 2 && g.weight.size(0) == n && g.weight.size(1) == x2.size(1) &&
                  g.weight.scalar_type() == weight.scalar_type() && g.weight.is_contiguous(),
              "linear: the second-segment weight of rows [", g.begin, ", ", g.end, ") is ",
              g.weight.sizes(), " ", g.weight.scalar_type(), ", not a contiguous [", n, ", ",
              x2.size(1), "] ", weight.scalar_type());
  }
  CRL_CHECK(x.size(1) > 0, "linear: grouped second segments need a first one (x has no columns)");
  if (at::Tensor t = trivial_linear(x, n, b); t.defined()) return t;
  const at::Tensor xf = x.to(at::kFloat).contiguous();
  const at::Tensor x2f = x2.to(at::kFloat).contiguous();
  const at::Tensor w = weight.contiguous();
  at::Tensor y = at::empty({m, n}, x.options());
  detail::GemmArgs args = gemm_args(w, b, y);
  args.x = xf.data_ptr<float>();
  args.ldx = args.k;
  // One product: each panel of the base weight is packed once for every row, each group's
  // second-segment block once for its rows (bi_gemm_impl.h).
  std::vector<detail::RowGroupW2> groups;
  groups.reserve(second.size());
  for (const RowGroup& g : second)
    groups.push_back({g.end, g.weight.defined() ? g.weight.data_ptr() : nullptr});
  if (x2f.size(1) > 0) {
    args.x2 = x2f.data_ptr<float>();
    args.ldx2 = x2f.size(1);
    args.k2 = x2f.size(1);
    args.groups2 = groups.data();
    args.num_groups2 = static_cast<int64_t>(groups.size());
  }
  const detail::KernelTable& t = active_table();
  run_gemm(args, {t.nr, t.mr, t.kc * t.nr, 256}, t.gemm);
  return y;
}

at::Tensor bf16_dot_linear(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias) {
  const at::Tensor b = check_linear(x, weight, bias);
  CRL_CHECK(x.scalar_type() == at::kBFloat16,
            "bf16_dot_linear: x and weight must be bfloat16, got ", x.scalar_type());
  CRL_CHECK(bf16_dot_supported(),
            "bf16_dot_linear: needs AVX512-BF16 and the AVX-512 kernel path (", describe_cpu(),
            ")");
  if (at::Tensor t = trivial_linear(x, weight.size(0), b); t.defined()) return t;
#if defined(__x86_64__)
  const at::Tensor w = weight.contiguous();
  at::Tensor y = at::empty({x.size(0), w.size(0)}, x.options());
  detail::GemmArgs args = gemm_args(w, b, y);
  // x as dword pairs, the even depth in the high half (bi_kernels.h, GemmArgs::xp).
  const int64_t m = args.m, k = args.k, kp = (k + 1) / 2;
  const at::Tensor xc = x.contiguous();
  const at::Tensor xp = at::empty({m, kp}, x.options().dtype(at::kInt));
  {
    const uint16_t* src = reinterpret_cast<const uint16_t*>(xc.data_ptr());
    uint32_t* dst = reinterpret_cast<uint32_t*>(xp.data_ptr());
    for (int64_t r = 0; r < m; ++r) {
      const uint16_t* s = src + r * k;
      uint32_t* d = dst + r * kp;
      for (int64_t j = 0; j < k / 2; ++j)
        d[j] = static_cast<uint32_t>(s[2 * j]) << 16 | s[2 * j + 1];
      if (k % 2) d[kp - 1] = static_cast<uint32_t>(s[k - 1]) << 16;
    }
  }
  args.xp = reinterpret_cast<const uint32_t*>(xp.data_ptr());
  args.ldxp = kp;
  const detail::DotKernel& d = detail::kAvx512Bf16Dot;
  run_gemm(args, {d.nr, d.mr, d.kcp * d.nr, 256}, d.gemm);
  return y;
#else
  CRL_CHECK(false, "bf16_dot_linear: x86-64 only");
  return {};
#endif
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
  const detail::RowArgs args{
      xc.data_ptr(),          w.data_ptr(), y.data_ptr(), x.scalar_type() == at::kBFloat16, h,
      static_cast<float>(eps)};
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
  const detail::KernelTable& t = active_table();
  const bool bf16 = gate.scalar_type() == at::kBFloat16;
  if (gate.dim() == 2 && gate.stride(1) == 1 && up.stride(1) == 1 &&
      !(gate.is_contiguous() && up.is_contiguous())) {
    // Rows read in place (the halves of a merged gate/up product): row by row, no copy.
    at::Tensor y = at::empty(gate.sizes(), gate.options());
    const int64_t width = gate.size(1);
    const int64_t elt = gate.element_size();
    const auto* g = static_cast<const char*>(gate.data_ptr());
    const auto* u = static_cast<const char*>(up.data_ptr());
    auto* out = static_cast<char*>(y.data_ptr());
    at::parallel_for(0, gate.size(0), std::max<int64_t>(1, 16384 / std::max<int64_t>(width, 1)),
                     [&](int64_t begin, int64_t end) {
                       for (int64_t r = begin; r < end; ++r) {
                         const detail::RowArgs row{g + r * gate.stride(0) * elt,
                                                   u + r * up.stride(0) * elt,
                                                   out + r * width * elt,
                                                   bf16,
                                                   0,
                                                   0.0f};
                         t.silu_mul(row, 0, width);
                       }
                     });
    return y;
  }
  const at::Tensor g = gate.contiguous();
  const at::Tensor u = up.contiguous();
  at::Tensor y = at::empty_like(g);
  const detail::RowArgs args{g.data_ptr(), u.data_ptr(), y.data_ptr(), bf16, 0, 0.0f};
  at::parallel_for(0, g.numel(), 16384,
                   [&](int64_t begin, int64_t end) { t.silu_mul(args, begin, end); });
  return y;
}

}  // namespace crl::engine::kernels
