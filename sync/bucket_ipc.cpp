#include "sync/bucket_ipc.h"

#include <fmt/format.h>
#include <unistd.h>

#include <cstring>
#include <stdexcept>

#include "common/check.h"

namespace crl::sync {
namespace {

class DoneCopy : public IpcCopy {
 public:
  bool done() override { return true; }
};

class HostIpcMemory : public IpcMemory {
 public:
  const char* name() const override { return "host"; }

  bool wait_writes(std::chrono::steady_clock::time_point) override { return true; }

  IpcRegion export_region(const at::Tensor& t) override {
    if (!t.device().is_cpu() || !t.is_contiguous()) {
      throw std::runtime_error("host ipc: exports contiguous CPU tensors only");
    }
    IpcRegion r;
    auto address = reinterpret_cast<uintptr_t>(t.data_ptr());
    r.handle.assign(reinterpret_cast<const char*>(&address), sizeof(address));
    r.bytes = t.numel() * static_cast<int64_t>(t.element_size());
    r.pid = static_cast<int64_t>(getpid());
    return r;
  }

  std::unique_ptr<IpcCopy> copy_async(const IpcRegion& src, const at::Tensor& dst) override {
    const uintptr_t address = resolve(src);
    const int64_t dst_bytes = dst.numel() * static_cast<int64_t>(dst.element_size());
    if (!dst.device().is_cpu() || !dst.is_contiguous() || dst_bytes != src.bytes) {
      throw std::runtime_error(fmt::format("host ipc: destination of {} bytes for a region of {}",
                                           dst_bytes, src.bytes));
    }
    std::memcpy(dst.data_ptr(), reinterpret_cast<const char*>(address) + src.offset,
                static_cast<size_t>(src.bytes));
    return std::make_unique<DoneCopy>();
  }

  at::Tensor open_region(const IpcRegion& region) override {
    const uintptr_t address = resolve(region);
    if (region.offset < 0 || region.bytes < 0) throw std::runtime_error("host ipc: bad region");
    return at::from_blob(reinterpret_cast<char*>(address) + region.offset, {region.bytes},
                         at::TensorOptions().dtype(at::kByte));
  }

 private:
  // The address a region names; refused from another process.
  static uintptr_t resolve(const IpcRegion& r) {
    if (r.pid != static_cast<int64_t>(getpid())) {
      throw std::runtime_error(fmt::format(
          "host ipc: the region comes from process {}, and CPU memory is shared only between ranks "
          "of one process (this is {})",
          r.pid, getpid()));
    }
    uintptr_t address = 0;
    if (r.handle.size() != sizeof(address)) throw std::runtime_error("host ipc: bad handle");
    std::memcpy(&address, r.handle.data(), sizeof(address));
    return address;
  }
};

}  // namespace

std::unique_ptr<IpcMemory> make_host_ipc_memory() { return std::make_unique<HostIpcMemory>(); }

std::string encode_handle(const std::string& bytes) {
  static const char* kHex = "0123456789abcdef";
  std::string out;
  out.reserve(bytes.size() * 2);
  for (unsigned char c : bytes) {
    out.push_back(kHex[c >> 4]);
    out.push_back(kHex[c & 15]);
  }
  return out;
}

std::string decode_handle(const std::string& hex) {
  auto nibble = [&](char c) -> int {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    CRL_INVALID("bad hex in an ipc handle: '", hex, "'");
  };
  if (hex.size() % 2 != 0) CRL_INVALID("odd-length hex in an ipc handle: '", hex, "'");
  std::string out(hex.size() / 2, '\0');
  for (size_t i = 0; i < out.size(); ++i) {
    out[i] = static_cast<char>(nibble(hex[2 * i]) * 16 + nibble(hex[2 * i + 1]));
  }
  return out;
}

}  // namespace crl::sync
