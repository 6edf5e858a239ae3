#include "text/jinja/parser.h"

#include <algorithm>
#include <initializer_list>
#include <string>

#include "text/jinja/builtins.h"
#include "text/jinja/error.h"
#include "text/jinja/limits.h"

namespace crl::text::jinja {

namespace {

using T = Token::Type;

ExprPtr make(Expr::Kind kind, int line) {
  auto e = std::make_unique<Expr>();
  e->kind = kind;
  e->line = line;
  return e;
}

class Parser {
 public:
  Parser(const std::vector<Token>& tokens, const std::string& name) : toks_(tokens), name_(name) {}

  NodeList parse_all() {
    NodeList out;
    std::string end = parse_body(out, {});
    (void)end;
    return out;
  }

 private:
  // ---- token helpers
  const Token& cur() const { return toks_[pos_]; }
  const Token& peek(size_t ahead = 1) const {
    return toks_[std::min(pos_ + ahead, toks_.size() - 1)];
  }
  void advance() {
    if (pos_ + 1 < toks_.size()) ++pos_;
  }
  bool is_op(const char* op) const { return cur().type == T::kOp && cur().text == op; }
  bool is_name(const char* n) const { return cur().type == T::kName && cur().text == n; }
  bool skip_op(const char* op) {
    if (!is_op(op)) return false;
    advance();
    return true;
  }
  bool skip_name(const char* n) {
    if (!is_name(n)) return false;
    advance();
    return true;
  }
  [[noreturn]] void fail(const std::string& message,
                         TemplateError::Kind kind = TemplateError::Kind::kSyntax) const {
    throw TemplateError(kind, message, name_, cur().line);
  }
  std::string describe(const Token& t) const {
    switch (t.type) {
      case T::kEof:
        return "end of template";
      case T::kBlockEnd:
        return "'%}'";
      case T::kVarEnd:
        return "'}}'";
      case T::kString:
        return "string";
      case T::kInt:
      case T::kFloat:
        return "number " + t.text;
      default:
        return "'" + t.text + "'";
    }
  }
  void expect_op(const char* op) {
    if (!skip_op(op)) fail(std::string("expected '") + op + "', got " + describe(cur()));
  }
  std::string expect_name(const char* what) {
    if (cur().type != T::kName) fail(std::string("expected ") + what + ", got " + describe(cur()));
    std::string n = cur().text;
    advance();
    return n;
  }
  void expect_block_end(const std::string& tag) {
    if (cur().type != T::kBlockEnd)
      fail("expected the end of the '" + tag + "' tag, got " + describe(cur()));
    advance();
  }

  // ---- statements

  // Parses nodes until a block tag named in `ends` (consumed up to its name); returns that name.
  std::string parse_body(NodeList& out, std::initializer_list<const char*> ends) {
    while (true) {
      const Token& t = cur();
      if (t.type == T::kEof) {
        if (ends.size() == 0) return "";
        std::string names;
        for (const char* e : ends) names += (names.empty() ? "'" : " or '") + std::string(e) + "'";
        fail("unexpected end of template: expected " + names + " to close a block");
      }
      if (t.type == T::kText) {
        auto n = std::make_unique<Node>();
        n->kind = Node::Kind::kText;
        n->line = t.line;
        n->text = t.text;
        out.push_back(std::move(n));
        advance();
      } else if (t.type == T::kVarBegin) {
        auto n = std::make_unique<Node>();
        n->kind = Node::Kind::kOutput;
        n->line = t.line;
        advance();
        n->expr = parse_tuple(true);
        if (cur().type != T::kVarEnd) fail("expected '}}', got " + describe(cur()));
        advance();
        out.push_back(std::move(n));
      } else if (t.type == T::kBlockBegin) {
        advance();
        const std::string tag = expect_name("a tag name");
        for (const char* e : ends) {
          if (tag == e) return tag;
        }
        out.push_back(parse_statement(tag));
      } else {
        fail("unexpected " + describe(t));
      }
    }
  }

