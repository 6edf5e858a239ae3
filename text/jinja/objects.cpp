// Python's object model as Jinja2 templates use it: lookups, operators, iteration, globals.
#include <algorithm>
#include <cmath>
#include <ctime>

#include "text/jinja/builtins.h"
#include "text/jinja/error.h"
#include "text/jinja/limits.h"
#include "text/jinja/methods.h"

namespace crl::text::jinja {

namespace {

[[noreturn]] void type_error(const std::string& message) {
  throw TemplateError(TemplateError::Kind::kRuntime, message);
}

std::string quoted_type(const Value& v) { return std::string("'") + v.type_name() + "'"; }

// Python index normalisation for lists and strings.
bool normalise_index(int64_t& i, size_t size) {
  if (i < 0) i += static_cast<int64_t>(size);
  return i >= 0 && i < static_cast<int64_t>(size);
}

void check_overflow(bool overflow) {
  if (overflow) type_error("integer overflow (values beyond 64 bits are not supported)");
}

double python_fmod(double a, double b) {
  double r = std::fmod(a, b);
  if (r != 0 && ((r < 0) != (b < 0))) r += b;
  return r;
}

Value arithmetic(const std::string& op, const Value& a, const Value& b) {
  const bool ints = !a.is_float() && !b.is_float();
  if (op == "+" || op == "-" || op == "*") {
    if (ints) {
      int64_t r = 0;
      const int64_t x = a.as_int(), y = b.as_int();
      if (op == "+") {
        check_overflow(__builtin_add_overflow(x, y, &r));
      } else if (op == "-") {
        check_overflow(__builtin_sub_overflow(x, y, &r));
      } else {
        check_overflow(__builtin_mul_overflow(x, y, &r));
      }
      return Value(r);
    }
    const double x = a.as_double(), y = b.as_double();
    return Value(op == "+" ? x + y : op == "-" ? x - y : x * y);
  }
  if (op == "/") {
    if (b.as_double() == 0.0) type_error("division by zero");
    return Value(a.as_double() / b.as_double());
  }
  if (op == "//" || op == "%") {
    if (b.as_double() == 0.0)
      type_error(op == "//" ? "integer division or modulo by zero" : "modulo by zero");
    if (ints) {
      const int64_t x = a.as_int(), y = b.as_int();
      int64_t q = x / y, r = x % y;
      if (r != 0 && ((r < 0) != (y < 0))) {
        q -= 1;
        r += y;
      }
      return Value(op == "//" ? q : r);
    }
    const double x = a.as_double(), y = b.as_double();
    return Value(op == "//" ? std::floor(x / y) : python_fmod(x, y));
  }
  // **
  if (ints && b.as_int() >= 0) {
    int64_t r = 1;
    for (int64_t i = 0; i < b.as_int(); ++i) {
      if (__builtin_mul_overflow(r, a.as_int(), &r)) type_error("integer overflow in **");
    }
    return Value(r);
  }
  return Value(std::pow(a.as_double(), b.as_double()));
}

Value repeat(const Value& seq, int64_t n) {
  if (n <= 0) return seq.is_string() ? Value(std::string()) : Value::list(ValueList());
  const uint64_t unit = seq.is_string() ? seq.as_string().size() : seq.as_list().size();
  const uint64_t count = static_cast<uint64_t>(n);
  const uint64_t total = unit != 0 && count > UINT64_MAX / unit ? UINT64_MAX : unit * count;
  if (seq.is_string()) {
    check_string_bytes(total, "a repeated string");
    std::string out;
    out.reserve(static_cast<size_t>(total));
    for (int64_t i = 0; i < n; ++i) out += seq.as_string();
    return Value(out);
  }
  check_list_items(total, "a repeated list");
  ValueList out;
  for (int64_t i = 0; i < n; ++i) out.insert(out.end(), seq.as_list().begin(), seq.as_list().end());
  return Value::list(std::move(out));
}

bool contains(const Value& container, const Value& item) {
  switch (container.kind()) {
    case Value::Kind::kString:
      if (!item.is_string()) {
        type_error("'in <string>' requires string as left operand, not " +
                   std::string(item.type_name()));
      }
      return container.as_string().find(item.as_string()) != std::string::npos;
    case Value::Kind::kList:
      return std::any_of(container.as_list().begin(), container.as_list().end(),
                         [&](const Value& v) { return v.equals(item); });
    case Value::Kind::kDict:
      return container.find(item) != nullptr;
    case Value::Kind::kUndefined:
      return false;  // Jinja's Undefined iterates as empty
    default:
      type_error("argument of type " + quoted_type(container) + " is not iterable");
  }
}

}  // namespace

[[noreturn]] void raise_undefined(const Value& v) {
  throw TemplateError(TemplateError::Kind::kUndefined,
                      v.name().empty() ? "a value is undefined" : v.name());
}

Value get_attribute(const Value& obj, const std::string& name) {
  if (obj.is_undefined()) raise_undefined(obj);
  if (obj.is_namespace()) {
    const Value* v = obj.find(name);
    return v ? *v : Value::undefined("'namespace' object has no attribute '" + name + "'");
  }
  if (auto method = bound_method(obj, name)) return *method;
  if (obj.is_dict()) {
    if (const Value* v = obj.find(name)) return *v;
    return Value::undefined("'dict object' has no attribute '" + name + "'");
  }
  if (obj.is_none()) return Value::undefined("'None' has no attribute '" + name + "'");
  return Value::undefined(std::string("'") + obj.type_name() + " object' has no attribute '" +
                          name + "'");
}

Value get_item(const Value& obj, const Value& key) {
  if (obj.is_undefined()) raise_undefined(obj);
  if (obj.is_dict() || obj.is_namespace()) {
    if (const Value* v = obj.find(key)) return *v;
  } else if ((obj.is_list() || obj.is_string()) && key.is_number() && !key.is_float()) {
    int64_t i = key.as_int();
    if (obj.is_list()) {
      if (normalise_index(i, obj.as_list().size())) return obj.as_list()[static_cast<size_t>(i)];
    } else {
      const auto chars = utf8_chars(obj.as_string());
      if (normalise_index(i, chars.size())) return Value(chars[static_cast<size_t>(i)]);
    }
    return Value::undefined(std::string(obj.type_name()) + " object has no element " +
                            std::to_string(key.as_int()));
  }
  if (key.is_string()) {
    if (obj.is_dict())
      return Value::undefined("'dict object' has no attribute '" + key.as_string() + "'");
    return get_attribute(obj, key.as_string());
  }
  if (obj.is_dict()) return Value::undefined("'dict object' has no attribute " + key.repr());
  return Value::undefined(std::string("'") + obj.type_name() + " object' has no attribute " +
                          key.repr());
}

Value get_slice(const Value& obj, const Value* start, const Value* stop, const Value* step) {
  if (obj.is_undefined()) raise_undefined(obj);
  if (!obj.is_list() && !obj.is_string())
    type_error(quoted_type(obj) + " object is not subscriptable");
  for (const Value* p : {start, stop, step}) {
    if (p && !p->is_none() && (!p->is_number() || p->is_float())) {
      type_error("slice indices must be integers or None");
    }
  }
  const std::vector<std::string> chars =
      obj.is_string() ? utf8_chars(obj.as_string()) : std::vector<std::string>();
  const int64_t n = static_cast<int64_t>(obj.is_string() ? chars.size() : obj.as_list().size());
  const int64_t st = step && !step->is_none() ? step->as_int() : 1;
  if (st == 0) type_error("slice step cannot be zero");
  auto bound = [&](const Value* p, int64_t dflt) {
    if (!p || p->is_none()) return dflt;
    int64_t i = p->as_int();
    if (i < 0) i += n;
    if (st > 0) return std::clamp<int64_t>(i, 0, n);
    return std::clamp<int64_t>(i, -1, n - 1);
  };
  const int64_t b = bound(start, st > 0 ? 0 : n - 1);
  const int64_t e = bound(stop, st > 0 ? n : -1);
  std::string s;
  ValueList items;
  for (int64_t i = b; st > 0 ? i < e : i > e; i += st) {
    if (obj.is_string()) {
      s += chars[static_cast<size_t>(i)];
    } else {
      items.push_back(obj.as_list()[static_cast<size_t>(i)]);
    }
  }
  return obj.is_string() ? Value(s) : Value::list(std::move(items));
}

ValueList iterate(const Value& v) {
  switch (v.kind()) {
    case Value::Kind::kUndefined:
      return {};
    case Value::Kind::kList:
      return v.as_list();
    case Value::Kind::kDict: {
      ValueList keys;
      for (const auto& kv : v.as_items()) keys.push_back(kv.first);
      return keys;
    }
    case Value::Kind::kString: {
      ValueList out;
      for (auto& c : utf8_chars(v.as_string())) out.emplace_back(std::move(c));
      return out;
    }
    default:
      type_error(quoted_type(v) + " object is not iterable");
  }
}

bool less_than(const Value& a, const Value& b) {
  if (a.is_undefined()) raise_undefined(a);
  if (b.is_undefined()) raise_undefined(b);
  if (a.is_number() && b.is_number()) {
    if (a.is_float() || b.is_float()) return a.as_double() < b.as_double();
    return a.as_int() < b.as_int();
  }
  if (a.is_string() && b.is_string()) return a.as_string() < b.as_string();
  if (a.is_list() && b.is_list()) {
    const ValueList &x = a.as_list(), &y = b.as_list();
    for (size_t i = 0; i < x.size() && i < y.size(); ++i) {
      if (!x[i].equals(y[i])) return less_than(x[i], y[i]);
    }
    return x.size() < y.size();
  }
  type_error("'<' not supported between instances of " + quoted_type(a) + " and " + quoted_type(b));
}

void check_string_bytes(uint64_t bytes, const char* what) {
  if (bytes > kMaxTemplateStringBytes) {
    throw TemplateError(TemplateError::Kind::kRuntime,
                        std::string(what) + " of " + std::to_string(bytes) +
                            " bytes passes the template string limit of " +
                            std::to_string(kMaxTemplateStringBytes) + " bytes");
  }
}

void check_list_items(uint64_t items, const char* what) {
  if (items > kMaxTemplateListItems) {
    throw TemplateError(TemplateError::Kind::kRuntime,
                        std::string(what) + " of " + std::to_string(items) +
                            " items passes the template list limit of " +
                            std::to_string(kMaxTemplateListItems));
  }
}

Value binary_op(const std::string& op, const Value& a, const Value& b) {
  if (op == "~") {
    std::string x = a.str();
    const std::string y = b.str();
    check_string_bytes(uint64_t{x.size()} + y.size(), "a '~' concatenation");
    return Value(x + y);
  }
  if (op == "==") return Value(a.equals(b));
  if (op == "!=") return Value(!a.equals(b));
  if (op == "in") return Value(contains(b, a));
  if (op == "not in") return Value(!contains(b, a));
  if (op == "<") return Value(less_than(a, b));
  if (op == ">") return Value(less_than(b, a));
  if (op == "<=") return Value(!less_than(b, a));
  if (op == ">=") return Value(!less_than(a, b));
  if (a.is_undefined()) raise_undefined(a);
  if (b.is_undefined()) raise_undefined(b);
  if (a.is_number() && b.is_number()) return arithmetic(op, a, b);
  if (op == "+") {
    if (a.is_string() && b.is_string()) {
      check_string_bytes(uint64_t{a.as_string().size()} + b.as_string().size(),
                         "a '+' concatenation");
      return Value(a.as_string() + b.as_string());
    }
    if (a.is_list() && b.is_list()) {
      check_list_items(uint64_t{a.as_list().size()} + b.as_list().size(), "a '+' concatenation");
      ValueList out = a.as_list();
      out.insert(out.end(), b.as_list().begin(), b.as_list().end());
      return Value::list(std::move(out));
    }
    if (a.is_string())
      type_error("can only concatenate str (not \"" + std::string(b.type_name()) + "\") to str");
    if (a.is_list())
      type_error("can only concatenate list (not \"" + std::string(b.type_name()) + "\") to list");
  }
  if (op == "*") {
    if ((a.is_string() || a.is_list()) && b.is_number() && !b.is_float())
      return repeat(a, b.as_int());
    if ((b.is_string() || b.is_list()) && a.is_number() && !a.is_float())
      return repeat(b, a.as_int());
  }
  if (op == "%" && a.is_string()) {
    CallArgs args;
    if (b.is_list()) {
      args.positional = b.as_list();
    } else {
      args.positional.push_back(b);
    }
    return apply_filter("format", a, args);
  }
  type_error("unsupported operand type(s) for " + op + ": " + quoted_type(a) + " and " +
             quoted_type(b));
}

Value unary_op(const std::string& op, const Value& a) {
  if (a.is_undefined()) raise_undefined(a);
  if (!a.is_number()) type_error("bad operand type for unary " + op + ": " + quoted_type(a));
  if (op == "+") return a.is_bool() ? Value(a.as_int()) : a;
  return a.is_float() ? Value(-a.as_double()) : Value(-a.as_int());
}

Value call_value(const Value& callee, CallArgs& args) {
  if (callee.is_undefined()) raise_undefined(callee);
  if (!callee.is_callable()) type_error(quoted_type(callee) + " object is not callable");
  return callee.call(args);
}

std::unordered_map<std::string, Value> make_globals(std::function<std::time_t()> now) {
  std::unordered_map<std::string, Value> g;
  g["range"] = Value::function("range", [](CallArgs& a) {
    if (a.positional.empty() || a.positional.size() > 3)
      type_error("range expected 1 to 3 integer arguments");
    for (const Value& v : a.positional) {
      if (!v.is_number() || v.is_float())
        type_error("range() arguments must be integers, not " + quoted_type(v));
    }
    int64_t start = 0, stop = 0, step = 1;
    if (a.positional.size() == 1) {
      stop = a.positional[0].as_int();
    } else {
      start = a.positional[0].as_int();
      stop = a.positional[1].as_int();
      if (a.positional.size() == 3) step = a.positional[2].as_int();
    }
    if (step == 0) type_error("range() arg 3 must not be zero");
    ValueList out;
    for (int64_t i = start; step > 0 ? i < stop : i > stop; i += step) {
      if (out.size() >= 1000000) type_error("range() is limited to 1000000 items");
      out.emplace_back(i);
    }
    return Value::list(std::move(out));
  });
  auto make_mapping = [](CallArgs& a, const char* what) {
    ValueItems items;
    if (a.positional.size() > 1)
      type_error(std::string(what) + "() takes at most one positional argument");
    if (!a.positional.empty()) {
      if (!a.positional[0].is_mapping()) type_error(std::string(what) + "() takes a mapping");
      items = a.positional[0].as_items();
    }
    for (auto& kv : a.keyword) items.emplace_back(Value(kv.first), kv.second);
    return items;
  };
  g["namespace"] = Value::function("namespace", [make_mapping](CallArgs& a) {
    return Value::namespace_object(make_mapping(a, "namespace"));
  });
  g["dict"] = Value::function(
      "dict", [make_mapping](CallArgs& a) { return Value::dict(make_mapping(a, "dict")); });
  g["raise_exception"] = Value::function("raise_exception", [](CallArgs& a) -> Value {
    throw TemplateError(TemplateError::Kind::kRaised,
                        a.positional.empty() ? "" : a.positional[0].str());
  });
  g["strftime_now"] = Value::function("strftime_now", [now](CallArgs& a) {
    const Value fmt = a.get(0, "format");
    if (!fmt.is_string()) type_error("strftime_now() takes a format string");
    const std::time_t t = now();
    std::tm tm{};
    localtime_r(&t, &tm);
    char buf[256];
    const size_t n = std::strftime(buf, sizeof(buf), fmt.as_string().c_str(), &tm);
    return Value(std::string(buf, n));
  });
  return g;
}

}  // namespace crl::text::jinja
