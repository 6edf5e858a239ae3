#include "text/jinja/error.h"

namespace crl::text::jinja {

namespace {

std::string format_what(const std::string& name, int line, const std::string& message) {
  std::string out;
  if (!name.empty()) out += "template '" + name + "'";
  if (line > 0) out += (out.empty() ? "line " : " line ") + std::to_string(line);
  return out.empty() ? message : out + ": " + message;
}

}  // namespace

TemplateError::TemplateError(Kind kind, std::string message, std::string template_name, int line)
    : std::runtime_error(format_what(template_name, line, message)),
      kind_(kind),
      message_(std::move(message)),
      template_name_(std::move(template_name)),
      line_(line) {}

TemplateError TemplateError::located(const std::string& template_name, int line) const {
  if (line_ > 0) return *this;
  return TemplateError(kind_, message_, template_name, line);
}

}  // namespace crl::text::jinja
