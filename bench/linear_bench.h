// `colocated-rl bench linear`: the engine's linear layers on the CPU, the default mode's path
// (engine::apply_linear: its GEMV kernel up to kGemvMaxRows rows, else at::linear, i.e. OpenBLAS
// for fp32) against the project's batch-invariant kernels (engine/kernels: the deterministic
// mode's path), per row count.
//
// For a model shape, every linear of one layer (q, k, v, o, gate, up, down) and the lm_head, at
// each --rows value (the tokens of a step: 1 is batch-1 decode, 64 decode at 64 sequences, 256+ a
// prefill chunk). Each repeat times both paths back to back in alternating order; the table
// reports median GFLOP/s and the median of the per-repeat ratios (project / aten), with the CPU
// and the kernel path (CRL_CPU_ISA=avx2 forces the AVX2 kernels; OPENBLAS_CORETYPE=Haswell makes
// OpenBLAS run its AVX2 code). Results are appended to --json-out as one JSON line.
#pragma once

#include <cstdint>
#include <string>

namespace CLI {
class App;
}

namespace crl::bench {

struct LinearBenchOptions {
  std::string shape = "smollm2-135m";
  std::string dtype = "float32";
  std::string rows = "1,16,64,256";
  int32_t threads = 2;
  int32_t repeats = 15;
  std::string json_out;
};

void add_linear_bench_flags(CLI::App& cmd, LinearBenchOptions& opts);
int run_linear_bench(const LinearBenchOptions& opts);

}  // namespace crl::bench
