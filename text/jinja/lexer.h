// Lexer: template source -> tokens, with Jinja2's whitespace control applied to the text.
//
// Applies, as transformers configures Jinja2: trim_blocks (the first newline after a block or
// comment tag is dropped), lstrip_blocks (spaces and tabs before a block or comment tag at the
// start of a line are dropped), the `-` markers ({%- -%} {{- -}} {#- -#}: all whitespace on
// that side), `+` markers (no lstrip / trim for that tag), {% raw %} blocks, comments, and the
// removal of one trailing newline of the source. \r\n and \r in the source become \n.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace crl::text::jinja {

struct Token {
  enum class Type {
    kText,
    kVarBegin,
    kVarEnd,
    kBlockBegin,
    kBlockEnd,
    kName,
    kString,
    kInt,
    kFloat,
    kOp,
    kEof
  };
  Type type = Type::kEof;
  std::string text;  // text, name, operator, or the unescaped string literal
  int64_t int_value = 0;
  double float_value = 0.0;
  int line = 1;
};

struct LexerOptions {
  // Drop the first newline after a block tag.
  bool trim_blocks = true;
  // Strip spaces and tabs from the start of a line up to a block tag.
  bool lstrip_blocks = true;
};

// Throws TemplateError (kSyntax) naming the line for an unterminated tag, string or comment.
std::vector<Token> tokenize(const std::string& source, const LexerOptions& options,
                            const std::string& template_name);

}  // namespace crl::text::jinja