  NodePtr parse_statement(const std::string& tag) {
    const Nest nest(*this);
    auto n = std::make_unique<Node>();
    n->line = toks_[pos_ - 1].line;
    if (tag == "if") {
      n->kind = Node::Kind::kIf;
      ExprPtr cond = parse_tuple(false);
      expect_block_end("if");
      while (true) {
        NodeList body;
        const std::string end = parse_body(body, {"elif", "else", "endif"});
        n->branches.emplace_back(std::move(cond), std::move(body));
        if (end == "elif") {
          cond = parse_tuple(false);
          expect_block_end("elif");
          continue;
        }
        if (end == "else") {
          expect_block_end("else");
          parse_body(n->else_body, {"endif"});
        }
        expect_block_end("endif");
        break;
      }
    } else if (tag == "for") {
      n->kind = Node::Kind::kFor;
      parse_targets(n->targets, "for");
      if (!skip_name("in")) fail("expected 'in' in the 'for' tag, got " + describe(cur()));
      n->expr = parse_tuple(false);
      if (skip_name("if")) n->filter = parse_expression(true);
      if (is_name("recursive"))
        fail("'for ... recursive' loops are not supported", TemplateError::Kind::kUnsupported);
      expect_block_end("for");
      const std::string end = parse_body(n->body, {"else", "endfor"});
      if (end == "else") {
        expect_block_end("else");
        parse_body(n->else_body, {"endfor"});
      }
      expect_block_end("endfor");
    } else if (tag == "set") {
      parse_targets(n->targets, "set");
      if (n->targets.size() == 1 && skip_op(".")) n->attribute = expect_name("an attribute name");
      if (skip_op("=")) {
        n->kind = Node::Kind::kSet;
        n->expr = parse_tuple(true);
        expect_block_end("set");
      } else {
        if (n->targets.size() != 1 || !n->attribute.empty())
          fail("a block '{% set %}' takes one name");
        if (is_op("|"))
          fail("filters on a block '{% set %}' are not supported",
               TemplateError::Kind::kUnsupported);
        n->kind = Node::Kind::kSetBlock;
        expect_block_end("set");
        parse_body(n->body, {"endset"});
        expect_block_end("endset");
      }
    } else if (tag == "macro") {
      n->kind = Node::Kind::kMacro;
      n->text = expect_name("a macro name");
      expect_op("(");
      while (!is_op(")")) {
        std::string param = expect_name("a parameter name");
        ExprPtr def;
        if (skip_op("=")) def = parse_expression(true);
        n->params.emplace_back(std::move(param), std::move(def));
        if (!skip_op(",")) break;
      }
      expect_op(")");
      expect_block_end("macro");
      parse_body(n->body, {"endmacro"});
      if (cur().type == T::kName) advance();  // {% endmacro name %}
      expect_block_end("endmacro");
    } else if (tag == "break" || tag == "continue") {
      n->kind = tag == "break" ? Node::Kind::kBreak : Node::Kind::kContinue;
      expect_block_end(tag);
    } else if (tag == "generation") {
      n->kind = Node::Kind::kGeneration;
      expect_block_end(tag);
      parse_body(n->body, {"endgeneration"});
      expect_block_end("endgeneration");
    } else if (tag == "filter") {
      n->kind = Node::Kind::kFilterBlock;
      auto placeholder = make(Expr::Kind::kName, n->line);
      placeholder->name = " filter body";
      n->expr = parse_filter_chain(std::move(placeholder), false);
      expect_block_end(tag);
      parse_body(n->body, {"endfilter"});
      expect_block_end("endfilter");
    } else if (tag == "with") {
      n->kind = Node::Kind::kWith;
      while (cur().type != T::kBlockEnd) {
        std::string name = expect_name("a name");
        expect_op("=");
        n->params.emplace_back(std::move(name), parse_expression(true));
        if (!skip_op(",")) break;
      }
      expect_block_end(tag);
      parse_body(n->body, {"endwith"});
      expect_block_end("endwith");
    } else {
      static const char* kUnsupported[] = {"include", "import",     "from", "extends", "block",
                                           "call",    "autoescape", "do",   "trans",   "pluralize"};
      for (const char* u : kUnsupported) {
        if (tag == u) {
          pos_ -= 1;
          fail("unsupported tag '" + tag +
                   "' (chat templates may use if/elif/else, for, set, macro, "
                   "break/continue, filter, with, raw, generation)",
               TemplateError::Kind::kUnsupported);
        }
      }
      pos_ -= 1;
      fail("unknown tag '" + tag + "'");
    }
    return n;
  }

