#include "text/jinja/interpreter.h"

#include <cstdint>
#include <memory>
#include <unordered_map>
#include <vector>

#include "text/jinja/builtins.h"
#include "text/jinja/error.h"
#include "text/jinja/limits.h"

namespace crl::text::jinja {

namespace {

using Scope = std::unordered_map<std::string, Value>;

enum class Flow { kNormal, kBreak, kContinue };

class Interpreter {
 public:
  Interpreter(const Value& context, const RenderContext& options) : options_(options) {
    root_ = std::make_shared<Scope>(make_globals(options.now));
    if (context.is_mapping()) {
      for (const auto& kv : context.as_items()) (*root_)[kv.first.str()] = kv.second;
    }
    scopes_.push_back(root_);
  }

  std::string run(const NodeList& nodes) {
    std::string out;
    exec_list(nodes, out);
    return out;
  }

 private:
  [[noreturn]] void rethrow_located(const TemplateError& e, int line) const {
    throw e.located(options_.template_name, line);
  }

  // ---- scopes

  Value lookup(const std::string& name) const {
    for (auto it = scopes_.rbegin(); it != scopes_.rend(); ++it) {
      auto f = (*it)->find(name);
      if (f != (*it)->end()) return f->second;
    }
    return Value::undefined("'" + name + "' is undefined");
  }

  void assign(const std::string& name, Value v) { (*scopes_.back())[name] = std::move(v); }

  struct ScopeGuard {
    ScopeGuard(std::vector<std::shared_ptr<Scope>>& s, std::shared_ptr<Scope> scope) : scopes(s) {
      scopes.push_back(std::move(scope));
    }
    ~ScopeGuard() { scopes.pop_back(); }
    std::vector<std::shared_ptr<Scope>>& scopes;
  };

  void bind_targets(const std::vector<std::string>& targets, const Value& v) {
    if (targets.size() == 1) {
      assign(targets[0], v);
      return;
    }
    const ValueList items = iterate(v);
    if (items.size() != targets.size()) {
      throw TemplateError(TemplateError::Kind::kRuntime,
                          "cannot unpack " + std::to_string(items.size()) + " values into " +
                              std::to_string(targets.size()) + " names");
    }
    for (size_t i = 0; i < targets.size(); ++i) assign(targets[i], items[i]);
  }

  // ---- statements

  Flow exec_list(const NodeList& nodes, std::string& out) {
    for (const auto& n : nodes) {
      const Flow f = exec(*n, out);
      if (f != Flow::kNormal) return f;
    }
    return Flow::kNormal;
  }

  Flow exec(const Node& n, std::string& out) {
    try {
      step();
      const Flow f = exec_node(n, out);
      check_string_bytes(out.size(), "the rendered text");
      return f;
    } catch (const TemplateError& e) {
      rethrow_located(e, n.line);
    }
  }

  // One statement or expression more: past kMaxRenderSteps the render fails (a loop of loops
  // over range(1000000) would otherwise keep a core busy for hours).
  // A loop iteration builds its `loop` object: it counts as this many steps.
  static constexpr int64_t kLoopIterationSteps = 16;
  void step(int64_t n = 1) {
    steps_ += n;
    if (steps_ > kMaxRenderSteps) {
      throw TemplateError(TemplateError::Kind::kRuntime, "the template ran past its budget of " +
                                                             std::to_string(kMaxRenderSteps) +
                                                             " evaluation steps");
    }
  }

  Flow exec_node(const Node& n, std::string& out) {
    switch (n.kind) {
      case Node::Kind::kText:
        out += n.text;
        return Flow::kNormal;
      case Node::Kind::kOutput:
        out += eval(*n.expr).str();
        return Flow::kNormal;
      case Node::Kind::kIf:
        for (const auto& branch : n.branches) {
          if (eval(*branch.first).truthy()) return exec_list(branch.second, out);
        }
        return exec_list(n.else_body, out);
      case Node::Kind::kFor:
        return exec_for(n, out);
      case Node::Kind::kSet: {
        Value v = eval(*n.expr);
        if (!n.attribute.empty()) {
          const Value target = lookup(n.targets[0]);
          if (!target.is_namespace()) {
            throw TemplateError(TemplateError::Kind::kRuntime,
                                "cannot assign attribute '" + n.attribute + "' on '" +
                                    n.targets[0] + "': only namespace() objects take attributes");
          }
          target.set_attribute(n.attribute, std::move(v));
        } else {
          bind_targets(n.targets, v);
        }
        return Flow::kNormal;
      }
      case Node::Kind::kSetBlock: {
        std::string body;
        exec_list(n.body, body);
        assign(n.targets[0], Value(std::move(body)));
        return Flow::kNormal;
      }
      case Node::Kind::kMacro:
        assign(n.text, make_macro(n));
        return Flow::kNormal;
      case Node::Kind::kBreak:
      case Node::Kind::kContinue:
        if (loop_depth_ == 0) {
          throw TemplateError(TemplateError::Kind::kSyntax,
                              std::string("'") +
                                  (n.kind == Node::Kind::kBreak ? "break" : "continue") +
                                  "' outside a for loop");
        }
        return n.kind == Node::Kind::kBreak ? Flow::kBreak : Flow::kContinue;
      case Node::Kind::kGeneration:
        return exec_list(n.body, out);
      case Node::Kind::kFilterBlock: {
        std::string body;
        exec_list(n.body, body);
        ScopeGuard guard(scopes_, std::make_shared<Scope>());
        assign(" filter body", Value(std::move(body)));
        out += eval(*n.expr).str();
        return Flow::kNormal;
      }
      case Node::Kind::kWith: {
        std::vector<Value> values;
        for (const auto& p : n.params) values.push_back(eval(*p.second));
        ScopeGuard guard(scopes_, std::make_shared<Scope>());
        for (size_t i = 0; i < values.size(); ++i) assign(n.params[i].first, values[i]);
        return exec_list(n.body, out);
      }
    }
    return Flow::kNormal;
  }

