#include "text/jinja/template.h"

#include <algorithm>
#include <functional>

#include "text/jinja/ast.h"
#include "text/jinja/interpreter.h"
#include "text/jinja/lexer.h"
#include "text/jinja/parser.h"

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
  t.iterates_message_content_ = t.detect_message_content_loop();
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

namespace {

// Every statement of the tree, depth first.
void walk(const NodeList& nodes, const std::function<void(const Node&)>& visit) {
  for (const NodePtr& n : nodes) {
    visit(*n);
    walk(n->body, visit);
    walk(n->else_body, visit);
    for (const auto& branch : n->branches) walk(branch.second, visit);
  }
}

// `name`, or `name[key]` / `name.key` when `key` is given, under filters, tests and slices.
bool is_var_or_elems_access(const Expr* e, const std::string& name, const std::string* key) {
  if (!e) return false;
  switch (e->kind) {
    case Expr::Kind::kFilter:
    case Expr::Kind::kTest:
    case Expr::Kind::kSlice:
      return !e->args.empty() && is_var_or_elems_access(e->args[0].get(), name, key);
    default:
      break;
  }
  auto is_name = [&](const Expr* x) {
    return x && x->kind == Expr::Kind::kName && x->name == name;
  };
  if (!key) return is_name(e);
  if (e->kind == Expr::Kind::kAttr) return is_name(e->args[0].get()) && e->name == *key;
  if (e->kind == Expr::Kind::kItem) {
    const Expr* index = e->args.size() > 1 ? e->args[1].get() : nullptr;
    return is_name(e->args[0].get()) && index && index->kind == Expr::Kind::kLiteral &&
           index->value.is_string() && index->value.as_string() == *key;
  }
  return false;
}

struct Untraceable {};  // a target that is not one name: vLLM's walk gives up

}  // namespace

bool Template::iterates_message_content() const { return iterates_message_content_; }

bool Template::detect_message_content_loop() const {
  try {
    // "messages" and, breadth first, every name set from it (or from one of those).
    std::vector<std::string> messages_names = {"messages"};
    for (size_t i = 0; i < messages_names.size(); ++i) {
      const std::string related = messages_names[i];
      walk(*nodes_, [&](const Node& n) {
        if (n.kind != Node::Kind::kSet) return;
        if (!is_var_or_elems_access(n.expr.get(), related, nullptr)) return;
        if (!n.attribute.empty() || n.targets.size() != 1) throw Untraceable{};
        if (std::find(messages_names.begin(), messages_names.end(), n.targets[0]) ==
            messages_names.end()) {
          messages_names.push_back(n.targets[0]);
        }
      });
    }
    // The targets of loops over those: the messages.
    std::vector<std::string> message_names;
    walk(*nodes_, [&](const Node& n) {
      if (n.kind != Node::Kind::kFor) return;
      for (const std::string& m : messages_names) {
        if (!is_var_or_elems_access(n.expr.get(), m, nullptr)) continue;
        if (n.targets.size() != 1) throw Untraceable{};
        message_names.push_back(n.targets[0]);
        break;
      }
    });
    // A loop over a message's content.
    const std::string content = "content";
    bool found = false;
    walk(*nodes_, [&](const Node& n) {
      if (found || n.kind != Node::Kind::kFor) return;
      for (const std::string& m : message_names) {
        if (is_var_or_elems_access(n.expr.get(), m, &content)) {
          if (n.targets.size() != 1) throw Untraceable{};
          found = true;
          return;
        }
      }
    });
    return found;
  } catch (const Untraceable&) {
    return false;
  }
}

}  // namespace crl::text::jinja
