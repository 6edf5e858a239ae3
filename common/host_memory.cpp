#include "common/host_memory.h"

#include <ATen/ATen.h>
#include <sys/mman.h>

#include <cerrno>
#include <cstdint>
#include <cstring>
#include <stdexcept>

#include "common/units.h"

#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23  // Linux 5.14; older kernels answer EINVAL and the pages are touched
#endif

namespace crl {

at::Tensor zeros_in_huge_pages(at::IntArrayRef sizes, const at::TensorOptions& options,
                               const std::string& what) {
  constexpr size_t kHugePage = size_t{2} << 20;
  int64_t numel = 1;
  for (int64_t s : sizes) numel *= s;
  const size_t bytes =
      static_cast<size_t>(numel) * c10::elementSize(c10::typeMetaToScalarType(options.dtype()));
  if (options.device().type() != at::kCPU || bytes < kHugePage) return at::zeros(sizes, options);
  auto fail = [&](const char* step, int err) {
    throw std::runtime_error(what + ": cannot " + step + " " +
                             format_bytes(static_cast<double>(bytes)) + " of host memory (" +
                             std::strerror(err) + ")");
  };
  // Map a huge page more than needed and keep the 2 MiB-aligned part, so that every page of the
  // buffer can be a huge one (the kernel aligns only some large mappings by itself).
  const size_t len = (bytes + kHugePage - 1) / kHugePage * kHugePage;
  void* raw =
      ::mmap(nullptr, len + kHugePage, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (raw == MAP_FAILED) fail("map", errno);
  const uintptr_t begin = reinterpret_cast<uintptr_t>(raw);
  const uintptr_t aligned = (begin + kHugePage - 1) / kHugePage * kHugePage;
  if (aligned > begin) ::munmap(raw, aligned - begin);
  if (const uintptr_t tail = begin + len + kHugePage - (aligned + len); tail > 0) {
    ::munmap(reinterpret_cast<void*>(aligned + len), tail);
  }
  void* p = reinterpret_cast<void*>(aligned);
  ::madvise(p, len, MADV_HUGEPAGE);  // advice only: without THP the pages are 4 KiB
  if (::madvise(p, len, MADV_POPULATE_WRITE) != 0) {
    const int err = errno;
    if (err != EINVAL) {
      ::munmap(p, len);
      fail("populate", err);
    }
    std::memset(p, 0, len);  // an older kernel: fault the pages in by writing them
  }
  return at::from_blob(
      p, sizes, [len](void* q) { ::munmap(q, len); }, options);
}

}  // namespace crl
