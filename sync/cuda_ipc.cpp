#include "sync/cuda_ipc.h"

#include <fmt/format.h>

#include <stdexcept>

#if !defined(CRL_WITH_CUDART)

namespace crl::sync {
namespace {
const char* kNoCuda =
    "this build has no CUDA runtime support (cuda_runtime_api.h and cuda.h not found at build "
    "time)";
}  // namespace

bool cuda_runtime_available(std::string* why_not) {
  if (why_not) *why_not = kNoCuda;
  return false;
}
int cuda_device_count() { return 0; }
CudaDeviceInfo cuda_device_info(int) { throw std::runtime_error(kNoCuda); }
int64_t cuda_device_total_bytes(int) { throw std::runtime_error(kNoCuda); }
void cuda_synchronize_device(int) { throw std::runtime_error(kNoCuda); }
std::unique_ptr<IpcMemory> make_cuda_ipc_memory(int) {
  throw std::runtime_error(fmt::format("CUDA IPC is not usable here: {}", kNoCuda));
}

}  // namespace crl::sync

#else

#include <cuda.h>
#include <cuda_runtime_api.h>
#include <dlfcn.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <map>
#include <mutex>
#include <thread>
#include <vector>

namespace crl::sync {
namespace {

using Clock = std::chrono::steady_clock;

// The CUDA runtime and driver entry points used here, resolved from the shared libraries.
struct CudaApi {
#define CRL_CUDA_FN(name) decltype(&::name) name = nullptr
  CRL_CUDA_FN(cudaGetDevice);
  CRL_CUDA_FN(cudaSetDevice);
  CRL_CUDA_FN(cudaGetDeviceCount);
  CRL_CUDA_FN(cudaDeviceGetPCIBusId);
  CRL_CUDA_FN(cudaDeviceSynchronize);
  CRL_CUDA_FN(cudaIpcGetMemHandle);
  CRL_CUDA_FN(cudaIpcOpenMemHandle);
  CRL_CUDA_FN(cudaIpcCloseMemHandle);
  CRL_CUDA_FN(cudaMemcpyAsync);
  CRL_CUDA_FN(cudaStreamCreateWithFlags);
  CRL_CUDA_FN(cudaStreamDestroy);
  CRL_CUDA_FN(cudaStreamSynchronize);
  CRL_CUDA_FN(cudaStreamWaitEvent);
  CRL_CUDA_FN(cudaEventCreateWithFlags);
  CRL_CUDA_FN(cudaEventRecord);
  CRL_CUDA_FN(cudaEventQuery);
  CRL_CUDA_FN(cudaEventDestroy);
  CRL_CUDA_FN(cudaGetErrorString);
  // Driver API (libcuda.so.1); the header maps the names to their _v2 symbols.
  CRL_CUDA_FN(cuInit);
  CRL_CUDA_FN(cuDeviceGet);
  CRL_CUDA_FN(cuDeviceGetUuid);
  CRL_CUDA_FN(cuMemGetAddressRange);
  CRL_CUDA_FN(cuDeviceTotalMem);
  CRL_CUDA_FN(cuGetErrorString);
#undef CRL_CUDA_FN
  std::string error;  // empty when everything resolved and a device is present
};

void* open_first(const std::vector<std::string>& names, std::string& tried) {
  // A copy libtorch already loaded wins over loading another one.
  for (const auto& n : names) {
    if (void* h = dlopen(n.c_str(), RTLD_NOW | RTLD_NOLOAD)) return h;
  }
  for (const auto& n : names) {
    if (void* h = dlopen(n.c_str(), RTLD_NOW | RTLD_GLOBAL)) return h;
    tried += " " + n;
  }
  return nullptr;
}

const CudaApi& api() {
  static CudaApi a;
  static std::once_flag once;
  std::call_once(once, [] {
    std::string tried;
    void* cudart =
        open_first({"libcudart.so.13", "libcudart.so.12", "libcudart.so",
                    "/usr/local/cuda/lib64/libcudart.so", "/usr/local/cuda/lib/libcudart.so"},
                   tried);
    void* driver = open_first({"libcuda.so.1", "libcuda.so"}, tried);
    if (!cudart || !driver) {
      a.error =
          fmt::format("cannot load {} (tried:{})", !cudart ? "libcudart" : "libcuda.so.1", tried);
      return;
    }
    auto load = [&](void* lib, const char* symbol, auto& fn) {
      fn = reinterpret_cast<std::remove_reference_t<decltype(fn)> >(dlsym(lib, symbol));
      if (!fn && a.error.empty()) a.error = fmt::format("symbol {} not found", symbol);
    };
#define CRL_LOAD(lib, name) load(lib, #name, a.name)
    CRL_LOAD(cudart, cudaGetDevice);
    CRL_LOAD(cudart, cudaSetDevice);
    CRL_LOAD(cudart, cudaGetDeviceCount);
    CRL_LOAD(cudart, cudaDeviceGetPCIBusId);
    CRL_LOAD(cudart, cudaDeviceSynchronize);
    CRL_LOAD(cudart, cudaIpcGetMemHandle);
    CRL_LOAD(cudart, cudaIpcOpenMemHandle);
    CRL_LOAD(cudart, cudaIpcCloseMemHandle);
    CRL_LOAD(cudart, cudaMemcpyAsync);
    CRL_LOAD(cudart, cudaStreamCreateWithFlags);
    CRL_LOAD(cudart, cudaStreamDestroy);
    CRL_LOAD(cudart, cudaStreamSynchronize);
    CRL_LOAD(cudart, cudaStreamWaitEvent);
    CRL_LOAD(cudart, cudaEventCreateWithFlags);
    CRL_LOAD(cudart, cudaEventRecord);
    CRL_LOAD(cudart, cudaEventQuery);
    CRL_LOAD(cudart, cudaEventDestroy);
    CRL_LOAD(cudart, cudaGetErrorString);
#undef CRL_LOAD
    load(driver, "cuInit", a.cuInit);
    load(driver, "cuDeviceGet", a.cuDeviceGet);
    load(driver, "cuDeviceGetUuid_v2", a.cuDeviceGetUuid);
    load(driver, "cuMemGetAddressRange_v2", a.cuMemGetAddressRange);
    load(driver, "cuDeviceTotalMem_v2", a.cuDeviceTotalMem);
    load(driver, "cuGetErrorString", a.cuGetErrorString);
    if (a.error.empty()) {
      int n = 0;
      cudaError_t e = a.cudaGetDeviceCount(&n);
      if (e != cudaSuccess) {
        a.error = fmt::format("cudaGetDeviceCount failed: {}", a.cudaGetErrorString(e));
      } else if (n == 0) {
        a.error = "no CUDA device";
      } else if (a.cuInit(0) != CUDA_SUCCESS) {
        a.error = "cuInit failed";
      }
    }
  });
  return a;
}

const CudaApi& usable_api() {
  const auto& a = api();
  if (!a.error.empty()) throw std::runtime_error("CUDA is not usable here: " + a.error);
  return a;
}

void check_rt(cudaError_t e, const char* call) {
  if (e != cudaSuccess) {
    throw std::runtime_error(fmt::format("{} failed: {}", call, api().cudaGetErrorString(e)));
  }
}

std::string driver_error(CUresult r) {
  const char* s = nullptr;
  if (api().cuGetErrorString) api().cuGetErrorString(r, &s);
  return s ? s : fmt::format("CUresult {}", static_cast<int>(r));
}

int64_t nbytes(const at::Tensor& t) { return t.numel() * static_cast<int64_t>(t.element_size()); }

// Polls `event` until it completed or `deadline` passed; throws on a device error.
bool poll_event(cudaEvent_t event, Clock::time_point deadline) {
  const auto& a = api();
  auto pause = std::chrono::microseconds(1);
  while (true) {
    cudaError_t e = a.cudaEventQuery(event);
    if (e == cudaSuccess) return true;
    if (e != cudaErrorNotReady) check_rt(e, "cudaEventQuery");
    if (Clock::now() >= deadline) return false;
    std::this_thread::sleep_for(pause);
    pause = std::min(pause * 2, std::chrono::microseconds(100));
  }
}

class CudaCopy : public IpcCopy {
 public:
  CudaCopy(int device, cudaEvent_t done) : device_(device), done_(done) {}
  ~CudaCopy() override {
    if (done_) api().cudaEventDestroy(done_);
  }
  bool done() override {
    if (finished_) return true;
    const auto& a = api();
    a.cudaSetDevice(device_);  // the current device is per thread
    cudaError_t e = a.cudaEventQuery(done_);
    if (e == cudaErrorNotReady) return false;
    check_rt(e, "cudaEventQuery (ipc copy)");
    finished_ = true;
    return true;
  }

