#include "engine/text/jinja/template.h"

#include "engine/text/jinja/interpreter.h"
#include "engine/text/jinja/lexer.h"
#include "engine/text/jinja/parser.h"

namespace crl::text::jinja {

Template Template::parse(const std::string& source, const std::string& name,
                         const TemplateOptions& options) {
  LexerOptions lex;
  lex.trim_blocks = options.trim_blocks;
  lex.lstrip_blocks = options.lstrip_blocks;
  Template t;
  t.name_ = name;
  t.source_ = source;
  t.nodes_ = std::make_shared<const NodeList>(parse_template(tokenize(source, lex, name), name));
  return t;
}

std::string Template::render(const Value& context, const RenderOptions& options) const {
  RenderContext rc;
  rc.template_name = name_;
  const std::optional<std::time_t> fixed = options.now;
  rc.now = [fixed] { return fixed ? *fixed : std::time(nullptr); };
  return render_nodes(*nodes_, context, rc);
}

std::string Template::render(const nlohmann::ordered_json& context,
                             const RenderOptions& options) const {
  return render(Value::from_json(context), options);
}

}  // namespace crl::text::jinja
