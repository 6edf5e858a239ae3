// The syntax tree of a parsed template: expressions (Expr) and statements (Node).
#pragma once

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "text/jinja/value.h"

namespace crl::text::jinja {

struct Expr;
struct Node;
using ExprPtr = std::unique_ptr<Expr>;
using NodePtr = std::unique_ptr<Node>;
using NodeList = std::vector<NodePtr>;

struct Expr {
  enum class Kind {
    kLiteral,  // value
    kName,     // name
    kList,     // [args...]
    kTuple,    // (a, b) -- evaluated as a list
    kDict,     // {args[2i]: args[2i+1]}
    kAttr,     // args[0].name
    kItem,     // args[0][args[1]]
    kSlice,    // args[0][args[1]:args[2]:args[3]] (null parts: nullptr)
    kCall,     // args[0](args[1..], kwargs)
    kFilter,   // args[0] | name(args[1..], kwargs)
    kTest,     // args[0] is [not] name(args[1..])
    kUnary,    // name in {"-", "+", "not"}; args[0]
    kBinary,   // args[0] name args[1]; name: + - * / // % ** ~ == != < <= > >= in "not in"
    kAnd,
    kOr,
    kCondition,  // args[0] if args[1] else args[2] (args[2] may be null)
  };
  Kind kind = Kind::kLiteral;
  int line = 0;
  Value value;
  std::string name;
  bool negated = false;  // kTest: "is not"
  std::vector<ExprPtr> args;
  std::vector<std::pair<std::string, ExprPtr>> kwargs;
};

struct Node {
  enum class Kind {
    kText,      // text
    kOutput,    // {{ expr }}
    kIf,        // branches (cond, body), else_body
    kFor,       // for targets in expr [if filter] body [else else_body]
    kSet,       // set targets = expr; or set target_ns.attr = expr
    kSetBlock,  // {% set name %}body{% endset %}
    kMacro,     // macro name(params) body
    kBreak,
    kContinue,
    kGeneration,   // {% generation %}body{% endgeneration %} (transformers' tag: renders body)
    kFilterBlock,  // {% filter name(args) %}body{% endfilter %}: expr is the filter applied to a
                   // placeholder name
    kWith,         // {% with a = x, ... %}body{% endwith %}
  };
  Kind kind = Kind::kText;
  int line = 0;
  std::string text;
  ExprPtr expr;                                        // output / for iterable / set value
  ExprPtr filter;                                      // for ... if filter
  std::vector<std::string> targets;                    // for / set names (several: unpacking)
  std::string attribute;                               // set ns.attribute
  std::vector<std::pair<ExprPtr, NodeList>> branches;  // if / elif
  NodeList body;
  NodeList else_body;
  std::vector<std::pair<std::string, ExprPtr>> params;  // macro parameters (default or null); with
};

}  // namespace crl::text::jinja
