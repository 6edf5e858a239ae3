// Parser: tokens -> syntax tree. Checks at parse time what Jinja2 checks at compile time:
// unknown tags, filters and tests are errors naming the line and the construct.
#pragma once

#include <string>
#include <vector>

#include "text/jinja/ast.h"
#include "text/jinja/lexer.h"

namespace crl::text::jinja {

// Throws TemplateError (kSyntax or kUnsupported) with the template name and line.
NodeList parse_template(const std::vector<Token>& tokens, const std::string& template_name);

}  // namespace crl::text::jinja
