#include "text/jinja/value.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>

#include "text/jinja/error.h"

namespace crl::text::jinja {

namespace {

void append_json_string(std::string& out, const std::string& s) {
  out += '"';
  for (unsigned char c : s) {
    switch (c) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\r':
        out += "\\r";
        break;
      case '\t':
        out += "\\t";
        break;
      case '\b':
        out += "\\b";
        break;
      case '\f':
        out += "\\f";
        break;
      default:
        if (c < 0x20) {
          char buf[8];
          std::snprintf(buf, sizeof(buf), "\\u%04x", c);
          out += buf;
        } else {
          out += static_cast<char>(c);
        }
    }
  }
  out += '"';
}

std::string python_string_repr(const std::string& s) {
  const bool has_single = s.find('\'') != std::string::npos;
  const bool has_double = s.find('"') != std::string::npos;
  const char quote = has_single && !has_double ? '"' : '\'';
  std::string out(1, quote);
  for (unsigned char c : s) {
    if (c == quote || c == '\\') {
      out += '\\';
      out += static_cast<char>(c);
    } else if (c == '\n') {
      out += "\\n";
    } else if (c == '\r') {
      out += "\\r";
    } else if (c == '\t') {
      out += "\\t";
    } else if (c < 0x20 || c == 0x7f) {
      char buf[8];
      std::snprintf(buf, sizeof(buf), "\\x%02x", c);
      out += buf;
    } else {
      out += static_cast<char>(c);
    }
  }
  out += quote;
  return out;
}

void append_json(std::string& out, const Value& v, int indent, bool sort_keys, int depth) {
  const auto newline = [&](int d) {
    out += '\n';
    out.append(static_cast<size_t>(indent * d), ' ');
  };
  switch (v.kind()) {
    case Value::Kind::kNone:
      out += "null";
      return;
    case Value::Kind::kBool:
      out += v.as_bool() ? "true" : "false";
      return;
    case Value::Kind::kInt:
      out += std::to_string(v.as_int());
      return;
    case Value::Kind::kFloat: {
      const double d = v.as_double();
      out += std::isnan(d)   ? "NaN"
             : std::isinf(d) ? (d > 0 ? "Infinity" : "-Infinity")
                             : float_repr(d);
      return;
    }
    case Value::Kind::kString:
      append_json_string(out, v.as_string());
      return;
    case Value::Kind::kList: {
      const ValueList& items = v.as_list();
      if (items.empty()) {
        out += "[]";
        return;
      }
      out += '[';
      for (size_t i = 0; i < items.size(); ++i) {
        if (i > 0) out += indent >= 0 ? "," : ", ";
        if (indent >= 0) newline(depth + 1);
        append_json(out, items[i], indent, sort_keys, depth + 1);
      }
      if (indent >= 0) newline(depth);
      out += ']';
      return;
    }
    case Value::Kind::kDict:
    case Value::Kind::kNamespace: {
      std::vector<const std::pair<Value, Value>*> items;
      for (const auto& kv : v.as_items()) items.push_back(&kv);
      if (items.empty()) {
        out += "{}";
        return;
      }
      if (sort_keys) {
        std::stable_sort(items.begin(), items.end(), [](const auto* a, const auto* b) {
          return a->first.str() < b->first.str();
        });
      }
      out += '{';
      for (size_t i = 0; i < items.size(); ++i) {
        if (i > 0) out += indent >= 0 ? "," : ", ";
        if (indent >= 0) newline(depth + 1);
        const Value& key = items[i]->first;
        if (key.is_string()) {
          append_json_string(out, key.as_string());
        } else if (key.is_number() || key.is_none()) {
          std::string k;
          append_json(k, key, -1, false, 0);
          append_json_string(out, k);
        } else {
          throw TemplateError(
              TemplateError::Kind::kRuntime,
              std::string("tojson: keys must be str, int, float, bool or None, not ") +
                  key.type_name());
        }
        out += ": ";
        append_json(out, items[i]->second, indent, sort_keys, depth + 1);
      }
      if (indent >= 0) newline(depth);
      out += '}';
      return;
    }
    case Value::Kind::kUndefined:
      throw TemplateError(TemplateError::Kind::kUndefined,
                          "tojson: an undefined value is not JSON serializable" +
                              (v.name().empty() ? std::string() : " (" + v.name() + ")"));
    case Value::Kind::kCallable:
      throw TemplateError(TemplateError::Kind::kRuntime,
                          "tojson: a function is not JSON serializable");
  }
}

template <typename Json>
Value value_from_json(const Json& j) {
  if (j.is_null()) return Value::none();
  if (j.is_boolean()) return Value(j.template get<bool>());
  if (j.is_number_integer()) {
    if (j.is_number_unsigned() && j.template get<uint64_t>() > static_cast<uint64_t>(INT64_MAX)) {
      return Value(j.template get<double>());
    }
    return Value(j.template get<int64_t>());
  }
  if (j.is_number()) return Value(j.template get<double>());
  if (j.is_string()) return Value(j.template get<std::string>());
  if (j.is_array()) {
    ValueList items;
    items.reserve(j.size());
    for (const auto& e : j) items.push_back(value_from_json(e));
    return Value::list(std::move(items));
  }
  if (j.is_object()) {
    ValueItems items;
    items.reserve(j.size());
    for (auto it = j.begin(); it != j.end(); ++it)
      items.emplace_back(Value(it.key()), value_from_json(it.value()));
    return Value::dict(std::move(items));
  }
  return Value::none();  // binary: not produced by JSON text
}

}  // namespace

