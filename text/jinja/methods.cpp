#include "text/jinja/methods.h"

#include <algorithm>
#include <cctype>

#include "text/jinja/builtins.h"
#include "text/jinja/error.h"
#include "text/jinja/limits.h"

namespace crl::text::jinja {

namespace {

[[noreturn]] void type_error(const std::string& message) {
  throw TemplateError(TemplateError::Kind::kRuntime, message);
}

bool is_py_space(const std::string& c) {
  return c.size() == 1 &&
         (c[0] == ' ' || c[0] == '\t' || c[0] == '\n' || c[0] == '\r' || c[0] == '\v' ||
          c[0] == '\f' || c[0] == '\x1c' || c[0] == '\x1d' || c[0] == '\x1e' || c[0] == '\x1f');
}

const std::string& str_arg(const Value& v, const char* method) {
  if (!v.is_string())
    type_error(std::string(method) + "() argument must be str, not " + v.type_name());
  return v.as_string();
}

int64_t int_arg(const Value& v, int64_t fallback) {
  if (v.is_undefined() || v.is_none()) return fallback;
  if (!v.is_number() || v.is_float())
    type_error(std::string("an integer argument is required, not ") + v.type_name());
  return v.as_int();
}

// startswith / endswith with a str or a tuple (list) of str.
bool affix_match(const std::string& s, const Value& affix, bool prefix) {
  auto one = [&](const Value& a) {
    const std::string& x = str_arg(a, prefix ? "startswith" : "endswith");
    if (x.size() > s.size()) return false;
    return prefix ? s.compare(0, x.size(), x) == 0
                  : s.compare(s.size() - x.size(), x.size(), x) == 0;
  };
  if (affix.is_list()) return std::any_of(affix.as_list().begin(), affix.as_list().end(), one);
  return one(affix);
}

std::string py_title(const std::string& s) {
  std::string out = s;
  bool prev_cased = false;
  for (char& c : out) {
    const bool alpha = std::isalpha(static_cast<unsigned char>(c)) != 0;
    if (alpha)
      c = static_cast<char>(prev_cased ? std::tolower(static_cast<unsigned char>(c))
                                       : std::toupper(static_cast<unsigned char>(c)));
    prev_cased = alpha;
  }
  return out;
}

// str.format with {} / {0} / {name} fields (no format specs or conversions).
std::string py_format(const std::string& fmt, CallArgs& a) {
  std::string out;
  size_t auto_index = 0;
  for (size_t i = 0; i < fmt.size(); ++i) {
    const char c = fmt[i];
    if (c == '{' && i + 1 < fmt.size() && fmt[i + 1] == '{') {
      out += '{';
      ++i;
    } else if (c == '}' && i + 1 < fmt.size() && fmt[i + 1] == '}') {
      out += '}';
      ++i;
    } else if (c == '{') {
      const size_t end = fmt.find('}', i);
      if (end == std::string::npos)
        type_error("str.format: single '{' encountered in format string");
      const std::string field = fmt.substr(i + 1, end - i - 1);
      if (field.find_first_of(":!") != std::string::npos) {
        throw TemplateError(TemplateError::Kind::kUnsupported,
                            "str.format: format specs and conversions are not supported");
      }
      Value v;
      if (field.empty()) {
        if (auto_index >= a.positional.size())
          type_error("str.format: replacement index out of range");
        v = a.positional[auto_index++];
      } else if (std::all_of(field.begin(), field.end(),
                             [](char d) { return std::isdigit(static_cast<unsigned char>(d)); })) {
        const size_t k = std::stoul(field);
        if (k >= a.positional.size()) type_error("str.format: replacement index out of range");
        v = a.positional[k];
      } else {
        bool found = false;
        for (const auto& kv : a.keyword) {
          if (kv.first == field) {
            v = kv.second;
            found = true;
          }
        }
        if (!found) type_error("str.format: no argument named '" + field + "'");
      }
      out += v.str();
      i = end;
    } else if (c == '}') {
      type_error("str.format: single '}' encountered in format string");
    } else {
      out += c;
    }
  }
  return out;
}

std::optional<Value> string_method(const Value& self, const std::string& name) {
  const std::string s = self.as_string();
  using F = NativeFunction;
  F f;
  if (name == "strip" || name == "lstrip" || name == "rstrip") {
    f = [s, name](CallArgs& a) {
      return Value(py_strip(s, a.get(0, "chars"), name != "rstrip", name != "lstrip"));
    };
  } else if (name == "split" || name == "rsplit") {
    f = [s, name](CallArgs& a) {
      return Value::list(
          py_split(s, a.get(0, "sep"), int_arg(a.get(1, "maxsplit"), -1), name == "rsplit"));
    };
  } else if (name == "startswith" || name == "endswith") {
    f = [s, name](CallArgs& a) {
      return Value(affix_match(s, a.get(0, "prefix"), name == "startswith"));
    };
  } else if (name == "replace") {
    f = [s](CallArgs& a) {
      return Value(py_replace(s, str_arg(a.get(0, "old"), "replace"),
                              str_arg(a.get(1, "new"), "replace"), int_arg(a.get(2, "count"), -1)));
    };
  } else if (name == "upper" || name == "lower" || name == "title" || name == "capitalize") {
    f = [s, name](CallArgs&) {
      if (name == "upper") return Value(ascii_upper(s));
      if (name == "lower") return Value(ascii_lower(s));
      if (name == "title") return Value(py_title(s));
      return Value(py_capitalize(s));
    };
  } else if (name == "format") {
    f = [s](CallArgs& a) { return Value(py_format(s, a)); };
  } else if (name == "join") {
    f = [s](CallArgs& a) {
      std::string out;
      const ValueList items = iterate(a.get(0, "iterable"));
      for (size_t i = 0; i < items.size(); ++i) {
        out += (i ? s : "") + str_arg(items[i], "join");
        check_string_bytes(out.size(), "join()'s result");
      }
      return Value(out);
    };
  } else if (name == "find" || name == "rfind" || name == "index" || name == "rindex" ||
             name == "count") {
    f = [s, name](CallArgs& a) {
      const std::string& sub = str_arg(a.get(0, "sub"), name.c_str());
      if (name == "count") {
        if (sub.empty()) return Value(static_cast<int64_t>(utf8_length(s) + 1));
        int64_t n = 0;
        for (size_t at = s.find(sub); at != std::string::npos; at = s.find(sub, at + sub.size()))
          ++n;
        return Value(n);
      }
      const size_t at = name[0] == 'r' ? s.rfind(sub) : s.find(sub);
      if (at == std::string::npos) {
        if (name == "index" || name == "rindex") type_error("substring not found");
        return Value(static_cast<int64_t>(-1));
      }
      return Value(static_cast<int64_t>(utf8_length(s.substr(0, at))));
    };
  } else if (name == "isdigit" || name == "isalpha" || name == "isalnum" || name == "isspace" ||
             name == "isupper" || name == "islower") {
    f = [s, name](CallArgs&) {
      if (s.empty()) return Value(false);
      bool any_cased = false;
      for (unsigned char c : s) {
        if (name == "isdigit" && !std::isdigit(c)) return Value(false);
        if (name == "isalpha" && !std::isalpha(c)) return Value(false);
        if (name == "isalnum" && !std::isalnum(c)) return Value(false);
        if (name == "isspace" && !std::isspace(c)) return Value(false);
        if (name == "isupper" && std::islower(c)) return Value(false);
        if (name == "islower" && std::isupper(c)) return Value(false);
        any_cased = any_cased || std::isalpha(c);
      }
      return Value(name == "isupper" || name == "islower" ? any_cased : true);
    };
  } else if (name == "splitlines") {
    f = [s](CallArgs& a) {
      const bool keep = a.get(0, "keepends").truthy();
      ValueList out;
      size_t start = 0;
      for (size_t i = 0; i < s.size(); ++i) {
        if (s[i] == '\n' || s[i] == '\r') {
          size_t end = i + 1;
          if (s[i] == '\r' && end < s.size() && s[end] == '\n') ++end;
          out.emplace_back(s.substr(start, (keep ? end : i) - start));
          start = end;
          i = end - 1;
        }
      }
      if (start < s.size()) out.emplace_back(s.substr(start));
      return Value::list(std::move(out));
    };
  } else {
    return std::nullopt;
  }
  return Value::function("str." + name, std::move(f));
}

std::optional<Value> dict_method(const Value& self, const std::string& name) {
  NativeFunction f;
  if (name == "items") {
    f = [self](CallArgs&) {
      ValueList out;
      for (const auto& kv : self.as_items()) out.push_back(Value::tuple({kv.first, kv.second}));
      return Value::list(std::move(out));
    };
  } else if (name == "keys" || name == "values") {
    f = [self, name](CallArgs&) {
      ValueList out;
      for (const auto& kv : self.as_items()) out.push_back(name == "keys" ? kv.first : kv.second);
      return Value::list(std::move(out));
    };
  } else if (name == "get") {
    f = [self](CallArgs& a) {
      const Value* v = self.find(a.get(0, "key"));
      return v ? *v : a.get(1, "default", Value::none());
    };
  } else if (name == "copy") {
    f = [self](CallArgs&) { return Value::dict(self.as_items()); };
  } else {
    return std::nullopt;
  }
  return Value::function("dict." + name, std::move(f));
}

std::optional<Value> list_method(const Value& self, const std::string& name) {
  NativeFunction f;
  if (name == "index" || name == "count") {
    f = [self, name](CallArgs& a) {
      const Value x = a.get(0, "value");
      int64_t n = 0;
      for (size_t i = 0; i < self.as_list().size(); ++i) {
        if (!self.as_list()[i].equals(x)) continue;
        if (name == "index") return Value(static_cast<int64_t>(i));
        ++n;
      }
      if (name == "index") type_error(x.repr() + " is not in list");
      return Value(n);
    };
  } else if (name == "copy") {
    f = [self](CallArgs&) { return self; };
  } else {
    return std::nullopt;
  }
  return Value::function("list." + name, std::move(f));
}

}  // namespace

std::optional<Value> bound_method(const Value& obj, const std::string& name) {
  static const char* kMutating[] = {"append",  "extend", "insert",  "pop",    "remove",
                                    "clear",   "sort",   "reverse", "update", "setdefault",
                                    "popitem", "add",    "discard"};
  if (obj.is_list() || obj.is_dict()) {
    for (const char* m : kMutating) {
      if (name == m && !(obj.is_dict() && obj.find(name))) {
        return Value::undefined("access to attribute '" + name + "' of '" + obj.type_name() +
                                "' object is unsafe (templates cannot modify values)");
      }
    }
  }
  if (obj.is_string()) return string_method(obj, name);
  if (obj.is_dict()) return dict_method(obj, name);
  if (obj.is_list()) return list_method(obj, name);
  return std::nullopt;
}

std::string py_strip(const std::string& s, const Value& chars, bool left, bool right) {
  const std::vector<std::string> cs = utf8_chars(s);
  std::vector<std::string> set;
  const bool whitespace = chars.is_undefined() || chars.is_none();
  if (!whitespace) set = utf8_chars(str_arg(chars, "strip"));
  auto strip_it = [&](const std::string& c) {
    return whitespace ? is_py_space(c) : std::find(set.begin(), set.end(), c) != set.end();
  };
  size_t b = 0, e = cs.size();
  if (left) {
    while (b < e && strip_it(cs[b])) ++b;
  }
  if (right) {
    while (e > b && strip_it(cs[e - 1])) --e;
  }
  std::string out;
  for (size_t i = b; i < e; ++i) out += cs[i];
  return out;
}

ValueList py_split(const std::string& s, const Value& sep_value, int64_t maxsplit,
                   bool from_right) {
  ValueList out;
  if (sep_value.is_undefined() || sep_value.is_none()) {  // runs of whitespace
    std::vector<std::string> words;
    const std::vector<std::string> cs = utf8_chars(s);
    std::string word;
    bool in_word = false;
    for (const auto& c : cs) {
      if (is_py_space(c)) {
        if (in_word) words.push_back(word), word.clear();
        in_word = false;
      } else {
        word += c;
        in_word = true;
      }
    }
    if (in_word) words.push_back(word);
    if (maxsplit < 0 || static_cast<size_t>(maxsplit) >= words.size()) {
      for (auto& w : words) out.emplace_back(w);
      return out;
    }
    // With a limit, the remainder keeps its inner whitespace: recompute on the raw string.
    const std::string trimmed = py_strip(s, Value(), !from_right, from_right);
    std::vector<std::string> pieces;
    std::string rest = trimmed;
    for (int64_t k = 0; k < maxsplit; ++k) {
      if (!from_right) {
        const size_t end = rest.find_first_of(" \t\n\r\v\f");
        pieces.push_back(rest.substr(0, end));
        rest = py_strip(rest.substr(end), Value(), true, false);
      } else {
        const size_t start = rest.find_last_of(" \t\n\r\v\f");
        pieces.insert(pieces.begin(), rest.substr(start + 1));
        rest = py_strip(rest.substr(0, start), Value(), false, true);
      }
    }
    if (from_right) {
      out.emplace_back(rest);
      for (auto& p : pieces) out.emplace_back(p);
    } else {
      for (auto& p : pieces) out.emplace_back(p);
      out.emplace_back(rest);
    }
    return out;
  }
  const std::string& sep = str_arg(sep_value, "split");
  if (sep.empty()) type_error("empty separator");
  std::vector<std::string> parts;
  if (!from_right) {
    size_t start = 0;
    for (size_t at = s.find(sep);
         at != std::string::npos && (maxsplit < 0 || static_cast<int64_t>(parts.size()) < maxsplit);
         at = s.find(sep, start)) {
      parts.push_back(s.substr(start, at - start));
      start = at + sep.size();
    }
    parts.push_back(s.substr(start));
  } else {
    size_t end = s.size();
    while (maxsplit < 0 || static_cast<int64_t>(parts.size()) < maxsplit) {
      if (end < sep.size()) break;
      const size_t at = s.rfind(sep, end - sep.size());
      if (at == std::string::npos) break;
      parts.insert(parts.begin(), s.substr(at + sep.size(), end - at - sep.size()));
      end = at;
    }
    parts.insert(parts.begin(), s.substr(0, end));
  }
  for (auto& p : parts) out.emplace_back(p);
  return out;
}

std::string py_replace(const std::string& s, const std::string& old, const std::string& with,
                       int64_t count) {
  std::string out;
  if (old.empty()) {  // Python inserts `with` around every character
    const auto cs = utf8_chars(s);
    int64_t n = 0;
    for (const auto& c : cs) {
      if (count < 0 || n < count) out += with, ++n;
      out += c;
      check_string_bytes(out.size(), "replace()'s result");
    }
    if (count < 0 || n < count) out += with;
    return out;
  }
  size_t start = 0;
  int64_t n = 0;
  for (size_t at = s.find(old); at != std::string::npos && (count < 0 || n < count);
       at = s.find(old, start)) {
    out += s.substr(start, at - start) + with;
    check_string_bytes(out.size(), "replace()'s result");
    start = at + old.size();
    ++n;
  }
  return out + s.substr(start);
}

std::string ascii_upper(std::string s) {
  for (char& c : s) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  return s;
}

std::string ascii_lower(std::string s) {
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

std::string py_capitalize(const std::string& s) {
  std::string out = ascii_lower(s);
  if (!out.empty()) out[0] = static_cast<char>(std::toupper(static_cast<unsigned char>(out[0])));
  return out;
}

}  // namespace crl::text::jinja
