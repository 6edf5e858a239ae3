#include "engine/model/weight_loader.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <stdexcept>

#include "common/file_util.h"
#include "engine/model/safetensors.h"

namespace crl::engine {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

constexpr const char* kSingleFile = "model.safetensors";
constexpr const char* kIndexFile = "model.safetensors.index.json";

std::string shape_str(at::IntArrayRef shape) {
  std::ostringstream os;
  os << "[";
  for (size_t i = 0; i < shape.size(); ++i) os << (i ? ", " : "") << shape[i];
  os << "]";
  return os.str();
}

// Reads the index's weight_map (tensor name -> shard file name). Throws naming the index file.
std::map<std::string, std::string> read_index(const std::string& index_path) {
  std::ifstream in(index_path, std::ios::binary);
  if (!in) throw std::runtime_error("cannot open checkpoint index " + index_path);
  std::ostringstream os;
  os << in.rdbuf();
  json j;
  try {
    j = json::parse(os.str());
  } catch (const json::exception& e) {
    throw std::runtime_error("checkpoint index " + index_path + " is not valid JSON: " + e.what());
  }
  if (!j.is_object() || !j.contains("weight_map") || !j["weight_map"].is_object()) {
    throw std::runtime_error("checkpoint index " + index_path + " has no 'weight_map' object");
  }
  std::map<std::string, std::string> weight_map;
  for (auto it = j["weight_map"].begin(); it != j["weight_map"].end(); ++it) {
    if (!it->is_string()) {
      throw std::runtime_error("checkpoint index " + index_path + ": weight_map entry for '" +
                               it.key() + "' is not a file name");
    }
    const std::string shard = it->get<std::string>();
    const fs::path p(shard);
    if (shard.empty() || p.is_absolute() || p.has_parent_path()) {
      throw std::runtime_error("checkpoint index " + index_path + ": shard name '" + shard +
                               "' for tensor '" + it.key() + "' is not a plain file name");
    }
    weight_map[it.key()] = shard;
  }
  return weight_map;
}

// The index of the first element that is NaN or infinite, or -1 (float32 and bfloat16 read in
// place; other dtypes through ATen).
int64_t first_non_finite(const at::Tensor& t) {
  const at::Tensor c = t.contiguous();
  const int64_t n = c.numel();
  if (c.scalar_type() == at::kFloat) {
    const float* p = c.data_ptr<float>();
    for (int64_t i = 0; i < n; ++i) {
      if (!std::isfinite(p[i])) return i;
    }
    return -1;
  }
  if (c.scalar_type() == at::kBFloat16) {
    const auto* p = reinterpret_cast<const uint16_t*>(c.data_ptr<at::BFloat16>());
    for (int64_t i = 0; i < n; ++i) {
      if ((p[i] & 0x7f80u) == 0x7f80u) return i;  // exponent all ones: inf or NaN
    }
    return -1;
  }
  const at::Tensor bad = at::logical_not(at::isfinite(c)).flatten().nonzero();
  return bad.numel() == 0 ? -1 : bad[0][0].item<int64_t>();
}

// "model.layers.N.": N, else -1.
int64_t layer_index(const std::string& name) {
  static const std::string kPrefix = "model.layers.";
  if (name.compare(0, kPrefix.size(), kPrefix) != 0) return -1;
  const size_t dot = name.find('.', kPrefix.size());
  if (dot == std::string::npos || dot == kPrefix.size()) return -1;
  int64_t n = 0;
  for (size_t i = kPrefix.size(); i < dot; ++i) {
    if (name[i] < '0' || name[i] > '9' || n > 1'000'000) return -1;
    n = n * 10 + (name[i] - '0');
  }
  return n;
}

}  // namespace

