// The Python methods of str, dict and list that chat templates call ("x".startswith(...),
// message.items(), ...), bound to their receiver. Mutating methods (append, update, pop, ...)
// are refused as in transformers' ImmutableSandboxedEnvironment.
#pragma once

#include <optional>
#include <string>

#include "text/jinja/value.h"

namespace crl::text::jinja {

// The method `name` of `obj` bound to it; nullopt when `obj` has no such method. A mutating
// method is an undefined value whose use raises the sandbox's error.
std::optional<Value> bound_method(const Value& obj, const std::string& name);

// Python's str methods used by filters too.
std::string py_strip(const std::string& s, const Value& chars, bool left, bool right);
ValueList py_split(const std::string& s, const Value& sep, int64_t maxsplit, bool from_right);
std::string py_replace(const std::string& s, const std::string& old, const std::string& with,
                       int64_t count);
std::string ascii_upper(std::string s);
std::string ascii_lower(std::string s);
std::string py_capitalize(const std::string& s);

}  // namespace crl::text::jinja
