// JsonPath: where a value sits in tokenizer.json / tokenizer_config.json, so that every error about
// a malformed file names the file and the JSON path ("tokenizer.json:
// pre_tokenizer.pretokenizers[1] .pattern.Regex: ..."), and typed accessors that fail through it.
#pragma once

#include <nlohmann/json.hpp>
#include <stdexcept>
#include <string>

namespace crl::text::hf {

// A malformed or unsupported tokenizer file. what() = "<file>: <path>: <message>".
class TokenizerFileError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

struct JsonPath {
  std::string file;  // as given to the loader, e.g. "/models/qwen3/tokenizer.json"
  std::string path;  // "" for the document root; else "model.merges[3]"

  JsonPath at(const std::string& key) const {
    return {file, path.empty() ? key : path + "." + key};
  }
  JsonPath at(size_t index) const { return {file, path + "[" + std::to_string(index) + "]"}; }
  [[noreturn]] void fail(const std::string& message) const {
    throw TokenizerFileError(file + ": " + (path.empty() ? "(root)" : path) + ": " + message);
  }
};

// obj[key] where obj must be an object holding key (else fails naming `at.at(key)`).
const nlohmann::json& require(const nlohmann::json& obj, const std::string& key,
                              const JsonPath& at);
// obj[key] as a string / bool / integer; missing or null gives `fallback`; a wrong type fails.
std::string get_string(const nlohmann::json& obj, const std::string& key, const JsonPath& at,
                       const std::string& fallback);
bool get_bool(const nlohmann::json& obj, const std::string& key, const JsonPath& at, bool fallback);
int64_t get_int(const nlohmann::json& obj, const std::string& key, const JsonPath& at,
                int64_t fallback);
// The "type" member of a component object (fails when absent or not a string).
std::string get_type(const nlohmann::json& obj, const JsonPath& at);

}  // namespace crl::text::hf