  void parse_targets(std::vector<std::string>& targets, const char* tag) {
    const bool paren = skip_op("(");
    do {
      targets.push_back(expect_name((std::string("a name in the '") + tag + "' tag").c_str()));
    } while (skip_op(","));
    if (paren) expect_op(")");
  }

  // ---- expressions

  ExprPtr parse_tuple(bool with_condexpr) {
    const int line = cur().line;
    ExprPtr first = parse_expression(with_condexpr);
    if (!is_op(",")) return first;
    auto tuple = make(Expr::Kind::kTuple, line);
    tuple->args.push_back(std::move(first));
    while (skip_op(",")) {
      if (cur().type == T::kBlockEnd || cur().type == T::kVarEnd) break;
      tuple->args.push_back(parse_expression(with_condexpr));
    }
    return tuple;
  }

  ExprPtr parse_expression(bool with_condexpr) {
    const Nest nest(*this);
    ExprPtr expr = parse_or();
    if (!with_condexpr) return expr;
    while (is_name("if")) {
      const int line = cur().line;
      advance();
      auto cond = make(Expr::Kind::kCondition, line);
      cond->args.push_back(std::move(expr));
      cond->args.push_back(parse_or());
      cond->args.push_back(skip_name("else") ? parse_expression(true) : nullptr);
      expr = std::move(cond);
    }
    return expr;
  }

  ExprPtr binary(Expr::Kind kind, const std::string& op, ExprPtr a, ExprPtr b, int line) {
    auto e = make(kind, line);
    e->name = op;
    e->args.push_back(std::move(a));
    e->args.push_back(std::move(b));
    return e;
  }

  ExprPtr parse_or() {
    ExprPtr left = parse_and();
    while (is_name("or")) {
      const int line = cur().line;
      advance();
      left = binary(Expr::Kind::kOr, "or", std::move(left), parse_and(), line);
    }
    return left;
  }

  ExprPtr parse_and() {
    ExprPtr left = parse_not();
    while (is_name("and")) {
      const int line = cur().line;
      advance();
      left = binary(Expr::Kind::kAnd, "and", std::move(left), parse_not(), line);
    }
    return left;
  }

  ExprPtr parse_not() {
    if (is_name("not")) {
      const Nest nest(*this);
      auto e = make(Expr::Kind::kUnary, cur().line);
      advance();
      e->name = "not";
      e->args.push_back(parse_not());
      return e;
    }
    return parse_compare();
  }

  ExprPtr parse_compare() {
    ExprPtr left = parse_math1();
    ExprPtr result;
    while (true) {
      const int line = cur().line;
      std::string op;
      if (cur().type == T::kOp && (cur().text == "==" || cur().text == "!=" || cur().text == "<" ||
                                   cur().text == "<=" || cur().text == ">" || cur().text == ">=")) {
        op = cur().text;
        advance();
      } else if (is_name("in")) {
        op = "in";
        advance();
      } else if (is_name("not") && peek().type == T::kName && peek().text == "in") {
        op = "not in";
        advance();
        advance();
      } else {
        break;
      }
      ExprPtr right = parse_math1();
      // a < b < c is (a < b) and (b < c); b is evaluated twice (expressions have no side effects).
      if (!result) {
        result = binary(Expr::Kind::kBinary, op, std::move(left), std::move(right), line);
      } else {
        ExprPtr prev_right =
            clone(result->kind == Expr::Kind::kAnd ? *result->args[1]->args[1] : *result->args[1]);
        result = binary(
            Expr::Kind::kAnd, "and", std::move(result),
            binary(Expr::Kind::kBinary, op, std::move(prev_right), std::move(right), line), line);
      }
    }
    return result ? std::move(result) : std::move(left);
  }

  static ExprPtr clone(const Expr& e) {
    auto c = std::make_unique<Expr>();
    c->kind = e.kind;
    c->line = e.line;
    c->value = e.value;
    c->name = e.name;
    c->negated = e.negated;
    for (const auto& a : e.args) c->args.push_back(a ? clone(*a) : nullptr);
    for (const auto& kv : e.kwargs) c->kwargs.emplace_back(kv.first, clone(*kv.second));
    return c;
  }