 private:
  int device_;
  cudaEvent_t done_;
  bool finished_ = false;
};

class CudaIpcMemory : public IpcMemory {
 public:
  explicit CudaIpcMemory(int device) : device_(device) {
    const auto& a = usable_api();
    check_rt(a.cudaSetDevice(device_), "cudaSetDevice");
    check_rt(a.cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), "cudaStreamCreate");
  }

  ~CudaIpcMemory() override {
    const auto& a = api();
    a.cudaSetDevice(device_);
    // Copies still in flight (only after a failure) must not read unmapped memory.
    if (stream_) a.cudaStreamSynchronize(stream_);
    for (const auto& [handle, opened] : opened_) a.cudaIpcCloseMemHandle(opened.base);
    if (stream_) a.cudaStreamDestroy(stream_);
  }

  const char* name() const override { return "cuda-ipc"; }

  bool wait_writes(Clock::time_point deadline) override {
    const auto& a = api();
    check_rt(a.cudaSetDevice(device_), "cudaSetDevice");
    cudaEvent_t written = nullptr;
    check_rt(a.cudaEventCreateWithFlags(&written, cudaEventDisableTiming), "cudaEventCreate");
    bool done = false;
    try {
      check_rt(a.cudaEventRecord(written, cudaStreamLegacy), "cudaEventRecord");
      done = poll_event(written, deadline);
    } catch (...) {
      a.cudaEventDestroy(written);
      throw;
    }
    a.cudaEventDestroy(written);
    return done;
  }

