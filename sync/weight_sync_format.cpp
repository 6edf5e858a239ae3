// WeightSync's values outside the sync itself (sync/weight_sync.h): the mode names, the byte
// checksum --sync-verify compares, and the layout as the one line of JSON the setup exchanges.
#include <fmt/format.h>

#include <cstring>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <string>
#include <vector>

#include "common/check.h"
#include "sync/weight_sync.h"

namespace crl::sync {
namespace {

at::ScalarType dtype_from_name(const std::string& s) {
  for (auto t : {at::kFloat, at::kBFloat16, at::kHalf, at::kDouble, at::kByte, at::kChar,
                 at::kShort, at::kInt, at::kLong, at::kBool}) {
    if (s == c10::toString(t)) return t;
  }
  throw std::invalid_argument("unknown dtype '" + s + "' in a weight layout");
}

}  // namespace

SyncMode parse_sync_mode(const std::string& s) {
  if (s == "bucket") return SyncMode::kBucket;
  if (s == "per-tensor") return SyncMode::kPerTensor;
  if (s == "raw") return SyncMode::kRaw;
  CRL_INVALID("unknown sync mode '", s, "' (bucket, per-tensor or raw)");
}

const char* sync_mode_name(SyncMode m) {
  switch (m) {
    case SyncMode::kBucket:
      return "bucket";
    case SyncMode::kPerTensor:
      return "per-tensor";
    case SyncMode::kRaw:
      return "raw";
  }
  return "?";
}

uint64_t checksum_bytes(const at::Tensor& tensor, int64_t chunk_bytes) {
  if (chunk_bytes <= 0 || chunk_bytes % 32 != 0) {
    CRL_INVALID("checksum chunk must be a positive multiple of 32 bytes, got ", chunk_bytes);
  }
  const bool host = tensor.device().is_cpu();
  at::Tensor bytes = tensor.contiguous().reshape({-1}).view(at::kByte);
  const int64_t n = bytes.numel();
  // Four independent multiply-xor lanes over 8-byte words (32-byte groups), then the tail byte by
  // byte. Chunks are multiples of 32 bytes, so they split no group and the tail is in the last.
  constexpr uint64_t kPrime = 0x100000001b3ULL;
  uint64_t h[4] = {0xcbf29ce484222325ULL, 0x84222325cbf29ce4ULL, 0x9e3779b97f4a7c15ULL,
                   0xc2b2ae3d27d4eb4fULL};
  const int64_t grouped = n / 32 * 32;
  std::vector<unsigned char> tail;
  for (int64_t off = 0; off < n; off += chunk_bytes) {
    const int64_t len = std::min(chunk_bytes, n - off);
    at::Tensor part = bytes.narrow(0, off, len);
    if (!host) part = part.cpu();
    const auto* p = static_cast<const unsigned char*>(part.data_ptr());
    const int64_t in_groups = std::max<int64_t>(0, std::min(len, grouped - off));
    for (int64_t g = 0; g < in_groups; g += 32) {
      for (int l = 0; l < 4; ++l) {
        uint64_t w;
        std::memcpy(&w, p + g + l * 8, 8);
        h[l] = (h[l] ^ w) * kPrime;
        h[l] ^= h[l] >> 29;
      }
    }
    tail.insert(tail.end(), p + in_groups, p + len);
  }
  uint64_t out = h[0] ^ (h[1] * 3) ^ (h[2] * 5) ^ (h[3] * 7);
  for (unsigned char c : tail) out = (out ^ c) * kPrime;
  return out ^ static_cast<uint64_t>(n);
}

std::string layout_to_json(const WeightLayout& layout) {
  nlohmann::json specs = nlohmann::json::array();
  for (const auto& s : layout.specs()) {
    specs.push_back({s.name, s.shape, c10::toString(s.dtype)});
  }
  nlohmann::json j = {{"bucket_bytes", layout.bucket_bytes()},
                      {"alignment", layout.alignment()},
                      {"hash", fmt::format("{:016x}", layout.hash())},
                      {"specs", specs}};
  return j.dump();
}

WeightLayout layout_from_json(const std::string& text) {
  auto j = nlohmann::json::parse(text);
  std::vector<TensorSpec> specs;
  for (const auto& s : j.at("specs")) {
    specs.push_back(TensorSpec{s.at(0).get<std::string>(), s.at(1).get<std::vector<int64_t>>(),
                               dtype_from_name(s.at(2).get<std::string>())});
  }
  return WeightLayout::plan(std::move(specs), j.at("bucket_bytes").get<int64_t>(),
                            j.at("alignment").get<int64_t>());
}

}  // namespace crl::sync