  // A left-associative level: operands from `next`, joined by any of `ops`.
  ExprPtr parse_level(std::initializer_list<const char*> ops, ExprPtr (Parser::*next)()) {
    ExprPtr left = (this->*next)();
    while (true) {
      const char* op = nullptr;
      for (const char* o : ops) {
        if (is_op(o)) op = o;
      }
      if (!op) return left;
      const int line = cur().line;
      advance();
      left = binary(Expr::Kind::kBinary, op, std::move(left), (this->*next)(), line);
    }
  }

  // Jinja's precedence, loosest first: + -, then ~, then * / // %, then **.
  ExprPtr parse_math1() { return parse_level({"+", "-"}, &Parser::parse_concat); }
  ExprPtr parse_concat() { return parse_level({"~"}, &Parser::parse_math2); }
  ExprPtr parse_math2() { return parse_level({"*", "/", "//", "%"}, &Parser::parse_pow); }
  ExprPtr parse_pow() { return parse_level({"**"}, &Parser::parse_operand); }
  ExprPtr parse_operand() { return parse_unary(true); }

  ExprPtr parse_unary(bool with_filter) {
    ExprPtr node;
    if (is_op("-") || is_op("+")) {
      const Nest nest(*this);
      node = make(Expr::Kind::kUnary, cur().line);
      node->name = cur().text;
      advance();
      node->args.push_back(parse_unary(false));
    } else {
      node = parse_primary();
    }
    node = parse_postfix(std::move(node));
    if (with_filter) node = parse_filter_chain(std::move(node), true);
    return node;
  }

  ExprPtr parse_primary() {
    const Token& t = cur();
    const int line = t.line;
    if (t.type == T::kName) {
      auto e = make(Expr::Kind::kLiteral, line);
      if (t.text == "true" || t.text == "True") {
        e->value = Value(true);
      } else if (t.text == "false" || t.text == "False") {
        e->value = Value(false);
      } else if (t.text == "none" || t.text == "None") {
        e->value = Value::none();
      } else {
        e->kind = Expr::Kind::kName;
        e->name = t.text;
      }
      advance();
      return e;
    }
    if (t.type == T::kString) {
      std::string s;
      while (cur().type == T::kString) {  // adjacent literals concatenate
        s += cur().text;
        advance();
      }
      auto e = make(Expr::Kind::kLiteral, line);
      e->value = Value(std::move(s));
      return e;
    }
    if (t.type == T::kInt || t.type == T::kFloat) {
      auto e = make(Expr::Kind::kLiteral, line);
      e->value = t.type == T::kInt ? Value(t.int_value) : Value(t.float_value);
      advance();
      return e;
    }
    if (skip_op("(")) {
      if (skip_op(")")) return make(Expr::Kind::kTuple, line);
      ExprPtr inner = parse_tuple(true);
      expect_op(")");
      return inner;
    }
    if (skip_op("[")) {
      auto e = make(Expr::Kind::kList, line);
      while (!is_op("]")) {
        e->args.push_back(parse_expression(true));
        if (!skip_op(",")) break;
      }
      expect_op("]");
      return e;
    }
    if (skip_op("{")) {
      auto e = make(Expr::Kind::kDict, line);
      while (!is_op("}")) {
        e->args.push_back(parse_expression(true));
        expect_op(":");
        e->args.push_back(parse_expression(true));
        if (!skip_op(",")) break;
      }
      expect_op("}");
      return e;
    }
    fail("unexpected " + describe(t) + " in an expression");
  }

  ExprPtr parse_postfix(ExprPtr node) {
    while (true) {
      const int line = cur().line;
      if (skip_op(".")) {
        if (cur().type == T::kInt) {
          auto e = make(Expr::Kind::kItem, line);
          auto idx = make(Expr::Kind::kLiteral, line);
          idx->value = Value(cur().int_value);
          advance();
          e->args.push_back(std::move(node));
          e->args.push_back(std::move(idx));
          node = std::move(e);
        } else {
          auto e = make(Expr::Kind::kAttr, line);
          e->name = expect_name("an attribute name after '.'");
          e->args.push_back(std::move(node));
          node = std::move(e);
        }
      } else if (skip_op("[")) {
        node = parse_subscript(std::move(node), line);
      } else if (is_op("(")) {
        node = parse_call(std::move(node));
      } else {
        return node;
      }
    }
  }