CheckpointReader::CheckpointReader(const std::string& dir, std::vector<ParamSpec> specs)
    : specs_(std::move(specs)) {
  const std::string single_path = (fs::path(dir) / kSingleFile).string();
  const std::string index_path = (fs::path(dir) / kIndexFile).string();

  // Tensor name -> file path; empty when everything lives in the single file.
  std::map<std::string, std::string> weight_map;
  const bool single = fs::is_regular_file(single_path);
  if (!single) {
    if (!fs::is_regular_file(index_path)) {
      throw std::runtime_error("no checkpoint in directory " + dir + ": expected " + kSingleFile +
                               " or " + kIndexFile);
    }
    for (const auto& [name, shard] : read_index(index_path)) {
      const std::string shard_path = (fs::path(dir) / shard).string();
      if (!fs::is_regular_file(shard_path)) {
        throw std::runtime_error("checkpoint index " + index_path + " names shard " + shard_path +
                                 " (for tensor '" + name + "'), which does not exist");
      }
      weight_map[name] = shard_path;
    }
  }

  std::map<std::string, size_t> open_files;  // path -> index into files_
  auto get_file = [&](const std::string& path) -> size_t {
    auto [it, added] = open_files.emplace(path, files_.size());
    if (added) files_.push_back(SafetensorsFile::open(path));
    return it->second;
  };

  for (const ParamSpec& spec : specs_) {
    std::string path;
    if (single) {
      path = single_path;
    } else {
      auto it = weight_map.find(spec.name);
      if (it == weight_map.end()) {
        std::set<std::string> shards;
        for (const auto& kv : weight_map) shards.insert(kv.second);
        std::string searched;
        for (const auto& s : shards) searched += (searched.empty() ? "" : ", ") + s;
        throw std::runtime_error("checkpoint is missing tensor '" + spec.name + "': not in " +
                                 index_path + " (shards: " + searched + ")");
      }
      path = it->second;
    }
    const size_t f = get_file(path);
    auto info = files_[f]->tensors().find(spec.name);
    if (info == files_[f]->tensors().end()) {
      throw std::runtime_error("checkpoint is missing tensor '" + spec.name + "' (searched " +
                               path + (single ? "" : ", named by " + index_path) + ")");
    }
    if (info->second.shape != spec.shape) {
      throw std::runtime_error("tensor '" + spec.name + "' in " + path + " has shape " +
                               shape_str(info->second.shape) + ", expected " +
                               shape_str(spec.shape));
    }
    file_of_.push_back(f);
  }
  // Layers the checkpoint has past the config's: a num_hidden_layers that does not match the
  // weights (the model would run on a truncated stack, silently).
  int64_t layers = 0;
  for (const ParamSpec& spec : specs_) layers = std::max(layers, layer_index(spec.name) + 1);
  std::vector<std::string> names;
  if (single) {
    for (const auto& kv : files_[get_file(single_path)]->tensors()) names.push_back(kv.first);
  } else {
    for (const auto& kv : weight_map) names.push_back(kv.first);
  }
  int64_t extra_layers = -1;
  std::string example;
  for (const std::string& name : names) {
    const int64_t l = layer_index(name);
    if (l >= layers && l > extra_layers) {
      extra_layers = l;
      example = name;
    }
  }
  if (layers > 0 && extra_layers >= 0) {
    throw std::runtime_error("checkpoint in " + dir + " has weights of " +
                             std::to_string(extra_layers + 1) + " layers (e.g. '" + example +
                             "') but config.json's num_hidden_layers is " + std::to_string(layers));
  }
}

CheckpointReader::~CheckpointReader() = default;

at::Tensor CheckpointReader::checked(size_t i, at::Tensor t, int64_t from) const {
  if (const int64_t bad = first_non_finite(t); bad >= 0) {
    throw std::runtime_error("tensor '" + specs_[i].name + "' in " + files_[file_of_[i]]->path() +
                             " holds " +
                             (std::isnan(t.flatten()[bad].item<double>()) ? "NaN" : "infinite") +
                             " values (the first at element " + std::to_string(from + bad) + ")");
  }
  elements_read_ += t.numel();
  return t;
}

at::Tensor CheckpointReader::load(size_t i, at::ScalarType dtype) const {
  return checked(i, files_[file_of_.at(i)]->load(specs_[i].name, dtype), 0);
}

at::Tensor CheckpointReader::load_range(size_t i, int64_t from, int64_t count,
                                        at::ScalarType dtype) const {
  return checked(i, files_[file_of_.at(i)]->load_range(specs_[i].name, from, count, dtype), from);
}

NamedTensors load_checkpoint(const std::string& dir, const std::vector<ParamSpec>& specs,
                             at::ScalarType dtype, const PartFn& part) {
  const CheckpointReader reader(dir, specs);
  NamedTensors out;
  out.reserve(specs.size());
  for (size_t i = 0; i < specs.size(); ++i) {
    at::Tensor t = reader.load(i, dtype);
    out.emplace_back(specs[i].name, part ? part(specs[i].name, t) : std::move(t));
  }
  return out;
}

void save_checkpoint(const std::string& dir, const NamedTensors& tensors, int64_t max_shard_bytes) {
  fs::create_directories(dir);
  const std::string single_path = (fs::path(dir) / kSingleFile).string();
  const std::string index_path = (fs::path(dir) / kIndexFile).string();
  const std::map<std::string, std::string> metadata = {{"format", "pt"}};

  // Greedy in input order: a new shard starts when the next tensor would overflow the current one.
  std::vector<NamedTensors> shards(1);
  int64_t shard_bytes = 0;
  int64_t total_bytes = 0;
  for (const auto& [name, t] : tensors) {
    const int64_t nbytes = t.numel() * static_cast<int64_t>(t.element_size());
    if (max_shard_bytes > 0 && !shards.back().empty() && shard_bytes + nbytes > max_shard_bytes) {
      shards.emplace_back();
      shard_bytes = 0;
    }
    shards.back().emplace_back(name, t);
    shard_bytes += nbytes;
    total_bytes += nbytes;
  }

  std::error_code ec;
  if (shards.size() == 1) {
    write_safetensors(single_path, tensors, metadata);
    fs::remove(index_path, ec);  // a stale index must not describe this checkpoint
    return;
  }

  const size_t n = shards.size();
  json weight_map = json::object();
  for (size_t i = 0; i < n; ++i) {
    char name[64];
    std::snprintf(name, sizeof(name), "model-%05zu-of-%05zu.safetensors", i + 1, n);
    write_safetensors((fs::path(dir) / name).string(), shards[i], metadata);
    for (const auto& kv : shards[i]) weight_map[kv.first] = name;
  }
  json index = {{"metadata", {{"total_size", total_bytes}}}, {"weight_map", weight_map}};
  crl::write_file_atomic(index_path, index.dump(2) + "\n");
  fs::remove(single_path, ec);  // load_checkpoint prefers the single file; drop a stale one
}

}  // namespace crl::engine
