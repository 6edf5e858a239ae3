// Template: the public face of the Jinja2 interpreter used for Hugging Face chat templates.
//
//   auto t = crl::text::jinja::Template::parse(source, "tokenizer_config.json");
//   std::string prompt = t.render(context);   // context: a JSON object of variables
//
// The dialect is Jinja2 as transformers configures it for chat templates: trim_blocks and
// lstrip_blocks on, no autoescape, the loopcontrols extension (break/continue), the
// {% generation %} tag, a `tojson` filter that is json.dumps(ensure_ascii=False, indent=...),
// and the globals raise_exception(msg) and strftime_now(fmt). Supported: if/elif/else,
// for/else with `if` filters and tuple unpacking, loop.index/index0/revindex/first/last/length/
// previtem/nextitem/cycle, set (names, tuples, namespace attributes, blocks), macro with
// defaults, filter and with blocks, raw, comments, whitespace control, namespace(), range(),
// dict(), the usual filters and tests, and Python's str/dict/list methods that templates call.
// Not supported (errors naming the line and construct): include/import/extends/block/call,
// recursive loops, *args in calls, str.format specs, tojson(separators=, ensure_ascii=True).
// Known differences: upper/lower/title/capitalize change ASCII letters only; integers are 64-bit
// (overflow is an error, not a bignum).
//
// Thread safety: a parsed Template is immutable; render() may run on many threads at once.
#pragma once

#include <ctime>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>

#include "text/jinja/error.h"
#include "text/jinja/value.h"

namespace crl::text::jinja {

struct Node;

struct TemplateOptions {
  // Drop the first newline after a block tag (transformers: on).
  bool trim_blocks = true;
  // Strip spaces and tabs before a block tag at the start of a line (transformers: on).
  bool lstrip_blocks = true;
};

struct RenderOptions {
  // The time strftime_now() formats; unset: the current time.
  std::optional<std::time_t> now;
};

class Template {
 public:
  // Parses `source`; `name` is used in error messages. Throws TemplateError (kSyntax or
  // kUnsupported) naming the line and the construct.
  static Template parse(const std::string& source, const std::string& name = "template",
                        const TemplateOptions& options = {});

  // Renders with the variables of `context` (a dict Value or a JSON object). Throws
  // TemplateError naming the line: kRaised for the template's raise_exception(), kUndefined /
  // kRuntime for misuse of values.
  std::string render(const Value& context, const RenderOptions& options = {}) const;
  std::string render(const nlohmann::ordered_json& context,
                     const RenderOptions& options = {}) const;

  // True when the template loops over a message's content ({% for part in message['content'] %}
  // where `message` runs over `messages` or a variable set from it): it takes content as a list
  // of parts, as OpenAI sends it. vLLM's "auto" content format, from the same syntax-tree walk
  // (vllm/entrypoints/chat_utils.py: _detect_content_format): where that walk meets a target it
  // cannot follow (tuple unpacking of messages), the answer is false, as vLLM's.
  bool iterates_message_content() const;

  const std::string& name() const { return name_; }
  const std::string& source() const { return source_; }

 private:
  Template() = default;
  bool detect_message_content_loop() const;
  std::string name_;
  std::string source_;
  std::shared_ptr<const std::vector<std::unique_ptr<Node>>> nodes_;
  bool iterates_message_content_ = false;
};

}  // namespace crl::text::jinja
