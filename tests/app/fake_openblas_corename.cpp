// Preloaded by tests/app/openblas_kernels.sh: answers openblas_get_corename() as Debian's OpenBLAS
// 0.3.21 does on the Intel Xeons it does not know ("Prescott", SSE3 kernels), so colocated-rl's
// raise of the kernels runs on any CPU. The real OpenBLAS still loads and picks its own kernels.
extern "C" char* openblas_get_corename() {
  static char name[] = "Prescott";
  return name;
}
