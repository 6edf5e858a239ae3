#include "text/hf/json_path.h"

namespace crl::text::hf {

namespace {
const char* type_name(const nlohmann::json& j) { return j.type_name(); }
}  // namespace

const nlohmann::json& require(const nlohmann::json& obj, const std::string& key,
                              const JsonPath& at) {
  if (!obj.is_object()) at.fail(std::string("expected an object, found ") + type_name(obj));
  auto it = obj.find(key);
  if (it == obj.end()) at.at(key).fail("missing");
  return *it;
}

std::string get_string(const nlohmann::json& obj, const std::string& key, const JsonPath& at,
                       const std::string& fallback) {
  if (!obj.is_object()) at.fail(std::string("expected an object, found ") + type_name(obj));
  auto it = obj.find(key);
  if (it == obj.end() || it->is_null()) return fallback;
  if (!it->is_string()) at.at(key).fail(std::string("expected a string, found ") + type_name(*it));
  return it->get<std::string>();
}

bool get_bool(const nlohmann::json& obj, const std::string& key, const JsonPath& at,
              bool fallback) {
  if (!obj.is_object()) at.fail(std::string("expected an object, found ") + type_name(obj));
  auto it = obj.find(key);
  if (it == obj.end() || it->is_null()) return fallback;
  if (!it->is_boolean())
    at.at(key).fail(std::string("expected true or false, found ") + type_name(*it));
  return it->get<bool>();
}

int64_t get_int(const nlohmann::json& obj, const std::string& key, const JsonPath& at,
                int64_t fallback) {
  if (!obj.is_object()) at.fail(std::string("expected an object, found ") + type_name(obj));
  auto it = obj.find(key);
  if (it == obj.end() || it->is_null()) return fallback;
  if (!it->is_number_integer())
    at.at(key).fail(std::string("expected an integer, found ") + type_name(*it));
  return it->get<int64_t>();
}

std::string get_type(const nlohmann::json& obj, const JsonPath& at) {
  if (!obj.is_object()) at.fail(std::string("expected an object, found ") + type_name(obj));
  auto it = obj.find("type");
  if (it == obj.end() || !it->is_string()) at.at("type").fail("missing or not a string");
  return it->get<std::string>();
}

}  // namespace crl::text::hf
