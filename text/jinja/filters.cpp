// Jinja2's builtin filters and tests, as chat templates use them.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>

#include "text/jinja/builtins.h"
#include "text/jinja/error.h"
#include "text/jinja/limits.h"
#include "text/jinja/methods.h"

namespace crl::text::jinja {

namespace {

using Filter = Value (*)(const Value& v, CallArgs& a);
using Test = bool (*)(const Value& v, CallArgs& a);

[[noreturn]] void type_error(const std::string& message) {
  throw TemplateError(TemplateError::Kind::kRuntime, message);
}

// Jinja's environment.getattr for "attribute=" arguments: dotted paths, integer parts index.
Value attribute_path(const Value& v, const Value& path) {
  if (!path.is_string()) return get_item(v, path);
  Value cur = v;
  size_t start = 0;
  const std::string& p = path.as_string();
  while (true) {
    const size_t dot = p.find('.', start);
    const std::string part =
        p.substr(start, dot == std::string::npos ? std::string::npos : dot - start);
    const bool digits = !part.empty() && std::all_of(part.begin(), part.end(), [](char c) {
      return std::isdigit(static_cast<unsigned char>(c));
    });
    cur = digits ? get_item(cur, Value(static_cast<int64_t>(std::stoll(part))))
                 : get_item(cur, Value(part));
    if (dot == std::string::npos) return cur;
    start = dot + 1;
  }
}

// The key sort/unique/dictsort compare by: strings lower-cased unless case_sensitive.
Value sort_key(const Value& v, bool case_sensitive) {
  return !case_sensitive && v.is_string() ? Value(ascii_lower(v.as_string())) : v;
}

std::string html_escape(const std::string& s) {
  std::string out;
  for (char c : s) {
    switch (c) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '"':
        out += "&#34;";
        break;
      case '\'':
        out += "&#39;";
        break;
      default:
        out += c;
    }
  }
  return out;
}

// select/reject/selectattr/rejectattr: args are (test name, test args...) after `attr_args`
// attribute.
Value select_items(const Value& v, CallArgs& a, bool by_attribute, bool keep) {
  const ValueList items = iterate(v);
  Value attribute;
  size_t first = 0;
  if (by_attribute) {
    if (a.positional.empty()) type_error("selectattr/rejectattr need an attribute name");
    attribute = a.positional[0];
    first = 1;
  }
  std::string test;
  CallArgs test_args;
  if (a.positional.size() > first) {
    if (!a.positional[first].is_string()) type_error("the test name must be a string");
    test = a.positional[first].as_string();
    if (!is_test(test)) type_error("no test named '" + test + "'");
    test_args.positional.assign(a.positional.begin() + static_cast<long>(first) + 1,
                                a.positional.end());
  }
  ValueList out;
  for (const Value& item : items) {
    const Value subject = by_attribute ? attribute_path(item, attribute) : item;
    CallArgs args = test_args;
    const bool pass = test.empty() ? subject.truthy() : apply_test(test, subject, args);
    if (pass == keep) out.push_back(item);
  }
  return Value::list(std::move(out));
}

std::string printf_format(const std::string& fmt, const ValueList& args) {
  std::string out;
  size_t k = 0;
  for (size_t i = 0; i < fmt.size(); ++i) {
    if (fmt[i] != '%') {
      out += fmt[i];
      continue;
    }
    if (i + 1 < fmt.size() && fmt[i + 1] == '%') {
      out += '%';
      ++i;
      continue;
    }
    size_t j = i + 1;
    std::string spec = "%";
    while (j < fmt.size() && std::string("-+ 0#.0123456789").find(fmt[j]) != std::string::npos)
      spec += fmt[j++];
    if (j >= fmt.size()) type_error("incomplete format");
    const char conv = fmt[j];
    if (k >= args.size()) type_error("not enough arguments for format string");
    const Value& v = args[k++];
    char buf[128];
    if (conv == 's' || conv == 'r') {
      const std::string s = conv == 's' ? v.str() : v.repr();
      out += spec == "%" ? s
                         : (std::snprintf(buf, sizeof(buf), (spec + "s").c_str(), s.c_str()),
                            std::string(buf));
    } else if (conv == 'd' || conv == 'i') {
      if (!v.is_number())
        type_error("%d format: a number is required, not " + std::string(v.type_name()));
      std::snprintf(buf, sizeof(buf), (spec + "lld").c_str(),
                    static_cast<long long>(v.is_float() ? std::trunc(v.as_double()) : v.as_int()));
      out += buf;
    } else if (conv == 'f' || conv == 'e' || conv == 'g') {
      if (!v.is_number())
        type_error("%f format: a number is required, not " + std::string(v.type_name()));
      std::snprintf(buf, sizeof(buf), (spec + conv).c_str(), v.as_double());
      out += buf;
    } else {
      throw TemplateError(TemplateError::Kind::kUnsupported,
                          std::string("format conversion '%") + conv + "' is not supported");
    }
    i = j;
  }
  if (k < args.size()) type_error("not all arguments converted during string formatting");
  return out;
}

Value f_default(const Value& v, CallArgs& a) {
  const Value fallback = a.get(0, "default_value", Value(""));
  const bool boolean = a.get(1, "boolean", Value(false)).truthy();
  return v.is_undefined() || (boolean && !v.truthy()) ? fallback : v;
}

Value f_length(const Value& v, CallArgs&) {
  if (v.is_string()) return Value(static_cast<int64_t>(utf8_length(v.as_string())));
  if (v.is_list()) return Value(static_cast<int64_t>(v.as_list().size()));
  if (v.is_mapping()) return Value(static_cast<int64_t>(v.as_items().size()));
  if (v.is_undefined()) return Value(static_cast<int64_t>(0));
  type_error(std::string("object of type '") + v.type_name() + "' has no len()");
}

Value f_first_last(const Value& v, bool first) {
  const ValueList items = iterate(v);
  if (items.empty()) return Value::undefined("No first item, sequence was empty.");
  return first ? items.front() : items.back();
}

Value f_join(const Value& v, CallArgs& a) {
  const Value sep = a.get(0, "d", Value(""));
  const Value attribute = a.get(1, "attribute", Value::none());
  std::string out;
  const ValueList items = iterate(v);
  for (size_t i = 0; i < items.size(); ++i) {
    if (i) out += sep.str();
    out += (attribute.is_none() ? items[i] : attribute_path(items[i], attribute)).str();
    check_string_bytes(out.size(), "join's result");
  }
  return Value(out);
}

Value f_map(const Value& v, CallArgs& a) {
  ValueList out;
  const ValueList items = iterate(v);
  if (a.has(CallArgs::kKeywordOnly, "attribute")) {
    const Value attribute = a.get(CallArgs::kKeywordOnly, "attribute");
    const bool has_default = a.has(CallArgs::kKeywordOnly, "default");
    const Value dflt = a.get(CallArgs::kKeywordOnly, "default");
    for (const Value& item : items) {
      Value x = attribute_path(item, attribute);
      out.push_back(x.is_undefined() && has_default ? dflt : x);
    }
    return Value::list(std::move(out));
  }
  if (a.positional.empty() || !a.positional[0].is_string())
    type_error("map() needs a filter name or attribute=");
  const std::string filter = a.positional[0].as_string();
  if (!is_filter(filter)) type_error("no filter named '" + filter + "'");
  for (const Value& item : items) {
    CallArgs args;
    args.positional.assign(a.positional.begin() + 1, a.positional.end());
    args.keyword = a.keyword;
    out.push_back(apply_filter(filter, item, args));
  }
  return Value::list(std::move(out));
}

Value f_sort(const Value& v, CallArgs& a) {
  const bool reverse = a.get(0, "reverse", Value(false)).truthy();
  const bool case_sensitive = a.get(1, "case_sensitive", Value(false)).truthy();
  const Value attribute = a.get(2, "attribute", Value::none());
  ValueList items = iterate(v);
  std::stable_sort(items.begin(), items.end(), [&](const Value& x, const Value& y) {
    const Value kx =
        sort_key(attribute.is_none() ? x : attribute_path(x, attribute), case_sensitive);
    const Value ky =
        sort_key(attribute.is_none() ? y : attribute_path(y, attribute), case_sensitive);
    return reverse ? less_than(ky, kx) : less_than(kx, ky);
  });
  return Value::list(std::move(items));
}

Value f_dictsort(const Value& v, CallArgs& a) {
  if (!v.is_mapping()) type_error("dictsort needs a dict");
  const bool case_sensitive = a.get(0, "case_sensitive", Value(false)).truthy();
  const Value by = a.get(1, "by", Value("key"));
  const bool reverse = a.get(2, "reverse", Value(false)).truthy();
  const size_t pos = by.is_string() && by.as_string() == "value" ? 1 : 0;
  ValueList pairs;
  for (const auto& kv : v.as_items()) pairs.push_back(Value::tuple({kv.first, kv.second}));
  std::stable_sort(pairs.begin(), pairs.end(), [&](const Value& x, const Value& y) {
    const Value kx = sort_key(x.as_list()[pos], case_sensitive),
                ky = sort_key(y.as_list()[pos], case_sensitive);
    return reverse ? less_than(ky, kx) : less_than(kx, ky);
  });
  return Value::list(std::move(pairs));
}

Value f_unique(const Value& v, CallArgs& a) {
  const bool case_sensitive = a.get(0, "case_sensitive", Value(false)).truthy();
  const Value attribute = a.get(1, "attribute", Value::none());
  ValueList out, seen;
  for (const Value& item : iterate(v)) {
    const Value key =
        sort_key(attribute.is_none() ? item : attribute_path(item, attribute), case_sensitive);
    if (std::any_of(seen.begin(), seen.end(), [&](const Value& s) { return s.equals(key); }))
      continue;
    seen.push_back(key);
    out.push_back(item);
  }
  return Value::list(std::move(out));
}

Value f_min_max(const Value& v, CallArgs& a, bool want_max) {
  const bool case_sensitive = a.get(0, "case_sensitive", Value(false)).truthy();
  const Value attribute = a.get(1, "attribute", Value::none());
  const ValueList items = iterate(v);
  if (items.empty()) return Value::undefined("No aggregated item, sequence was empty.");
  const Value* best = &items[0];
  for (const Value& item : items) {
    const Value k =
        sort_key(attribute.is_none() ? item : attribute_path(item, attribute), case_sensitive);
    const Value kb =
        sort_key(attribute.is_none() ? *best : attribute_path(*best, attribute), case_sensitive);
    if (want_max ? less_than(kb, k) : less_than(k, kb)) best = &item;
  }
  return *best;
}

Value f_tojson(const Value& v, CallArgs& a) {
  const Value indent = a.get(1, "indent", Value::none());
  const bool sort_keys = a.get(4, "sort_keys", Value(false)).truthy();
  if (a.get(0, "ensure_ascii", Value(false)).truthy()) {
    throw TemplateError(TemplateError::Kind::kUnsupported,
                        "tojson(ensure_ascii=True) is not supported");
  }
  if (!a.get(2, "separators", Value::none()).is_none()) {
    throw TemplateError(TemplateError::Kind::kUnsupported,
                        "tojson(separators=...) is not supported");
  }
  if (!indent.is_none() && (!indent.is_number() || indent.is_float()))
    type_error("tojson: indent must be an integer");
  return Value(v.to_json(
      indent.is_none() ? -1 : static_cast<int>(std::max<int64_t>(0, indent.as_int())), sort_keys));
}

Value f_indent(const Value& v, CallArgs& a) {
  const Value width = a.get(0, "width", Value(static_cast<int64_t>(4)));
  const bool first = a.get(1, "first", Value(false)).truthy();
  const bool blank = a.get(2, "blank", Value(false)).truthy();
  if (!width.is_string())
    check_string_bytes(std::max<int64_t>(0, width.as_int()), "indent's width");
  const std::string pad =
      width.is_string()
          ? width.as_string()
          : std::string(static_cast<size_t>(std::max<int64_t>(0, width.as_int())), ' ');
  const std::string s = v.str();
  std::string out;
  size_t start = 0;
  bool first_line = true;
  while (start <= s.size()) {
    const size_t nl = s.find('\n', start);
    const std::string line =
        s.substr(start, nl == std::string::npos ? std::string::npos : nl - start);
    if ((!first_line || first) && (blank || !line.empty())) out += pad;
    out += line;
    if (nl == std::string::npos) break;
    out += '\n';
    start = nl + 1;
    first_line = false;
  }
  return Value(out);
}

Value f_round(const Value& v, CallArgs& a) {
  const int64_t precision = a.get(0, "precision", Value(static_cast<int64_t>(0))).as_int();
  const Value method = a.get(1, "method", Value("common"));
  const double scale = std::pow(10.0, static_cast<double>(precision));
  double x = v.as_double() * scale;
  const std::string m = method.str();
  x = m == "ceil"    ? std::ceil(x)
      : m == "floor" ? std::floor(x)
                     : std::nearbyint(x);  // Python rounds half to even
  return Value(x / scale);
}

Value f_int(const Value& v, CallArgs& a) {
  const Value dflt = a.get(0, "default", Value(static_cast<int64_t>(0)));
  if (v.is_number())
    return v.is_float() ? Value(static_cast<int64_t>(std::trunc(v.as_double())))
                        : Value(v.as_int());
  if (v.is_string()) {
    const std::string s = py_strip(v.as_string(), Value(), true, true);
    char* end = nullptr;
    const long long n =
        std::strtoll(s.c_str(), &end,
                     static_cast<int>(a.get(1, "base", Value(static_cast<int64_t>(10))).as_int()));
    if (!s.empty() && end && *end == '\0') return Value(static_cast<int64_t>(n));
    const double d = std::strtod(s.c_str(), &end);
    if (!s.empty() && end && *end == '\0') return Value(static_cast<int64_t>(std::trunc(d)));
  }
  return dflt;
}

Value f_float(const Value& v, CallArgs& a) {
  const Value dflt = a.get(0, "default", Value(0.0));
  if (v.is_number()) return Value(v.as_double());
  if (v.is_string()) {
    const std::string s = py_strip(v.as_string(), Value(), true, true);
    char* end = nullptr;
    const double d = std::strtod(s.c_str(), &end);
    if (!s.empty() && end && *end == '\0') return Value(d);
  }
  return dflt;
}

Value f_title(const Value& v, CallArgs&) {
  // Jinja's title: words start after runs of - whitespace ( { [ <.
  const std::string s = v.str();
  std::string out;
  bool start = true;
  for (char c : s) {
    const bool sep = c == '-' || c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '(' ||
                     c == '{' || c == '[' || c == '<';
    if (sep) {
      out += c;
      start = true;
    } else {
      out += static_cast<char>(start ? std::toupper(static_cast<unsigned char>(c))
                                     : std::tolower(static_cast<unsigned char>(c)));
      start = false;
    }
  }
  return Value(out);
}

Value f_sum(const Value& v, CallArgs& a) {
  const Value attribute = a.get(0, "attribute", Value::none());
  Value total = a.get(1, "start", Value(static_cast<int64_t>(0)));
  for (const Value& item : iterate(v))
    total = binary_op("+", total, attribute.is_none() ? item : attribute_path(item, attribute));
  return total;
}

Value f_items(const Value& v, CallArgs&) {
  if (v.is_undefined()) return Value::list({});
  if (!v.is_mapping())
    type_error("items filter needs a mapping, got " + std::string(v.type_name()));
  ValueList out;
  for (const auto& kv : v.as_items()) out.push_back(Value::tuple({kv.first, kv.second}));
  return Value::list(std::move(out));
}

Value f_replace(const Value& v, CallArgs& a) {
  const Value old = a.get(0, "old"), with = a.get(1, "new");
  const Value count = a.get(2, "count", Value::none());
  return Value(py_replace(v.str(), old.str(), with.str(), count.is_none() ? -1 : count.as_int()));
}

Value f_wordcount(const Value& v, CallArgs&) {
  return Value(static_cast<int64_t>(py_split(v.str(), Value(), -1, false).size()));
}

Value f_center(const Value& v, CallArgs& a) {
  const int64_t width = a.get(0, "width", Value(static_cast<int64_t>(80))).as_int();
  const std::string s = v.str();
  const int64_t n = static_cast<int64_t>(utf8_length(s));
  if (width <= n) return Value(s);
  check_string_bytes(static_cast<uint64_t>(width) + s.size(), "center's result");
  const int64_t total = width - n, left = total / 2 + (total & width & 1);
  return Value(std::string(static_cast<size_t>(left), ' ') + s +
               std::string(static_cast<size_t>(total - left), ' '));
}

const std::map<std::string, Filter>& filters() {
  static const std::map<std::string, Filter> m = {
      {"abs",
       [](const Value& v, CallArgs&) {
         return v.is_float() ? Value(std::fabs(v.as_double()))
                             : Value(static_cast<int64_t>(std::llabs(v.as_int())));
       }},
      {"attr",
       [](const Value& v, CallArgs& a) { return get_attribute(v, a.get(0, "name").str()); }},
      {"capitalize", [](const Value& v, CallArgs&) { return Value(py_capitalize(v.str())); }},
      {"center", f_center},
      {"count", f_length},
      {"d", f_default},
      {"default", f_default},
      {"dictsort", f_dictsort},
      {"e", [](const Value& v, CallArgs&) { return Value(html_escape(v.str())); }},
      {"escape", [](const Value& v, CallArgs&) { return Value(html_escape(v.str())); }},
      {"first", [](const Value& v, CallArgs&) { return f_first_last(v, true); }},
      {"float", f_float},
      {"format",
       [](const Value& v, CallArgs& a) { return Value(printf_format(v.str(), a.positional)); }},
      {"indent", f_indent},
      {"int", f_int},
      {"items", f_items},
      {"join", f_join},
      {"last", [](const Value& v, CallArgs&) { return f_first_last(v, false); }},
      {"length", f_length},
      {"list", [](const Value& v, CallArgs&) { return Value::list(iterate(v)); }},
      {"lower", [](const Value& v, CallArgs&) { return Value(ascii_lower(v.str())); }},
      {"map", f_map},
      {"max", [](const Value& v, CallArgs& a) { return f_min_max(v, a, true); }},
      {"min", [](const Value& v, CallArgs& a) { return f_min_max(v, a, false); }},
      {"reject", [](const Value& v, CallArgs& a) { return select_items(v, a, false, false); }},
      {"rejectattr", [](const Value& v, CallArgs& a) { return select_items(v, a, true, false); }},
      {"replace", f_replace},
      {"reverse",
       [](const Value& v, CallArgs&) {
         const Value step(static_cast<int64_t>(-1));
         if (v.is_string()) return get_slice(v, nullptr, nullptr, &step);
         ValueList items = iterate(v);
         std::reverse(items.begin(), items.end());
         return Value::list(std::move(items));
       }},
      {"round", f_round},
      {"safe", [](const Value& v, CallArgs&) { return v; }},
      {"select", [](const Value& v, CallArgs& a) { return select_items(v, a, false, true); }},
      {"selectattr", [](const Value& v, CallArgs& a) { return select_items(v, a, true, true); }},
      {"sort", f_sort},
      {"string", [](const Value& v, CallArgs&) { return Value(v.str()); }},
      {"sum", f_sum},
      {"title", f_title},
      {"tojson", f_tojson},
      {"trim",
       [](const Value& v, CallArgs& a) {
         return Value(py_strip(v.str(), a.get(0, "chars", Value::none()), true, true));
       }},
      {"unique", f_unique},
      {"upper", [](const Value& v, CallArgs&) { return Value(ascii_upper(v.str())); }},
      {"wordcount", f_wordcount},
  };
  return m;
}

bool compare_test(const Value& v, CallArgs& a, const char* op) {
  return binary_op(op, v, a.get(0, "other")).truthy();
}

const std::map<std::string, Test>& tests() {
  static const std::map<std::string, Test> m = {
      {"defined", [](const Value& v, CallArgs&) { return !v.is_undefined(); }},
      {"undefined", [](const Value& v, CallArgs&) { return v.is_undefined(); }},
      {"none", [](const Value& v, CallArgs&) { return v.is_none(); }},
      {"boolean", [](const Value& v, CallArgs&) { return v.is_bool(); }},
      {"true", [](const Value& v, CallArgs&) { return v.is_bool() && v.as_bool(); }},
      {"false", [](const Value& v, CallArgs&) { return v.is_bool() && !v.as_bool(); }},
      {"integer", [](const Value& v, CallArgs&) { return v.is_int(); }},
      {"float", [](const Value& v, CallArgs&) { return v.is_float(); }},
      {"number", [](const Value& v, CallArgs&) { return v.is_number(); }},
      {"string", [](const Value& v, CallArgs&) { return v.is_string(); }},
      {"mapping", [](const Value& v, CallArgs&) { return v.is_dict(); }},
      {"iterable",
       [](const Value& v, CallArgs&) {
         return v.is_list() || v.is_dict() || v.is_string() || v.is_undefined();
       }},
      {"sequence",
       [](const Value& v, CallArgs&) {
         return v.is_list() || v.is_dict() || v.is_string() || v.is_undefined();
       }},
      {"callable", [](const Value& v, CallArgs&) { return v.is_callable(); }},
      {"sameas",
       [](const Value& v, CallArgs& a) {
         const Value o = a.get(0, "other");
         return v.kind() == o.kind() && (v.is_none() || v.is_undefined() || v.equals(o)) &&
                !(v.is_list() || v.is_dict());
       }},
      {"escaped", [](const Value&, CallArgs&) { return false; }},
      {"in",
       [](const Value& v, CallArgs& a) { return binary_op("in", v, a.get(0, "seq")).truthy(); }},
      {"divisibleby",
       [](const Value& v, CallArgs& a) {
         return binary_op("%", v, a.get(0, "num")).as_double() == 0.0;
       }},
      {"even", [](const Value& v,
                  CallArgs&) { return v.is_number() && !v.is_float() && v.as_int() % 2 == 0; }},
      {"odd", [](const Value& v,
                 CallArgs&) { return v.is_number() && !v.is_float() && v.as_int() % 2 != 0; }},
      {"eq", [](const Value& v, CallArgs& a) { return compare_test(v, a, "=="); }},
      {"equalto", [](const Value& v, CallArgs& a) { return compare_test(v, a, "=="); }},
      {"==", [](const Value& v, CallArgs& a) { return compare_test(v, a, "=="); }},
      {"ne", [](const Value& v, CallArgs& a) { return compare_test(v, a, "!="); }},
      {"!=", [](const Value& v, CallArgs& a) { return compare_test(v, a, "!="); }},
      {"lt", [](const Value& v, CallArgs& a) { return compare_test(v, a, "<"); }},
      {"lessthan", [](const Value& v, CallArgs& a) { return compare_test(v, a, "<"); }},
      {"<", [](const Value& v, CallArgs& a) { return compare_test(v, a, "<"); }},
      {"le", [](const Value& v, CallArgs& a) { return compare_test(v, a, "<="); }},
      {"<=", [](const Value& v, CallArgs& a) { return compare_test(v, a, "<="); }},
      {"gt", [](const Value& v, CallArgs& a) { return compare_test(v, a, ">"); }},
      {"greaterthan", [](const Value& v, CallArgs& a) { return compare_test(v, a, ">"); }},
      {">", [](const Value& v, CallArgs& a) { return compare_test(v, a, ">"); }},
      {"ge", [](const Value& v, CallArgs& a) { return compare_test(v, a, ">="); }},
      {">=", [](const Value& v, CallArgs& a) { return compare_test(v, a, ">="); }},
      {"lower",
       [](const Value& v, CallArgs&) {
         return v.is_string() && ascii_lower(v.as_string()) == v.as_string();
       }},
      {"upper",
       [](const Value& v, CallArgs&) {
         return v.is_string() && ascii_upper(v.as_string()) == v.as_string();
       }},
      {"filter",
       [](const Value& v, CallArgs&) { return v.is_string() && is_filter(v.as_string()); }},
      {"test", [](const Value& v, CallArgs&) { return v.is_string() && is_test(v.as_string()); }},
  };
  return m;
}

}  // namespace

bool is_filter(const std::string& name) { return filters().count(name) > 0; }
bool is_test(const std::string& name) { return tests().count(name) > 0; }

Value apply_filter(const std::string& name, const Value& input, CallArgs& args) {
  auto it = filters().find(name);
  if (it == filters().end()) type_error("unknown filter '" + name + "'");
  return it->second(input, args);
}

bool apply_test(const std::string& name, const Value& input, CallArgs& args) {
  auto it = tests().find(name);
  if (it == tests().end()) type_error("unknown test '" + name + "'");
  return it->second(input, args);
}

}  // namespace crl::text::jinja
