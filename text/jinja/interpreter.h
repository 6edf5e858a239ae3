// Interpreter: renders a parsed template (a NodeList) against a context.
//
// Scoping follows Jinja2: `set` binds in the innermost scope; each for-loop iteration and each
// macro call opens a scope, so a `set` inside a loop does not leak out (namespace() objects are
// the way out, as in Jinja2); if/elif/else do not open one. Macros see the template's top-level
// names and their own parameters.
#pragma once

#include <ctime>
#include <functional>
#include <string>

#include "text/jinja/ast.h"
#include "text/jinja/value.h"

namespace crl::text::jinja {

struct RenderContext {
  // The template's name, for error messages.
  std::string template_name;
  // The clock strftime_now() reads.
  std::function<std::time_t()> now;
};

// Renders `nodes` with the variables of `context` (a dict). Throws TemplateError with the line.
std::string render_nodes(const NodeList& nodes, const Value& context, const RenderContext& options);

}  // namespace crl::text::jinja
