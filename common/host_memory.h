// Large, long-lived host buffers (the engine's KV pool and weight buckets) mapped in transparent
// huge pages and populated up front.
//
// A multi-GiB pool in 4 KiB pages costs one page fault per 4 KiB the first time it is written, and
// on virtual machines a fault is expensive: zeroing a 2 GiB KV pool with at::zeros took seconds of
// an engine's start. In 2 MiB pages the same memory is a few thousand faults, and populating it at
// allocation makes a pool that does not fit fail at start, naming itself, instead of in a step.
#pragma once

#include <ATen/core/Tensor.h>

#include <string>

namespace crl {

// Zeros of `sizes` and `options`' dtype. On the CPU, for sizes of at least 2 MiB: an anonymous
// mapping advised to huge pages (where the kernel allows) and populated; freed with the tensor's
// storage. Elsewhere, or for small sizes: at::zeros. Throws std::runtime_error naming `what`, the
// size and the system's reason when the memory cannot be had.
at::Tensor zeros_in_huge_pages(at::IntArrayRef sizes, const at::TensorOptions& options,
                               const std::string& what);

// Gives the physical memory of a contiguous CPU tensor back to the system and leaves it reading
// zeros: the whole pages inside it are dropped (madvise MADV_DONTNEED on private anonymous memory:
// they come back zero-filled, one fault each, only where they are touched again), the partial
// pages at its ends are zeroed. The address stays the tensor's.
void drop_host_pages(const at::Tensor& t);

}  // namespace crl