Value Value::undefined(std::string hint) {
  Value v;
  v.s_ = std::move(hint);
  return v;
}

Value Value::none() {
  Value v;
  v.kind_ = Kind::kNone;
  return v;
}

Value::Value(bool b) : kind_(Kind::kBool), b_(b) {}
Value::Value(int64_t v) : kind_(Kind::kInt), i_(v) {}
Value::Value(double v) : kind_(Kind::kFloat), f_(v) {}
Value::Value(std::string s) : kind_(Kind::kString), s_(std::move(s)) {}

Value Value::list(ValueList items) {
  Value v;
  v.kind_ = Kind::kList;
  v.list_ = std::make_shared<const ValueList>(std::move(items));
  return v;
}

Value Value::tuple(ValueList items) {
  Value v = list(std::move(items));
  v.tuple_ = true;
  return v;
}

Value Value::dict(ValueItems items) {
  Value v;
  v.kind_ = Kind::kDict;
  v.items_ = std::make_shared<ValueItems>(std::move(items));
  return v;
}

Value Value::namespace_object(ValueItems items) {
  Value v = dict(std::move(items));
  v.kind_ = Kind::kNamespace;
  return v;
}

Value Value::function(std::string name, NativeFunction fn) {
  Value v;
  v.kind_ = Kind::kCallable;
  v.s_ = std::move(name);
  v.fn_ = std::make_shared<const NativeFunction>(std::move(fn));
  return v;
}

Value Value::from_json(const nlohmann::ordered_json& j) { return value_from_json(j); }
Value Value::from_json(const nlohmann::json& j) { return value_from_json(j); }

int64_t Value::as_int() const { return kind_ == Kind::kBool ? (b_ ? 1 : 0) : i_; }

double Value::as_double() const {
  if (kind_ == Kind::kFloat) return f_;
  return static_cast<double>(as_int());
}

Value Value::call(CallArgs& args) const { return (*fn_)(args); }

const Value* Value::find(const Value& key) const {
  if (!is_mapping()) return nullptr;
  for (const auto& kv : *items_) {
    if (kv.first.equals(key)) return &kv.second;
  }
  return nullptr;
}

void Value::set_attribute(const std::string& key, Value v) const {
  for (auto& kv : *items_) {
    if (kv.first.is_string() && kv.first.as_string() == key) {
      kv.second = std::move(v);
      return;
    }
  }
  items_->emplace_back(Value(key), std::move(v));
}

bool Value::truthy() const {
  switch (kind_) {
    case Kind::kUndefined:
    case Kind::kNone:
      return false;
    case Kind::kBool:
      return b_;
    case Kind::kInt:
      return i_ != 0;
    case Kind::kFloat:
      return f_ != 0.0;
    case Kind::kString:
      return !s_.empty();
    case Kind::kList:
      return !list_->empty();
    case Kind::kDict:
      return !items_->empty();
    case Kind::kNamespace:
    case Kind::kCallable:
      return true;
  }
  return false;
}

std::string Value::str() const {
  switch (kind_) {
    case Kind::kUndefined:
      return "";
    case Kind::kNone:
      return "None";
    case Kind::kBool:
      return b_ ? "True" : "False";
    case Kind::kInt:
      return std::to_string(i_);
    case Kind::kFloat:
      return float_repr(f_);
    case Kind::kString:
      return s_;
    case Kind::kList: {
      std::string out = tuple_ ? "(" : "[";
      for (size_t i = 0; i < list_->size(); ++i) out += (i ? ", " : "") + (*list_)[i].repr();
      if (tuple_ && list_->size() == 1) out += ",";
      return out + (tuple_ ? ")" : "]");
    }
    case Kind::kDict:
    case Kind::kNamespace: {
      std::string out = kind_ == Kind::kNamespace ? "<Namespace {" : "{";
      for (size_t i = 0; i < items_->size(); ++i) {
        out += (i ? ", " : "") + (*items_)[i].first.repr() + ": " + (*items_)[i].second.repr();
      }
      return out + (kind_ == Kind::kNamespace ? "}>" : "}");
    }
    case Kind::kCallable:
      return "<function " + s_ + ">";
  }
  return "";
}

std::string Value::repr() const { return kind_ == Kind::kString ? python_string_repr(s_) : str(); }

