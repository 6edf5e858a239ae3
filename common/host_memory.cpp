#include "common/host_memory.h"

#include <ATen/ATen.h>
#include <sys/mman.h>
#include <unistd.h>

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

void drop_host_pages(const at::Tensor& t) {
  if (!t.defined() || !t.device().is_cpu() || !t.is_contiguous()) {
    throw std::invalid_argument("drop_host_pages: a contiguous CPU tensor");
  }
  const size_t page = static_cast<size_t>(::sysconf(_SC_PAGESIZE));
  auto* begin = static_cast<unsigned char*>(t.data_ptr());
  unsigned char* end = begin + t.numel() * t.element_size();
  auto* first = reinterpret_cast<unsigned char*>((reinterpret_cast<uintptr_t>(begin) + page - 1) /
                                                 page * page);
  auto* last = reinterpret_cast<unsigned char*>(reinterpret_cast<uintptr_t>(end) / page * page);
  if (first >= last) {  // no whole page inside
    std::memset(begin, 0, static_cast<size_t>(end - begin));
    return;
  }
  std::memset(begin, 0, static_cast<size_t>(first - begin));
  std::memset(last, 0, static_cast<size_t>(end - last));
  if (::madvise(first, static_cast<size_t>(last - first), MADV_DONTNEED) != 0) {
    std::memset(first, 0, static_cast<size_t>(last - first));  // kept, but zeros all the same
  }
}

}  // namespace crl
