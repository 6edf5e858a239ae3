#include "engine/model/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <limits>
#include <nlohmann/json.hpp>
#include <stdexcept>

#include "common/check.h"

static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__,
              "safetensors are little-endian; this reader assumes a little-endian host");

namespace crl::engine {
namespace {

using nlohmann::json;

constexpr uint64_t kMaxHeaderBytes = 100ull * 1000 * 1000;

struct DtypeEntry {
  const char* name;
  at::ScalarType type;
};

// The safetensors dtypes this build can represent as ATen tensors.
constexpr DtypeEntry kDtypes[] = {
    {"F64", at::kDouble}, {"F32", at::kFloat}, {"F16", at::kHalf},  {"BF16", at::kBFloat16},
    {"I64", at::kLong},   {"I32", at::kInt},   {"I16", at::kShort}, {"I8", at::kChar},
    {"U8", at::kByte},    {"BOOL", at::kBool},
};

bool lookup_dtype(const std::string& name, at::ScalarType* type) {
  for (const auto& e : kDtypes) {
    if (name == e.name) {
      *type = e.type;
      return true;
    }
  }
  return false;
}

bool is_float_type(at::ScalarType t) {
  return t == at::kFloat || t == at::kBFloat16 || t == at::kHalf || t == at::kDouble;
}

[[noreturn]] void fail(const std::string& path, const std::string& what) {
  throw std::runtime_error("safetensors file " + path + ": " + what);
}

[[noreturn]] void fail_tensor(const std::string& path, const std::string& name,
                              const std::string& what) {
  throw std::runtime_error("safetensors file " + path + ": tensor '" + name + "': " + what);
}

// A non-negative JSON integer as uint64 (false for negatives, floats and everything else).
bool json_to_u64(const json& v, uint64_t* out) {
  if (v.is_number_unsigned()) {
    *out = v.get<uint64_t>();
    return true;
  }
  if (v.is_number_integer() && v.get<int64_t>() >= 0) {
    *out = static_cast<uint64_t>(v.get<int64_t>());
    return true;
  }
  return false;
}

SafetensorsFile::TensorInfo parse_tensor_entry(const std::string& path, const std::string& name,
                                               const json& e, uint64_t data_size) {
  if (!e.is_object()) fail_tensor(path, name, "header entry is not an object");
  for (const char* key : {"dtype", "shape", "data_offsets"}) {
    if (!e.contains(key)) fail_tensor(path, name, std::string("missing key '") + key + "'");
  }
  SafetensorsFile::TensorInfo info;
  if (!e["dtype"].is_string()) fail_tensor(path, name, "'dtype' is not a string");
  info.dtype = e["dtype"].get<std::string>();
  at::ScalarType type = at::kFloat;
  if (!lookup_dtype(info.dtype, &type))
    fail_tensor(path, name, "unknown dtype '" + info.dtype + "'");

  if (!e["shape"].is_array()) fail_tensor(path, name, "'shape' is not an array");
  uint64_t numel = 1;
  for (const auto& d : e["shape"]) {
    uint64_t dim = 0;
    if (!json_to_u64(d, &dim) || dim > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
      fail_tensor(path, name, "shape dimension " + d.dump() + " is not a non-negative integer");
    }
    if (__builtin_mul_overflow(numel, dim, &numel)) fail_tensor(path, name, "shape overflows");
    info.shape.push_back(static_cast<int64_t>(dim));
  }
  uint64_t nbytes = 0;
  if (__builtin_mul_overflow(numel, static_cast<uint64_t>(c10::elementSize(type)), &nbytes)) {
    fail_tensor(path, name, "byte size overflows");
  }

  const json& off = e["data_offsets"];
  if (!off.is_array() || off.size() != 2 || !json_to_u64(off[0], &info.begin) ||
      !json_to_u64(off[1], &info.end)) {
    fail_tensor(path, name,
                "'data_offsets' must be two non-negative integers (got " + off.dump() + ")");
  }
  if (info.begin > info.end) {
    fail_tensor(
        path, name,
        "data_offsets begin " + std::to_string(info.begin) + " > end " + std::to_string(info.end));
  }
  if (info.end > data_size) {
    fail_tensor(path, name,
                "data_offsets end " + std::to_string(info.end) + " is beyond the data region (" +
                    std::to_string(data_size) + " bytes); the file is truncated or corrupt");
  }
  if (info.end - info.begin != nbytes) {
    fail_tensor(path, name,
                "holds " + std::to_string(info.end - info.begin) + " bytes but " + info.dtype +
                    " shape needs " + std::to_string(nbytes));
  }
  return info;
}

// Writes all of [data, data+size) to fd; false on error (errno set).
bool write_all(int fd, const void* data, size_t size) {
  const char* p = static_cast<const char*>(data);
  while (size > 0) {
    const size_t chunk = std::min<size_t>(size, size_t{1} << 30);
    const ssize_t n = ::write(fd, p, chunk);
    if (n < 0) {
      if (errno == EINTR) continue;
      return false;
    }
    p += n;
    size -= static_cast<size_t>(n);
  }
  return true;
}

}  // namespace

std::unique_ptr<SafetensorsFile> SafetensorsFile::open(const std::string& path) {
  std::unique_ptr<SafetensorsFile> f(new SafetensorsFile());
  f->path_ = path;

  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) fail(path, std::string("cannot open: ") + std::strerror(errno));
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    const int err = errno;
    ::close(fd);
    fail(path, std::string("cannot stat: ") + std::strerror(err));
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    fail(path, "not a regular file");
  }
  const uint64_t file_size = static_cast<uint64_t>(st.st_size);
  if (file_size < 8) {
    ::close(fd);
    fail(path, "file is " + std::to_string(file_size) + " bytes, too small for a header");
  }
  void* map = ::mmap(nullptr, file_size, PROT_READ, MAP_PRIVATE, fd, 0);
  const int map_err = errno;
  ::close(fd);
  if (map == MAP_FAILED) fail(path, std::string("mmap failed: ") + std::strerror(map_err));
  // From here on the destructor unmaps on any throw.
  f->map_ = map;
  f->map_size_ = file_size;
  const uint8_t* bytes = static_cast<const uint8_t*>(map);

  uint64_t header_len = 0;
  std::memcpy(&header_len, bytes, 8);
  if (header_len > kMaxHeaderBytes) {
    fail(path, "header length " + std::to_string(header_len) + " exceeds the 100 MB limit");
  }
  if (header_len > file_size - 8) {
    fail(path, "header length " + std::to_string(header_len) + " exceeds the file size (" +
                   std::to_string(file_size) + " bytes); the file is truncated or corrupt");
  }
  const uint64_t data_size = file_size - 8 - header_len;
  f->data_ = bytes + 8 + header_len;

  json header;
  try {
    header = json::parse(reinterpret_cast<const char*>(bytes + 8),
                         reinterpret_cast<const char*>(bytes + 8 + header_len));
  } catch (const json::exception& e) {
    fail(path, std::string("header is not valid JSON: ") + e.what());
  }
  if (!header.is_object()) fail(path, "header is not a JSON object");

  for (auto it = header.begin(); it != header.end(); ++it) {
    if (it.key() == "__metadata__") {
      if (!it->is_object()) fail(path, "__metadata__ is not an object");
      for (auto m = it->begin(); m != it->end(); ++m) {
        if (!m->is_string()) fail(path, "__metadata__ value for '" + m.key() + "' is not a string");
        f->metadata_[m.key()] = m->get<std::string>();
      }
      continue;
    }
    f->tensors_[it.key()] = parse_tensor_entry(path, it.key(), *it, data_size);
  }

  // No two non-empty byte ranges may overlap.
  std::vector<std::pair<const std::string*, const TensorInfo*>> ranges;
  for (const auto& [name, info] : f->tensors_) {
    if (info.end > info.begin) ranges.emplace_back(&name, &info);
  }
  std::sort(ranges.begin(), ranges.end(),
            [](const auto& a, const auto& b) { return a.second->begin < b.second->begin; });
  for (size_t i = 1; i < ranges.size(); ++i) {
    if (ranges[i].second->begin < ranges[i - 1].second->end) {
      fail_tensor(path, *ranges[i].first,
                  "byte range [" + std::to_string(ranges[i].second->begin) + ", " +
                      std::to_string(ranges[i].second->end) + ") overlaps tensor '" +
                      *ranges[i - 1].first + "'");
    }
  }
  return f;
}