  IpcRegion export_region(const at::Tensor& t) override {
    check_tensor(t, "export");
    const auto& a = api();
    check_rt(a.cudaSetDevice(device_), "cudaSetDevice");
    auto ptr = reinterpret_cast<CUdeviceptr>(t.data_ptr());
    CUdeviceptr base = 0;
    size_t size = 0;
    CUresult r = a.cuMemGetAddressRange(&base, &size, ptr);
    if (r != CUDA_SUCCESS) {
      throw std::runtime_error(fmt::format("cuMemGetAddressRange failed on the bucket at {:#x}: {}",
                                           static_cast<uint64_t>(ptr), driver_error(r)));
    }
    cudaIpcMemHandle_t handle;
    cudaError_t e = a.cudaIpcGetMemHandle(&handle, reinterpret_cast<void*>(base));
    if (e != cudaSuccess) {
      throw std::runtime_error(fmt::format(
          "cudaIpcGetMemHandle failed on the allocation at {:#x} ({} bytes) holding a bucket: {} "
          "(only cudaMalloc allocations can be exported: PyTorch's expandable segments, "
          "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True, and cudaMallocAsync pools cannot)",
          static_cast<uint64_t>(base), size, a.cudaGetErrorString(e)));
    }
    IpcRegion region;
    region.handle.assign(reinterpret_cast<const char*>(&handle), sizeof(handle));
    region.offset = static_cast<int64_t>(ptr - base);
    region.bytes = nbytes(t);
    region.pid = static_cast<int64_t>(getpid());
    if (region.offset + region.bytes > static_cast<int64_t>(size)) {
      throw std::runtime_error(
          fmt::format("a bucket of {} bytes at offset {} does not fit its "
                      "allocation of {} bytes",
                      region.bytes, region.offset, size));
    }
    return region;
  }