  Flow exec_for(const Node& n, std::string& out) {
    const Value iterable = eval(*n.expr);
    ValueList items = iterate(iterable);
    if (n.filter) {  // {% for x in xs if cond %}: filtered before loop.* is computed
      ValueList kept;
      for (const Value& item : items) {
        ScopeGuard guard(scopes_, std::make_shared<Scope>());
        bind_targets(n.targets, item);
        if (eval(*n.filter).truthy()) kept.push_back(item);
      }
      items = std::move(kept);
    }
    if (items.empty()) return exec_list(n.else_body, out);
    const int64_t length = static_cast<int64_t>(items.size());
    ++loop_depth_;
    struct DepthGuard {
      int& d;
      ~DepthGuard() { --d; }
    } depth_guard{loop_depth_};
    for (int64_t i = 0; i < length; ++i) {
      step(kLoopIterationSteps);
      ScopeGuard guard(scopes_, std::make_shared<Scope>());
      ValueItems loop = {
          {Value("index"), Value(i + 1)},
          {Value("index0"), Value(i)},
          {Value("revindex"), Value(length - i)},
          {Value("revindex0"), Value(length - i - 1)},
          {Value("first"), Value(i == 0)},
          {Value("last"), Value(i == length - 1)},
          {Value("length"), Value(length)},
          {Value("depth"), Value(static_cast<int64_t>(1))},
          {Value("depth0"), Value(static_cast<int64_t>(0))},
      };
      if (i > 0) loop.emplace_back(Value("previtem"), items[static_cast<size_t>(i - 1)]);
      if (i + 1 < length) loop.emplace_back(Value("nextitem"), items[static_cast<size_t>(i + 1)]);
      loop.emplace_back(Value("cycle"), Value::function("loop.cycle", [i](CallArgs& a) {
                          if (a.positional.empty()) {
                            throw TemplateError(TemplateError::Kind::kRuntime,
                                                "loop.cycle() needs at least one value");
                          }
                          return a.positional[static_cast<size_t>(i) % a.positional.size()];
                        }));
      assign("loop", Value::dict(std::move(loop)));
      bind_targets(n.targets, items[static_cast<size_t>(i)]);
      if (exec_list(n.body, out) == Flow::kBreak) break;
    }
    return Flow::kNormal;
  }

  Value make_macro(const Node& n) {
    const Node* node = &n;
    return Value::function(n.text, [this, node](CallArgs& args) {
      if (++call_depth_ > kMaxMacroDepth) {
        --call_depth_;
        throw TemplateError(TemplateError::Kind::kRuntime,
                            "macro '" + node->text + "' recursed too deeply");
      }
      struct Depth {
        int& d;
        ~Depth() { --d; }
      } depth{call_depth_};
      if (args.positional.size() > node->params.size()) {
        throw TemplateError(TemplateError::Kind::kRuntime,
                            "macro '" + node->text + "' takes " +
                                std::to_string(node->params.size()) + " arguments, " +
                                std::to_string(args.positional.size()) + " given");
      }
      // A macro sees the top-level names and its parameters, not the caller's loop scopes.
      std::vector<std::shared_ptr<Scope>> saved;
      saved.swap(scopes_);
      scopes_.push_back(root_);
      scopes_.push_back(std::make_shared<Scope>());
      struct Restore {
        std::vector<std::shared_ptr<Scope>>& scopes;
        std::vector<std::shared_ptr<Scope>>& saved;
        ~Restore() { scopes.swap(saved); }
      } restore{scopes_, saved};
      for (size_t i = 0; i < node->params.size(); ++i) {
        const auto& p = node->params[i];
        if (args.has(i, p.first.c_str())) {
          assign(p.first, args.get(i, p.first.c_str()));
        } else if (p.second) {
          assign(p.first, eval(*p.second));
        } else {
          assign(p.first, Value::undefined("parameter '" + p.first + "' was not provided"));
        }
      }
      if (!args.keyword.empty()) {
        throw TemplateError(
            TemplateError::Kind::kRuntime,
            "macro '" + node->text + "' takes no keyword argument '" + args.keyword[0].first + "'");
      }
      std::string out;
      const int saved_loops = loop_depth_;
      loop_depth_ = 0;
      try {
        exec_list(node->body, out);
      } catch (...) {
        loop_depth_ = saved_loops;
        throw;
      }
      loop_depth_ = saved_loops;
      return Value(std::move(out));
    });
  }