SafetensorsFile::~SafetensorsFile() {
  if (map_ != nullptr) ::munmap(map_, map_size_);
}

at::Tensor SafetensorsFile::load(const std::string& name, at::ScalarType dtype) const {
  auto it = tensors_.find(name);
  if (it == tensors_.end()) fail_tensor(path_, name, "not present in the file");
  return read(name, it->second, 0, it->second.shape, dtype);
}

at::Tensor SafetensorsFile::load_range(const std::string& name, int64_t from, int64_t count,
                                       at::ScalarType dtype) const {
  auto it = tensors_.find(name);
  if (it == tensors_.end()) fail_tensor(path_, name, "not present in the file");
  int64_t numel = 1;
  for (int64_t d : it->second.shape) numel *= d;
  if (from < 0 || count < 0 || from + count > numel) {
    fail_tensor(path_, name,
                "elements [" + std::to_string(from) + ", " + std::to_string(from + count) +
                    ") are outside its " + std::to_string(numel));
  }
  return read(name, it->second, from, {count}, dtype);
}

at::Tensor SafetensorsFile::read(const std::string& name, const TensorInfo& info, int64_t from,
                                 std::vector<int64_t> shape, at::ScalarType dtype) const {
  at::ScalarType stored = at::kFloat;
  lookup_dtype(info.dtype, &stored);  // validated by open()
  if (stored != dtype && !(is_float_type(stored) && is_float_type(dtype))) {
    fail_tensor(
        path_, name,
        "stored dtype " + info.dtype + " cannot be loaded as " + std::string(c10::toString(dtype)));
  }
  int64_t count = 1;
  for (int64_t d : shape) count *= d;
  const size_t esize = c10::elementSize(stored);
  const uint8_t* src = data_ + info.begin + static_cast<size_t>(from) * esize;
  const size_t nbytes = static_cast<size_t>(count) * esize;
  const auto opts = at::TensorOptions().dtype(stored);
  if (reinterpret_cast<uintptr_t>(src) % esize == 0) {
    // Aligned: read straight from the mapping; .to()/.clone() copy, so nothing aliases the map.
    at::Tensor view = at::from_blob(const_cast<uint8_t*>(src), shape, opts);
    return stored == dtype ? view.clone() : view.to(dtype);
  }
  at::Tensor copy = at::empty(shape, opts);
  if (nbytes > 0) std::memcpy(copy.data_ptr(), src, nbytes);
  return stored == dtype ? copy : copy.to(dtype);
}