const char* Value::type_name() const {
  switch (kind_) {
    case Kind::kUndefined:
      return "undefined";
    case Kind::kNone:
      return "NoneType";
    case Kind::kBool:
      return "bool";
    case Kind::kInt:
      return "int";
    case Kind::kFloat:
      return "float";
    case Kind::kString:
      return "str";
    case Kind::kList:
      return "list";
    case Kind::kDict:
      return "dict";
    case Kind::kNamespace:
      return "namespace";
    case Kind::kCallable:
      return "function";
  }
  return "?";
}

std::string Value::to_json(int indent, bool sort_keys) const {
  std::string out;
  append_json(out, *this, indent, sort_keys, 0);
  return out;
}

bool Value::equals(const Value& o) const {
  if (is_number() && o.is_number()) {
    if (kind_ == Kind::kFloat || o.kind_ == Kind::kFloat) return as_double() == o.as_double();
    return as_int() == o.as_int();
  }
  if (kind_ != o.kind_) return false;
  switch (kind_) {
    case Kind::kUndefined:
    case Kind::kNone:
      return true;
    case Kind::kString:
      return s_ == o.s_;
    case Kind::kList: {
      if (list_->size() != o.list_->size()) return false;
      for (size_t i = 0; i < list_->size(); ++i) {
        if (!(*list_)[i].equals((*o.list_)[i])) return false;
      }
      return true;
    }
    case Kind::kDict: {
      if (items_->size() != o.items_->size()) return false;
      for (const auto& kv : *items_) {
        const Value* other = o.find(kv.first);
        if (!other || !other->equals(kv.second)) return false;
      }
      return true;
    }
    case Kind::kNamespace:
      return items_ == o.items_;
    case Kind::kCallable:
      return fn_ == o.fn_;
    default:
      return false;
  }
}

Value CallArgs::get(size_t index, const char* name, Value fallback) {
  for (auto it = keyword.begin(); it != keyword.end(); ++it) {
    if (it->first == name) {
      Value v = std::move(it->second);
      keyword.erase(it);
      return v;
    }
  }
  if (index < positional.size()) return positional[index];
  return fallback;
}

bool CallArgs::has(size_t index, const char* name) const {
  if (index < positional.size()) return true;
  for (const auto& kv : keyword) {
    if (kv.first == name) return true;
  }
  return false;
}

std::string float_repr(double v) {
  if (std::isnan(v)) return "nan";
  if (std::isinf(v)) return v > 0 ? "inf" : "-inf";
  if (v == 0.0) return std::signbit(v) ? "-0.0" : "0.0";
  char buf[40];
  for (int precision = 1; precision <= 17; ++precision) {
    std::snprintf(buf, sizeof(buf), "%.*e", precision - 1, v);
    if (std::strtod(buf, nullptr) == v) break;
  }
  // buf: [-]d[.ddd]e[+-]XX
  std::string s(buf);
  std::string sign;
  if (s[0] == '-') {
    sign = "-";
    s.erase(0, 1);
  }
  const size_t e = s.find('e');
  std::string digits = s.substr(0, e);
  digits.erase(std::remove(digits.begin(), digits.end(), '.'), digits.end());
  while (digits.size() > 1 && digits.back() == '0') digits.pop_back();
  const int exp = std::atoi(s.c_str() + e + 1);
  std::string out;
  if (exp >= -4 && exp < 16) {
    if (exp >= 0) {
      std::string int_part =
          digits.substr(0, std::min(digits.size(), static_cast<size_t>(exp + 1)));
      int_part.append(static_cast<size_t>(exp + 1) - int_part.size(), '0');
      const std::string frac =
          digits.size() > static_cast<size_t>(exp + 1) ? digits.substr(exp + 1) : "0";
      out = int_part + "." + frac;
    } else {
      out = "0." + std::string(static_cast<size_t>(-exp - 1), '0') + digits;
    }
  } else {
    out = digits.substr(0, 1);
    if (digits.size() > 1) out += "." + digits.substr(1);
    char ebuf[16];
    std::snprintf(ebuf, sizeof(ebuf), "e%c%02d", exp < 0 ? '-' : '+', std::abs(exp));
    out += ebuf;
  }
  return sign + out;
}

std::vector<std::string> utf8_chars(const std::string& s) {
  std::vector<std::string> out;
  for (size_t i = 0; i < s.size();) {
    const unsigned char c = static_cast<unsigned char>(s[i]);
    size_t n = c < 0x80 ? 1 : (c >> 5) == 0x6 ? 2 : (c >> 4) == 0xe ? 3 : (c >> 3) == 0x1e ? 4 : 1;
    if (i + n > s.size()) n = 1;
    out.push_back(s.substr(i, n));
    i += n;
  }
  return out;
}

size_t utf8_length(const std::string& s) {
  size_t n = 0;
  for (unsigned char c : s) n += (c & 0xc0) != 0x80;
  return n;
}

}  // namespace crl::text::jinja
