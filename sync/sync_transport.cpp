#include "sync/sync_transport.h"

#include <fmt/format.h>
#include <unistd.h>

#include <cstdio>
#include <nlohmann/json.hpp>
#include <stdexcept>

#include "common/check.h"
#include "sync/cuda_ipc.h"

namespace crl::sync {

SyncTransport parse_sync_transport(const std::string& s) {
  if (s == "auto") return SyncTransport::kAuto;
  if (s == "communicator") return SyncTransport::kCommunicator;
  if (s == "ipc") return SyncTransport::kIpc;
  CRL_INVALID("unknown sync transport '", s, "' (auto, communicator or ipc)");
}

const char* sync_transport_name(SyncTransport t) {
  switch (t) {
    case SyncTransport::kAuto:
      return "auto";
    case SyncTransport::kCommunicator:
      return "communicator";
    case SyncTransport::kIpc:
      return "ipc";
  }
  return "?";
}

bool DeviceIdentity::shares_memory_with(const DeviceIdentity& o) const {
  if (host != o.host || kind != o.kind) return false;
  return is_cuda() ? gpu == o.gpu : pid == o.pid;
}

std::string DeviceIdentity::describe() const {
  if (!is_cuda()) return fmt::format("cpu on {} (pid {})", host, pid);
  std::string s = fmt::format("cuda:{} {}", index, gpu);
  if (!pci.empty() && pci != gpu) s += fmt::format(" (pci {})", pci);
  return s + " on " + host;
}

std::string DeviceIdentity::to_json() const {
  nlohmann::json j = {{"host", host}, {"pid", pid}, {"kind", kind},
                      {"gpu", gpu},   {"pci", pci}, {"index", index}};
  return j.dump();
}

DeviceIdentity DeviceIdentity::from_json(const std::string& text) {
  try {
    auto j = nlohmann::json::parse(text);
    DeviceIdentity d;
    d.host = j.at("host").get<std::string>();
    d.pid = j.at("pid").get<int64_t>();
    d.kind = j.at("kind").get<std::string>();
    d.gpu = j.at("gpu").get<std::string>();
    d.pci = j.at("pci").get<std::string>();
    d.index = j.at("index").get<int>();
    return d;
  } catch (const std::exception& e) {
    CRL_INVALID("malformed device identity '", text, "': ", e.what());
  }
}

DeviceIdentity identify_device(const at::Device& device) {
  DeviceIdentity d;
  char host[256] = {0};
  if (gethostname(host, sizeof(host) - 1) != 0) std::snprintf(host, sizeof(host), "unknown-host");
  d.host = host;
  d.pid = static_cast<int64_t>(getpid());
  if (device.is_cpu()) return d;
  if (!device.is_cuda()) {
    CRL_INVALID("weight sync: buckets on ", device.str(), " (only cpu and cuda are supported)");
  }
  CudaDeviceInfo info = cuda_device_info(device.has_index() ? device.index() : -1);
  d.kind = "cuda";
  d.index = info.index;
  d.pci = info.pci_bus_id;
  d.gpu = info.uuid.empty() ? info.pci_bus_id : info.uuid;
  return d;
}

namespace {

std::string list_members(const std::vector<SyncMember>& members) {
  std::string s;
  for (const auto& m : members) {
    if (!s.empty()) s += "; ";
    s += m.who + " on " + m.device.describe();
  }
  return s;
}

}  // namespace

SyncTransport select_transport(SyncTransport requested, const std::string& group,
                               const std::vector<SyncMember>& members) {
  if (requested == SyncTransport::kCommunicator || members.empty()) {
    return SyncTransport::kCommunicator;
  }
  auto fail = [&](const std::string& why) -> SyncTransport {
    throw std::runtime_error(
        fmt::format("weight sync group {}: {} (members: {})", group, why, list_members(members)));
  };
  int cuda = 0;
  for (const auto& m : members) cuda += m.device.is_cuda() ? 1 : 0;
  const int n = static_cast<int>(members.size());
  if (cuda != 0 && cuda != n) {
    return fail(
        "some members' weight buckets are on the CPU and others on a GPU; every member "
        "of a sync group must hold them on the same kind of device");
  }
  // Pairs sharing one memory space: all of them (one space), none (distinct devices) or a mix.
  int sharing_pairs = 0;
  const int pairs = n * (n - 1) / 2;
  std::string shared_example;
  for (int a = 0; a < n; ++a) {
    for (int b = a + 1; b < n; ++b) {
      if (members[a].device.shares_memory_with(members[b].device)) {
        ++sharing_pairs;
        if (shared_example.empty()) {
          shared_example = fmt::format("{} and {} share {}", members[a].who, members[b].who,
                                       members[a].device.describe());
        }
      }
    }
  }
  const bool one_space = sharing_pairs == pairs;
  if (cuda == 0) {
    if (requested != SyncTransport::kIpc) return SyncTransport::kCommunicator;
    if (one_space) return SyncTransport::kIpc;  // ranks as threads of one process (tests)
    return fail(
        "ipc transport requested, but CPU buckets can be handed over only between ranks "
        "of one process (on a GPU: between ranks on the same GPU)");
  }
  if (one_space) return SyncTransport::kIpc;
  if (sharing_pairs == 0) {
    if (requested == SyncTransport::kIpc) {
      return fail(
          "ipc transport requested, but the members are on distinct GPUs (CUDA IPC hands "
          "buckets over only between ranks on the same GPU; use the communicator)");
    }
    return SyncTransport::kCommunicator;
  }
  return fail(fmt::format(
      "{}, but not every member is on that GPU: weight updates need either all of a sync group "
      "on one GPU (CUDA IPC) or each member on a GPU of its own (NCCL)",
      shared_example));
}

}  // namespace crl::sync
