// TemplateError: every way a chat template can fail (syntax, an unsupported construct, a runtime
// or undefined-value error while rendering, or the template's own raise_exception()), as code
// outside text/ sees it; the Jinja interpreter that throws it (text/jinja/) stays text/'s own.
#pragma once

#include "text/jinja/error.h"

namespace crl::text {

using TemplateError = jinja::TemplateError;

}  // namespace crl::text
