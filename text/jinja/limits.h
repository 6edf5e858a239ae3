// What one template may cost (issue 49): templates come with model directories and, through them,
// from whoever published the model, so a parse and a render are bounded like any other input.
// Past a limit the parse or render fails with a TemplateError (a 400 `chat_template_error` at the
// server), the process and its other requests unaffected.
#pragma once

#include <cstddef>
#include <cstdint>

namespace crl::text::jinja {

// Nesting of parentheses, unary operators and blocks in one template (the parser, the interpreter
// and the tree's destructor recurse once a level; Python's Jinja2 stops near 100-300).
constexpr int kMaxTemplateNesting = 200;
// Statements and expressions evaluated by one render, a loop iteration counting 16 (a long chat
// with tools takes ~1e5; 1e7 is about half a second of work on the development machine).
constexpr int64_t kMaxRenderSteps = 10'000'000;
// Bytes of any string one render builds, its output included.
constexpr size_t kMaxTemplateStringBytes = size_t{32} << 20;
// Items of any list one render builds (range() has its own limit of 1e6).
constexpr size_t kMaxTemplateListItems = 4'000'000;
// Nested macro calls (a macro that calls itself without end).
constexpr int kMaxMacroDepth = 200;

// Throws a TemplateError naming `what` when a string of `bytes` bytes would pass
// kMaxTemplateStringBytes.
void check_string_bytes(uint64_t bytes, const char* what);
// The same for a list of `items` items and kMaxTemplateListItems.
void check_list_items(uint64_t items, const char* what);

}  // namespace crl::text::jinja