std::string safetensors_dtype(at::ScalarType dtype) {
  for (const auto& e : kDtypes) {
    if (e.type == dtype) return e.name;
  }
  throw std::runtime_error(std::string("safetensors: unsupported dtype ") + c10::toString(dtype));
}

void write_safetensors(const std::string& path,
                       const std::vector<std::pair<std::string, at::Tensor>>& tensors,
                       const std::map<std::string, std::string>& metadata) {
  // Sorted by name: the header (a std::map-backed JSON object) and the data share one order.
  std::map<std::string, at::Tensor> sorted;
  for (const auto& [name, t] : tensors) {
    if (name == "__metadata__") fail(path, "'__metadata__' is not a valid tensor name");
    if (!t.defined()) fail_tensor(path, name, "tensor is undefined");
    if (!sorted.emplace(name, t.contiguous().cpu()).second) {
      fail_tensor(path, name, "duplicate tensor name");
    }
  }
  json header = json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  uint64_t offset = 0;
  for (const auto& [name, t] : sorted) {
    const uint64_t nbytes = static_cast<uint64_t>(t.numel()) * t.element_size();
    header[name] = {{"dtype", safetensors_dtype(t.scalar_type())},
                    {"shape", t.sizes().vec()},
                    {"data_offsets", {offset, offset + nbytes}}};
    offset += nbytes;
  }
  std::string header_text = header.dump();
  header_text.append((8 - header_text.size() % 8) % 8, ' ');
  const uint64_t header_len = header_text.size();

  const std::string tmp = path + ".tmp." + std::to_string(::getpid());
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) fail(path, "cannot create temp file " + tmp + ": " + std::strerror(errno));
  bool ok = write_all(fd, &header_len, 8) && write_all(fd, header_text.data(), header_text.size());
  for (auto it = sorted.begin(); ok && it != sorted.end(); ++it) {
    const at::Tensor& t = it->second;
    ok = write_all(fd, t.data_ptr(), static_cast<size_t>(t.numel()) * t.element_size());
  }
  ok = ok && ::fsync(fd) == 0;
  const int err = errno;
  ok = (::close(fd) == 0) && ok;
  if (!ok || ::rename(tmp.c_str(), path.c_str()) != 0) {
    const int e = ok ? errno : err;
    ::unlink(tmp.c_str());
    fail(path, std::string("write failed: ") + std::strerror(e));
  }
  // Make the rename durable.
  std::string dir = std::filesystem::path(path).parent_path().string();
  if (dir.empty()) dir = ".";
  const int dfd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd >= 0) {
    ::fsync(dfd);
    ::close(dfd);
  }
}

}  // namespace crl::engine