  std::unique_ptr<IpcCopy> copy_async(const IpcRegion& src, const at::Tensor& dst) override {
    if (src.pid == static_cast<int64_t>(getpid())) {
      throw std::runtime_error(
          "CUDA IPC cannot open a memory handle in the process that exported it (sender and "
          "receiver are one process)");
    }
    check_tensor(dst, "receive into");
    if (nbytes(dst) != src.bytes) {
      throw std::runtime_error(fmt::format("ipc copy: destination of {} bytes for a region of {}",
                                           nbytes(dst), src.bytes));
    }
    const auto& a = api();
    check_rt(a.cudaSetDevice(device_), "cudaSetDevice");
    const Opened& opened = open(src.handle);
    check_bounds(src, opened, /*must_know_size=*/false);
    // Ordered after everything queued on libtorch's stream (e.g. the last engine step reading the
    // weights this copy overwrites).
    cudaEvent_t before = nullptr, done = nullptr;
    check_rt(a.cudaEventCreateWithFlags(&before, cudaEventDisableTiming), "cudaEventCreate");
    cudaError_t e = a.cudaEventRecord(before, cudaStreamLegacy);
    if (e == cudaSuccess) e = a.cudaStreamWaitEvent(stream_, before, 0);
    a.cudaEventDestroy(before);
    check_rt(e, "cudaStreamWaitEvent");
    check_rt(a.cudaMemcpyAsync(dst.data_ptr(), static_cast<const char*>(opened.base) + src.offset,
                               static_cast<size_t>(src.bytes), cudaMemcpyDeviceToDevice, stream_),
             "cudaMemcpyAsync (ipc bucket copy)");
    check_rt(a.cudaEventCreateWithFlags(&done, cudaEventDisableTiming), "cudaEventCreate");
    e = a.cudaEventRecord(done, stream_);
    if (e != cudaSuccess) {
      a.cudaEventDestroy(done);
      check_rt(e, "cudaEventRecord");
    }
    return std::make_unique<CudaCopy>(device_, done);
  }

  at::Tensor open_region(const IpcRegion& region) override {
    if (region.pid == static_cast<int64_t>(getpid())) {
      throw std::runtime_error(
          "CUDA IPC cannot open a memory handle in the process that exported it (sender and "
          "receiver are one process)");
    }
    check_rt(api().cudaSetDevice(device_), "cudaSetDevice");
    const Opened& opened = open(region.handle);
    // This process writes there: the region must be known to lie inside the allocation.
    check_bounds(region, opened, /*must_know_size=*/true);
    return at::from_blob(static_cast<char*>(opened.base) + region.offset, {region.bytes},
                         at::TensorOptions().dtype(at::kByte).device(at::kCUDA, device_));
  }

 private:
  struct Opened {
    void* base = nullptr;
    int64_t size = -1;  // -1: unknown
  };

  // Each exported allocation is opened once; the senders' buffers are persistent.
  const Opened& open(const std::string& handle_bytes) {
    auto it = opened_.find(handle_bytes);
    if (it != opened_.end()) return it->second;
    const auto& a = api();
    cudaIpcMemHandle_t handle;
    if (handle_bytes.size() != sizeof(handle)) {
      throw std::runtime_error(fmt::format("ipc handle of {} bytes (a CUDA handle has {})",
                                           handle_bytes.size(), sizeof(handle)));
    }
    std::memcpy(&handle, handle_bytes.data(), sizeof(handle));
    Opened o;
    cudaError_t e = a.cudaIpcOpenMemHandle(&o.base, handle, cudaIpcMemLazyEnablePeerAccess);
    if (e != cudaSuccess) {
      throw std::runtime_error(fmt::format(
          "cudaIpcOpenMemHandle failed on cuda:{}: {} (sender on another GPU or host, or exited?)",
          device_, a.cudaGetErrorString(e)));
    }
    // The mapping's size bounds the regions read from it (unknown if the driver will not say).
    CUdeviceptr base = 0;
    size_t size = 0;
    if (a.cuMemGetAddressRange(&base, &size, reinterpret_cast<CUdeviceptr>(o.base)) ==
        CUDA_SUCCESS) {
      o.size = static_cast<int64_t>(size);
    }
    return opened_.emplace(handle_bytes, o).first->second;
  }

