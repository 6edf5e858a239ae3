// CpuIsa: which instruction-set path the project's own CPU kernels (engine/kernels/) run.
//
// The batch-invariant kernels exist three times, built from the same arithmetic: an AVX-512 path,
// an AVX2 path and a portable scalar path. Every path computes every output element with the same
// sequence of IEEE-754 operations (fixed reduction orders, explicit FMAs, no contraction), so all
// three give bit-identical results; the choice only changes speed.
//
// The path is chosen once, at first use: the best one the CPU (and OS) supports, unless the
// environment variable CRL_CPU_ISA names one (`avx512`, `avx2`, `scalar` or `auto`). Naming a path
// the CPU lacks, or an unknown name, is an error (std::runtime_error) at first use. Tests may
// switch the path for a scope with ScopedCpuIsa.
//
// Thread safety: active_cpu_isa() is safe from any thread; ScopedCpuIsa is for tests and must not
// race with kernels running on other threads.
#pragma once

#include <string>
#include <vector>

namespace crl::engine::kernels {

enum class CpuIsa { kScalar = 0, kAvx2 = 1, kAvx512 = 2 };

// The path the kernels use now.
CpuIsa active_cpu_isa();
// Every path this CPU can run, scalar first.
std::vector<CpuIsa> supported_cpu_isas();
// Whether the bfloat16 dot-product linear (kernels::bf16_dot_linear) can run: the active path is
// AVX-512 and the CPU has AVX512-BF16 (so CRL_CPU_ISA=avx2 turns it off too).
bool bf16_dot_supported();
// "scalar", "avx2" or "avx512".
const char* cpu_isa_name(CpuIsa isa);
// Parses a CRL_CPU_ISA value; throws std::invalid_argument naming the value.
CpuIsa parse_cpu_isa(const std::string& name);
// One line for logs: the CPU model, the ISA flags the kernels care about and the active path,
// e.g. "AMD EPYC (avx2 fma avx512f avx512bw avx512_bf16), kernels: avx512".
std::string describe_cpu();
// The CPU model name from /proc/cpuinfo ("unknown CPU" when there is none).
std::string cpu_model_name();

// The OpenBLAS kernels (an OPENBLAS_CORETYPE value) to ask for where OpenBLAS chose `chosen`
// (openblas_get_corename, one of its x86 cores without AVX2 kernels) below the project's path
// `isa`, else "" (keep its choice: an unknown name too). Debian's
// OpenBLAS 0.3.21 takes an Intel Xeon it does not know (Sapphire/Emerald Rapids) for a Prescott
// and runs SSE3 kernels: sgemm 33 GFLOP/s at 2048^3 against 195 with SkylakeX's. Only a choice
// without AVX2 kernels is raised (SkylakeX for the AVX-512 path, Haswell for AVX2): a CPU it
// maps to Haswell or Zen keeps them (on an AMD EPYC Zen 4 SkylakeX's ran the main job 1.23x
// faster, but changed its arithmetic, so that waits for the learning sweep).
std::string openblas_core_for(const std::string& chosen, CpuIsa isa);
// "OpenBLAS chose its Prescott kernels on this CPU; running its SkylakeX kernels (...)" where the
// process raised them (colocated-rl's main sets CRL_OPENBLAS_RAISED=chosen:running), else "".
// describe_cpu() ends with it.
std::string openblas_raise_note();

// Runs the kernels on `isa` until destroyed (tests only). Throws std::runtime_error when the CPU
// cannot run it.
class ScopedCpuIsa {
 public:
  explicit ScopedCpuIsa(CpuIsa isa);
  ~ScopedCpuIsa();
  ScopedCpuIsa(const ScopedCpuIsa&) = delete;
  ScopedCpuIsa& operator=(const ScopedCpuIsa&) = delete;

 private:
  CpuIsa previous_;
};

}  // namespace crl::engine::kernels
