// TemplateError: every failure of the Jinja module (syntax, unsupported construct, a runtime type
// error, an undefined value used, or the template's own raise_exception()).
#pragma once

#include <stdexcept>
#include <string>

namespace crl::text::jinja {

class TemplateError : public std::runtime_error {
 public:
  enum class Kind {
    kSyntax,       // the template does not parse
    kUnsupported,  // valid Jinja2 this interpreter does not implement (include, extends, ...)
    kRuntime,      // a type error, a bad argument, ... while rendering
    kUndefined,    // an attribute of, or arithmetic with, an undefined value
    kRaised,       // raise_exception("...") in the template: message() is its text
  };

  // line 0: not known yet (the interpreter adds it as the error passes a node).
  TemplateError(Kind kind, std::string message, std::string template_name = "", int line = 0);

  Kind kind() const { return kind_; }
  // The message without the location.
  const std::string& message() const { return message_; }
  const std::string& template_name() const { return template_name_; }
  int line() const { return line_; }
  // A copy located at `line` of `template_name` (unless it already has a line).
  TemplateError located(const std::string& template_name, int line) const;

 private:
  Kind kind_;
  std::string message_;
  std::string template_name_;
  int line_;
};

}  // namespace crl::text::jinja