  static void check_bounds(const IpcRegion& r, const Opened& opened, bool must_know_size) {
    if (r.offset < 0 || r.bytes < 0 || (opened.size >= 0 && r.offset + r.bytes > opened.size)) {
      throw std::runtime_error(fmt::format(
          "ipc region of {} bytes at offset {} exceeds the opened allocation of {} bytes", r.bytes,
          r.offset, opened.size));
    }
    if (must_know_size && opened.size < 0) {
      throw std::runtime_error(
          "the driver does not say how large the opened allocation is (cuMemGetAddressRange), so "
          "writing into it is refused");
    }
  }

  void check_tensor(const at::Tensor& t, const char* what) const {
    const bool other_gpu = t.device().has_index() && t.device().index() != device_;
    if (!t.is_cuda() || !t.is_contiguous() || other_gpu) {
      throw std::runtime_error(fmt::format(
          "CUDA IPC can {} contiguous tensors on cuda:{} only, "
          "got {}{}",
          what, device_, t.device().str(), t.is_contiguous() ? "" : " (not contiguous)"));
    }
  }

  int device_;
  cudaStream_t stream_ = nullptr;
  std::map<std::string, Opened> opened_;  // by the handle's bytes
};

}  // namespace

bool cuda_runtime_available(std::string* why_not) {
  const auto& a = api();
  if (why_not) *why_not = a.error;
  return a.error.empty();
}

int cuda_device_count() {
  const auto& a = api();
  if (!a.error.empty()) return 0;
  int n = 0;
  return a.cudaGetDeviceCount(&n) == cudaSuccess ? n : 0;
}

CudaDeviceInfo cuda_device_info(int index) {
  const auto& a = usable_api();
  CudaDeviceInfo info;
  if (index < 0) check_rt(a.cudaGetDevice(&index), "cudaGetDevice");
  info.index = index;
  char bus[64] = {0};
  check_rt(a.cudaDeviceGetPCIBusId(bus, sizeof(bus) - 1, index), "cudaDeviceGetPCIBusId");
  info.pci_bus_id = bus;
  CUdevice dev = 0;
  CUuuid uuid;
  if (a.cuDeviceGet(&dev, index) == CUDA_SUCCESS && a.cuDeviceGetUuid(&uuid, dev) == CUDA_SUCCESS) {
    const auto* b = reinterpret_cast<const unsigned char*>(uuid.bytes);
    info.uuid = fmt::format(
        "GPU-{:02x}{:02x}{:02x}{:02x}-{:02x}{:02x}-{:02x}{:02x}-{:02x}{:02x}-{:02x}{:02x}{:02x}"
        "{:02x}{:02x}{:02x}",
        b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7], b[8], b[9], b[10], b[11], b[12], b[13],
        b[14], b[15]);
  }
  return info;
}

int64_t cuda_device_total_bytes(int index) {
  const auto& a = usable_api();
  CUdevice dev = 0;
  size_t bytes = 0;
  if (a.cuDeviceGet(&dev, index) != CUDA_SUCCESS ||
      a.cuDeviceTotalMem(&bytes, dev) != CUDA_SUCCESS) {
    throw std::runtime_error(fmt::format("cuDeviceTotalMem failed for CUDA device {}", index));
  }
  return static_cast<int64_t>(bytes);
}

void cuda_synchronize_device(int index) {
  const auto& a = usable_api();
  check_rt(a.cudaSetDevice(index), "cudaSetDevice");
  check_rt(a.cudaDeviceSynchronize(), "cudaDeviceSynchronize");
}

std::unique_ptr<IpcMemory> make_cuda_ipc_memory(int device) {
  std::string why;
  if (!cuda_runtime_available(&why)) {
    throw std::runtime_error("CUDA IPC is not usable here: " + why);
  }
  return std::make_unique<CudaIpcMemory>(device);
}

}  // namespace crl::sync

#endif