  ExprPtr parse_subscript(ExprPtr target, int line) {
    ExprPtr start;
    if (!is_op(":")) start = parse_expression(true);
    if (skip_op("]")) {
      auto e = make(Expr::Kind::kItem, line);
      e->args.push_back(std::move(target));
      e->args.push_back(std::move(start));
      return e;
    }
    expect_op(":");
    auto e = make(Expr::Kind::kSlice, line);
    e->args.push_back(std::move(target));
    e->args.push_back(std::move(start));
    e->args.push_back(is_op(":") || is_op("]") ? nullptr : parse_expression(true));
    if (skip_op(":")) {
      e->args.push_back(is_op("]") ? nullptr : parse_expression(true));
    } else {
      e->args.push_back(nullptr);
    }
    expect_op("]");
    return e;
  }

  // Call arguments into e->args (after any already there) and e->kwargs.
  void parse_call_args(Expr& e) {
    expect_op("(");
    while (!is_op(")")) {
      if (is_op("*") || is_op("**"))
        fail("*args and **kwargs in calls are not supported", TemplateError::Kind::kUnsupported);
      if (cur().type == T::kName && peek().type == T::kOp && peek().text == "=") {
        std::string key = cur().text;
        advance();
        advance();
        e.kwargs.emplace_back(std::move(key), parse_expression(true));
      } else {
        if (!e.kwargs.empty()) fail("a positional argument follows a keyword argument");
        e.args.push_back(parse_expression(true));
      }
      if (!skip_op(",")) break;
    }
    expect_op(")");
  }

  ExprPtr parse_call(ExprPtr callee) {
    auto e = make(Expr::Kind::kCall, cur().line);
    e->args.push_back(std::move(callee));
    parse_call_args(*e);
    return e;
  }

  ExprPtr parse_filter_chain(ExprPtr node, bool allow_tests) {
    while (true) {
      const int line = cur().line;
      if (skip_op("|")) {
        auto e = make(Expr::Kind::kFilter, line);
        e->name = expect_name("a filter name after '|'");
        if (!is_filter(e->name)) {
          pos_ -= 1;
          fail("unknown filter '" + e->name + "'");
        }
        e->args.push_back(std::move(node));
        if (is_op("(")) parse_call_args(*e);
        node = std::move(e);
      } else if (allow_tests && is_name("is")) {
        advance();
        auto e = make(Expr::Kind::kTest, line);
        e->negated = skip_name("not");
        e->name = expect_name("a test name after 'is'");
        if (!is_test(e->name)) {
          pos_ -= 1;
          fail("unknown test '" + e->name + "'");
        }
        e->args.push_back(std::move(node));
        if (is_op("(")) {
          parse_call_args(*e);
        } else if ((cur().type == T::kName || cur().type == T::kString || cur().type == T::kInt ||
                    cur().type == T::kFloat || is_op("[") || is_op("{")) &&
                   !is_name("else") && !is_name("or") && !is_name("and")) {
          if (is_name("is")) fail("tests cannot be chained with 'is'");
          e->args.push_back(parse_postfix(parse_primary()));
        }
        node = std::move(e);
      } else if (is_op("(")) {
        node = parse_call(std::move(node));
      } else {
        return node;
      }
    }
  }

  // Nesting (parentheses, unary operators, blocks) past kMaxTemplateNesting is a syntax error: the
  // parser, the interpreter and the tree's destructor all recurse once a level, so a template of
  // 10,000 nested parentheses would otherwise end the process with a stack overflow.
  struct Nest {
    explicit Nest(Parser& p) : p(p) {
      if (++p.depth_ > kMaxTemplateNesting) {
        p.fail("nesting deeper than " + std::to_string(kMaxTemplateNesting) +
               " levels (parentheses, operators or blocks)");
      }
    }
    ~Nest() { --p.depth_; }
    Nest(const Nest&) = delete;
    Nest& operator=(const Nest&) = delete;
    Parser& p;
  };

  const std::vector<Token>& toks_;
  std::string name_;
  size_t pos_ = 0;
  int depth_ = 0;
};

}  // namespace

NodeList parse_template(const std::vector<Token>& tokens, const std::string& template_name) {
  return Parser(tokens, template_name).parse_all();
}

}  // namespace crl::text::jinja
