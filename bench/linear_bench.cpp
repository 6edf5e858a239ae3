#include "bench/linear_bench.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <fmt/format.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <vector>

#include "bench/stats.h"
#include "engine/kernels/batch_invariant.h"
#include "engine/kernels/cpu_isa.h"
#include "engine/model/config.h"
#include "engine/model/linear.h"
#include "engine/model/model_cache.h"

namespace crl::bench {
namespace {

using Clock = std::chrono::steady_clock;

struct Group {
  std::string name;
  std::vector<at::Tensor> weights;  // [out, in]
};

}  // namespace

void add_linear_bench_flags(CLI::App& cmd, LinearBenchOptions& o) {
  cmd.add_option("--shape", o.shape, "model preset whose linear shapes are timed")
      ->capture_default_str();
  cmd.add_option("--dtype", o.dtype, "float32 or bfloat16")->capture_default_str();
  cmd.add_option("--rows", o.rows, "comma-separated row counts (tokens per step)")
      ->capture_default_str();
  cmd.add_option("--threads", o.threads, "intra-op threads")->capture_default_str();
  cmd.add_option("--repeats", o.repeats, "timed repeats (each times both paths)")
      ->capture_default_str();
  cmd.add_option("--json-out", o.json_out, "append the JSON result line to this file");
}

int run_linear_bench(const LinearBenchOptions& o) {
  at::set_num_threads(o.threads);
  const engine::ModelConfig c = engine::preset_config(o.shape);
  const at::ScalarType dt = engine::parse_dtype(o.dtype);
  std::vector<int64_t> rows;
  {
    std::stringstream ss(o.rows);
    std::string item;
    while (std::getline(ss, item, ',')) rows.push_back(std::stoll(item));
  }
  const int64_t h = c.hidden_size, q = c.num_heads * c.head_dim, kv = c.num_kv_heads * c.head_dim;
  at::manual_seed(1);
  auto w = [&](int64_t out, int64_t in) { return (at::randn({out, in}) * 0.02).to(dt); };
  std::vector<Group> groups = {{"layer (q k v o gate up down)",
                                {w(q, h), w(kv, h), w(kv, h), w(h, q), w(c.intermediate_size, h),
                                 w(c.intermediate_size, h), w(h, c.intermediate_size)}},
                               {"lm_head", {w(c.vocab_size, h)}}};

  fmt::print("bench linear: {} {} ({} layers, hidden {}, ffn {}, vocab {}), {} threads\n", o.shape,
             o.dtype, c.num_layers, h, c.intermediate_size, c.vocab_size, o.threads);
  engine::kernels::active_cpu_isa();  // chosen now, so the line below names it
  fmt::print("CPU: {}\n", engine::kernels::describe_cpu());
  // bfloat16 on AVX512-BF16: ours is the vdpbf16ps kernel, else the batch-invariant one.
  const bool dot = dt == at::kBFloat16 && engine::kernels::bf16_dot_supported();
  fmt::print("ours: {}\n", dot ? "bf16_dot_linear (vdpbf16ps)" : "bi_linear");
  fmt::print("{:>5}  {:<30} {:>14} {:>12} {:>12}\n", "rows", "linears", "default GFLOP/s",
             "ours GFLOP/s", "ours/default");
  nlohmann::json cells = nlohmann::json::array();
  for (int64_t m : rows) {
    for (const Group& g : groups) {
      std::vector<at::Tensor> xs;
      double flops = 0;
      for (const at::Tensor& wt : g.weights) {
        xs.push_back(at::randn({m, wt.size(1)}).to(dt));
        flops += 2.0 * m * wt.size(0) * wt.size(1);
      }
      auto time_path = [&](bool ours) {
        const auto t0 = Clock::now();
        for (size_t i = 0; i < xs.size(); ++i) {
          at::Tensor y = !ours ? engine::apply_linear(xs[i], g.weights[i])
                         : dot ? engine::kernels::bf16_dot_linear(xs[i], g.weights[i])
                               : engine::kernels::bi_linear(xs[i], g.weights[i]);
          (void)y;
        }
        return std::chrono::duration<double>(Clock::now() - t0).count();
      };
      // Enough calls per sample that one takes >= ~20 ms.
      int calls = 1;
      {
        const double one = std::max(time_path(false), 1e-6);
        calls = std::clamp(static_cast<int>(0.02 / one), 1, 2000);
      }
      std::vector<double> aten, ours, ratio;
      for (int r = 0; r < o.repeats + 1; ++r) {
        double ta = 0, to = 0;
        for (int k = 0; k < 2; ++k) {
          const bool first_ours = (r + k) % 2 == 0;
          double t = 0;
          for (int i = 0; i < calls; ++i) t += time_path(first_ours);
          (first_ours ? to : ta) = t / calls;
        }
        if (r == 0) continue;  // warm-up
        aten.push_back(flops / ta / 1e9);
        ours.push_back(flops / to / 1e9);
        ratio.push_back(ta / to);
      }
      const double ga = median(aten), go = median(ours), q_ratio = median(ratio);
      fmt::print("{:>5}  {:<30} {:>14.1f} {:>12.1f} {:>11.2f}x\n", m, g.name, ga, go, q_ratio);
      cells.push_back({{"rows", m},
                       {"linears", g.name},
                       {"default_gflops", ga},
                       {"ours_gflops", go},
                       {"ours_over_default", q_ratio}});
    }
  }
  if (!o.json_out.empty()) {
    nlohmann::json line = {
        {"bench", "linear"},
        {"shape", o.shape},
        {"dtype", o.dtype},
        {"threads", o.threads},
        {"cpu", engine::kernels::cpu_model_name()},
        {"kernels", engine::kernels::cpu_isa_name(engine::kernels::active_cpu_isa())},
        {"ours", dot ? "bf16_dot_linear" : "bi_linear"},
        {"cells", cells}};
    std::ofstream(o.json_out, std::ios::app) << line.dump() << "\n";
  }
  return 0;
}

}  // namespace crl::bench
