#include "engine/kernels/cpu_isa.h"

#include <atomic>
#include <cctype>
#include <cstdlib>
#include <fstream>
#include <mutex>
#include <stdexcept>

namespace crl::engine::kernels {
namespace {

bool cpu_has_avx2() {
#if defined(__x86_64__)
  return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
#else
  return false;
#endif
}

bool cpu_has_avx512() {
  // libgcc's feature bits include the OS check (XCR0 enables the ZMM and opmask state).
#if defined(__x86_64__)
  return cpu_has_avx2() && __builtin_cpu_supports("avx512f") &&
         __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl");
#else
  return false;
#endif
}

bool cpu_has_avx512_bf16() {
#if defined(__x86_64__)
  return cpu_has_avx512() && __builtin_cpu_supports("avx512bf16");
#else
  return false;
#endif
}

bool cpu_supports(CpuIsa isa) {
  switch (isa) {
    case CpuIsa::kScalar:
      return true;
    case CpuIsa::kAvx2:
      return cpu_has_avx2();
    case CpuIsa::kAvx512:
      return cpu_has_avx512();
  }
  return false;
}

CpuIsa best_cpu_isa() {
  if (cpu_has_avx512()) return CpuIsa::kAvx512;
  if (cpu_has_avx2()) return CpuIsa::kAvx2;
  return CpuIsa::kScalar;
}

void require_supported(CpuIsa isa, const char* why) {
  if (!cpu_supports(isa)) {
    throw std::runtime_error(std::string(why) + ": this CPU cannot run the " + cpu_isa_name(isa) +
                             " kernels (" + describe_cpu() + ")");
  }
}

CpuIsa initial_cpu_isa() {
  const char* env = std::getenv("CRL_CPU_ISA");
  if (env == nullptr || *env == '\0') return best_cpu_isa();
  CpuIsa isa;
  try {
    isa = parse_cpu_isa(env);
  } catch (const std::invalid_argument& e) {
    throw std::runtime_error(std::string("CRL_CPU_ISA: ") + e.what());
  }
  if (std::string(env) == "auto") return best_cpu_isa();
  require_supported(isa, "CRL_CPU_ISA");
  return isa;
}

std::atomic<int> g_isa{-1};
std::once_flag g_isa_once;

}  // namespace

std::string cpu_model_name() {
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("model name", 0) == 0) {
      const size_t colon = line.find(':');
      if (colon != std::string::npos) return line.substr(line.find_first_not_of(' ', colon + 1));
    }
  }
  return "unknown CPU";
}

CpuIsa active_cpu_isa() {
  std::call_once(g_isa_once, [] {
    if (g_isa.load() < 0) g_isa.store(static_cast<int>(initial_cpu_isa()));
  });
  return static_cast<CpuIsa>(g_isa.load(std::memory_order_relaxed));
}

bool bf16_dot_supported() {
  static const bool has = cpu_has_avx512_bf16();
  return has && active_cpu_isa() == CpuIsa::kAvx512;
}

std::vector<CpuIsa> supported_cpu_isas() {
  std::vector<CpuIsa> out;
  for (CpuIsa isa : {CpuIsa::kScalar, CpuIsa::kAvx2, CpuIsa::kAvx512}) {
    if (cpu_supports(isa)) out.push_back(isa);
  }
  return out;
}

const char* cpu_isa_name(CpuIsa isa) {
  switch (isa) {
    case CpuIsa::kScalar:
      return "scalar";
    case CpuIsa::kAvx2:
      return "avx2";
    case CpuIsa::kAvx512:
      return "avx512";
  }
  return "?";
}

CpuIsa parse_cpu_isa(const std::string& name) {
  if (name == "scalar") return CpuIsa::kScalar;
  if (name == "avx2") return CpuIsa::kAvx2;
  if (name == "avx512") return CpuIsa::kAvx512;
  if (name == "auto") return best_cpu_isa();
  throw std::invalid_argument("unknown CPU kernel path '" + name +
                              "' (expected auto, avx512, avx2 or scalar)");
}

std::string openblas_core_for(const std::string& chosen, CpuIsa isa) {
  if (isa == CpuIsa::kScalar) return "";
  std::string core;
  for (char c : chosen) core += static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  // OpenBLAS's x86 cores whose kernels stop below AVX2; a name not listed (Haswell, Zen,
  // SkylakeX, a core newer than this list, another library's answer) is kept.
  for (const char* below : {"katmai",      "coppermine", "northwood",  "prescott",     "banias",
                            "atom",        "core2",      "penryn",     "dunnington",   "nehalem",
                            "sandybridge", "athlon",     "opteron",    "opteron_sse3", "barcelona",
                            "bobcat",      "bulldozer",  "piledriver", "steamroller",  "nano"}) {
    if (core == below) return isa == CpuIsa::kAvx512 ? "SkylakeX" : "Haswell";
  }
  return "";
}

std::string openblas_raise_note() {
  const char* v = std::getenv("CRL_OPENBLAS_RAISED");
  const std::string raised = v == nullptr ? "" : v;
  const size_t colon = raised.find(':');
  if (colon == std::string::npos) return "";
  const std::string running = raised.substr(colon + 1);
  const char* coretype = std::getenv("OPENBLAS_CORETYPE");
  if (coretype == nullptr || running != coretype) return "";  // since set otherwise
  return "OpenBLAS chose its " + raised.substr(0, colon) + " kernels on this CPU; running its " +
         running + " kernels (OPENBLAS_CORETYPE=" + running + "; set it to choose)";
}

std::string describe_cpu() {
  std::string flags;
#if defined(__x86_64__)
  const std::pair<const char*, bool> features[] = {
      {"avx2", __builtin_cpu_supports("avx2")},
      {"fma", __builtin_cpu_supports("fma")},
      {"avx512f", __builtin_cpu_supports("avx512f")},
      {"avx512bw", __builtin_cpu_supports("avx512bw")},
      {"avx512vl", __builtin_cpu_supports("avx512vl")},
      {"avx512_bf16", __builtin_cpu_supports("avx512bf16")},
  };
  for (const auto& [name, on] : features) {
    if (!on) continue;
    if (!flags.empty()) flags += ' ';
    flags += name;
  }
#endif
  const int isa = g_isa.load();
  const std::string note = openblas_raise_note();
  return cpu_model_name() + " (" + (flags.empty() ? "no AVX2" : flags) +
         "), kernels: " + (isa < 0 ? "not chosen yet" : cpu_isa_name(static_cast<CpuIsa>(isa))) +
         (note.empty() ? "" : "; " + note);
}

ScopedCpuIsa::ScopedCpuIsa(CpuIsa isa) : previous_(active_cpu_isa()) {
  require_supported(isa, "ScopedCpuIsa");
  g_isa.store(static_cast<int>(isa));
}

ScopedCpuIsa::~ScopedCpuIsa() { g_isa.store(static_cast<int>(previous_)); }

}  // namespace crl::engine::kernels