  // ---- expressions

  CallArgs eval_args(const Expr& e, size_t first) {
    CallArgs a;
    for (size_t i = first; i < e.args.size(); ++i) a.positional.push_back(eval(*e.args[i]));
    for (const auto& kv : e.kwargs) a.keyword.emplace_back(kv.first, eval(*kv.second));
    return a;
  }

  Value eval(const Expr& e) {
    try {
      step();
      Value v = eval_expr(e);
      if (v.is_string()) check_string_bytes(v.as_string().size(), "a string");
      return v;
    } catch (const TemplateError& err) {
      rethrow_located(err, e.line);
    }
  }

  Value eval_expr(const Expr& e) {
    switch (e.kind) {
      case Expr::Kind::kLiteral:
        return e.value;
      case Expr::Kind::kName:
        return lookup(e.name);
      case Expr::Kind::kList:
      case Expr::Kind::kTuple: {
        ValueList items;
        for (const auto& a : e.args) items.push_back(eval(*a));
        return e.kind == Expr::Kind::kTuple ? Value::tuple(std::move(items))
                                            : Value::list(std::move(items));
      }
      case Expr::Kind::kDict: {
        ValueItems items;
        for (size_t i = 0; i + 1 < e.args.size(); i += 2) {
          Value k = eval(*e.args[i]);
          Value v = eval(*e.args[i + 1]);
          bool replaced = false;
          for (auto& kv : items) {
            if (kv.first.equals(k)) kv.second = v, replaced = true;
          }
          if (!replaced) items.emplace_back(std::move(k), std::move(v));
        }
        return Value::dict(std::move(items));
      }
      case Expr::Kind::kAttr:
        return get_attribute(eval(*e.args[0]), e.name);
      case Expr::Kind::kItem:
        return get_item(eval(*e.args[0]), eval(*e.args[1]));
      case Expr::Kind::kSlice: {
        const Value obj = eval(*e.args[0]);
        Value parts[3];
        const Value* ptrs[3] = {nullptr, nullptr, nullptr};
        for (int i = 0; i < 3; ++i) {
          if (e.args[i + 1]) {
            parts[i] = eval(*e.args[i + 1]);
            ptrs[i] = &parts[i];
          }
        }
        return get_slice(obj, ptrs[0], ptrs[1], ptrs[2]);
      }
      case Expr::Kind::kCall: {
        const Value callee = eval(*e.args[0]);
        CallArgs a = eval_args(e, 1);
        return call_value(callee, a);
      }
      case Expr::Kind::kFilter: {
        const Value input = eval(*e.args[0]);
        CallArgs a = eval_args(e, 1);
        return apply_filter(e.name, input, a);
      }
      case Expr::Kind::kTest: {
        const Value input = eval(*e.args[0]);
        CallArgs a = eval_args(e, 1);
        return Value(apply_test(e.name, input, a) != e.negated);
      }
      case Expr::Kind::kUnary:
        if (e.name == "not") return Value(!eval(*e.args[0]).truthy());
        return unary_op(e.name, eval(*e.args[0]));
      case Expr::Kind::kBinary:
        return binary_op(e.name, eval(*e.args[0]), eval(*e.args[1]));
      case Expr::Kind::kAnd: {
        Value a = eval(*e.args[0]);
        return a.truthy() ? eval(*e.args[1]) : a;
      }
      case Expr::Kind::kOr: {
        Value a = eval(*e.args[0]);
        return a.truthy() ? a : eval(*e.args[1]);
      }
      case Expr::Kind::kCondition:
        if (eval(*e.args[1]).truthy()) return eval(*e.args[0]);
        return e.args[2] ? eval(*e.args[2]) : Value::undefined("the inline if had no else branch");
    }
    return Value();
  }

  const RenderContext& options_;
  std::shared_ptr<Scope> root_;
  std::vector<std::shared_ptr<Scope>> scopes_;
  int loop_depth_ = 0;
  int call_depth_ = 0;
  int64_t steps_ = 0;
};

}  // namespace

std::string render_nodes(const NodeList& nodes, const Value& context,
                         const RenderContext& options) {
  Interpreter interpreter(context, options);
  return interpreter.run(nodes);
}

}  // namespace crl::text::jinja
