// Builtins of the interpreter: Python's object model as Jinja2 sees it (attribute and item
// lookup, str/dict/list methods, operators, iteration), Jinja2's filters and tests, and the
// globals transformers provides (range, namespace, dict, raise_exception, strftime_now).
// Errors throw TemplateError without a line; the interpreter adds it.
#pragma once

#include <ctime>
#include <functional>
#include <optional>
#include <string>
#include <unordered_map>

#include "text/jinja/value.h"

namespace crl::text::jinja {

// ---- object model (objects.cpp)

// obj.name: a method or attribute first, then obj["name"]; missing: an undefined value that
// says why. Raises on an undefined `obj`.
Value get_attribute(const Value& obj, const std::string& name);
// obj[key]: the item first, then (for string keys) the attribute; missing: undefined.
Value get_item(const Value& obj, const Value& key);
// obj[start:stop:step] on a list or string (code points); null parts are Python's defaults.
Value get_slice(const Value& obj, const Value* start, const Value* stop, const Value* step);
// The items a `for` loop visits: list items, dict keys, string characters; undefined: none.
ValueList iterate(const Value& v);
// A binary operator: + - * / // % ** ~ == != < <= > >= in "not in".
Value binary_op(const std::string& op, const Value& a, const Value& b);
// Unary - and +.
Value unary_op(const std::string& op, const Value& a);
// Calls a callable; an undefined callee raises its undefined error.
Value call_value(const Value& callee, CallArgs& args);
// Throws the error an undefined value raises when used (its hint, or "'name' is undefined").
[[noreturn]] void raise_undefined(const Value& v);
// Python < for sorting (numbers, strings, lists); throws for unorderable kinds.
bool less_than(const Value& a, const Value& b);

// ---- filters and tests (filters.cpp)

bool is_filter(const std::string& name);
bool is_test(const std::string& name);
Value apply_filter(const std::string& name, const Value& input, CallArgs& args);
bool apply_test(const std::string& name, const Value& input, CallArgs& args);

// ---- globals (objects.cpp)

// The names every template sees. `now` is the time strftime_now() formats (local time).
std::unordered_map<std::string, Value> make_globals(std::function<std::time_t()> now);

}  // namespace crl::text::jinja
