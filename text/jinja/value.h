// Value: a Jinja2/Python value as chat templates see it (no torch, no I/O).
//
// Kinds follow Python: None, bool, int (int64), float, str (UTF-8), list, dict (insertion
// ordered, like a Python dict), plus Jinja's Undefined (a missing variable, attribute or item:
// renders as "", is false, iterates as empty, but any attribute access or arithmetic on it is an
// error), namespace() objects (the one mutable kind: `{% set ns.x = ... %}`) and callables
// (macros, globals such as range(), bound methods such as "abc".upper).
// Lists and dicts are shared immutable snapshots (templates cannot mutate them, as under
// transformers' ImmutableSandboxedEnvironment), so copying a Value is cheap.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

namespace crl::text::jinja {

class Value;
struct CallArgs;

using ValueList = std::vector<Value>;
using ValueItems = std::vector<std::pair<Value, Value>>;  // a dict's (key, value) pairs in order
using NativeFunction = std::function<Value(CallArgs& args)>;

class Value {
 public:
  enum class Kind {
    kUndefined,
    kNone,
    kBool,
    kInt,
    kFloat,
    kString,
    kList,
    kDict,
    kNamespace,
    kCallable
  };

  Value() = default;  // undefined
  static Value undefined(std::string hint = "");
  static Value none();
  Value(bool b);  // NOLINT: implicit, as in Python
  Value(int v) : Value(static_cast<int64_t>(v)) {}
  Value(int64_t v);
  Value(double v);
  Value(std::string s);
  Value(const char* s) : Value(std::string(s)) {}
  static Value list(ValueList items);
  // A list that prints as a Python tuple: (a, b). dict.items() and dictsort give these.
  static Value tuple(ValueList items);
  static Value dict(ValueItems items);
  static Value namespace_object(ValueItems items);
  // A callable; `name` appears in error messages.
  static Value function(std::string name, NativeFunction fn);

  // nlohmann::ordered_json keeps object key order (Python's dict order); plain json sorts keys.
  static Value from_json(const nlohmann::ordered_json& j);
  static Value from_json(const nlohmann::json& j);

  Kind kind() const { return kind_; }
  bool is_undefined() const { return kind_ == Kind::kUndefined; }
  bool is_none() const { return kind_ == Kind::kNone; }
  bool is_bool() const { return kind_ == Kind::kBool; }
  bool is_int() const { return kind_ == Kind::kInt; }
  bool is_float() const { return kind_ == Kind::kFloat; }
  bool is_number() const {
    return kind_ == Kind::kInt || kind_ == Kind::kFloat || kind_ == Kind::kBool;
  }
  bool is_string() const { return kind_ == Kind::kString; }
  bool is_list() const { return kind_ == Kind::kList; }
  bool is_tuple() const { return kind_ == Kind::kList && tuple_; }
  bool is_dict() const { return kind_ == Kind::kDict; }
  bool is_namespace() const { return kind_ == Kind::kNamespace; }
  bool is_callable() const { return kind_ == Kind::kCallable; }
  bool is_mapping() const { return kind_ == Kind::kDict || kind_ == Kind::kNamespace; }

  bool as_bool() const { return b_; }
  int64_t as_int() const;    // bool and int
  double as_double() const;  // bool, int and float
  const std::string& as_string() const { return s_; }
  const ValueList& as_list() const { return *list_; }
  const ValueItems& as_items() const { return *items_; }
  const std::string& name() const { return s_; }  // undefined: hint; callable: name
  Value call(CallArgs& args) const;

  // dict / namespace lookup by key; nullptr when absent.
  const Value* find(const Value& key) const;
  const Value* find(const std::string& key) const { return find(Value(key)); }
  // namespace only: sets an attribute.
  void set_attribute(const std::string& key, Value v) const;

  // Python truthiness (undefined is false).
  bool truthy() const;
  // Python str(): "None", "True", repr of floats, lists and dicts as Python prints them.
  std::string str() const;
  // Python repr(): strings quoted.
  std::string repr() const;
  // A short type name for messages ("str", "int", "list", "dict", "NoneType", "undefined").
  const char* type_name() const;
  // json.dumps(value, ensure_ascii=False, indent=indent, sort_keys=sort_keys); indent < 0: none.
  std::string to_json(int indent = -1, bool sort_keys = false) const;

  // Python ==.
  bool equals(const Value& other) const;

 private:
  Kind kind_ = Kind::kUndefined;
  bool b_ = false;
  bool tuple_ = false;
  int64_t i_ = 0;
  double f_ = 0.0;
  std::string s_;  // string, undefined hint or callable name
  std::shared_ptr<const ValueList> list_;
  std::shared_ptr<ValueItems> items_;  // dict (never mutated) or namespace (mutable)
  std::shared_ptr<const NativeFunction> fn_;
};

// Arguments of a call: positional then keyword, as written.
struct CallArgs {
  ValueList positional;
  std::vector<std::pair<std::string, Value>> keyword;

  // Index for get()/has() of an argument that can only be given by keyword.
  static constexpr size_t kKeywordOnly = static_cast<size_t>(-1);

  // The argument named `name`, else the one at `index`, else `fallback`. A keyword argument is
  // taken out of `keyword`.
  Value get(size_t index, const char* name, Value fallback = Value());
  // True when it was given.
  bool has(size_t index, const char* name) const;
};

// Python's float repr (shortest round-trip digits: 22.0, 0.1, 1e+16).
std::string float_repr(double v);
// Number of Unicode code points in a UTF-8 string.
size_t utf8_length(const std::string& s);
// Splits UTF-8 into code points (each a std::string); bad bytes stay single bytes.
std::vector<std::string> utf8_chars(const std::string& s);

}  // namespace crl::text::jinja
