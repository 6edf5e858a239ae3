// Unit tests of the Jinja interpreter. The expected strings of kCases are what python3-jinja2
// renders with transformers' settings (ImmutableSandboxedEnvironment, trim_blocks, lstrip_blocks,
// loopcontrols, HF's tojson) for the same source and context.
#include <gtest/gtest.h>

#include <chrono>
#include <iostream>
#include <string>
#include <vector>

#include "tests/test_utils.h"
#include "text/jinja/template.h"

namespace crl::text::jinja {
namespace {

using ojson = nlohmann::ordered_json;

const char* const kContext =
    R"J({"s": " Hello World ", "n": 7, "f": 2.5, "xs": [3, 1, 2], "d": {"b": 2, "a": 1}, "msgs": [{"role": "system", "content": "S"}, {"role": "user", "content": "U1"}, {"role": "assistant", "content": "A1"}, {"role": "user", "content": "U2"}], "u": "Grüße 你好", "none": null, "t": true, "empty": [], "nested": {"k": [1, {"x": "y"}]}})J";

struct RenderCase {
  const char* name;
  const char* source;
  const char* expected;
};

const RenderCase kCases[] =
    {
        {"Arithmetic",
         R"J({{ 1 + 2 * 3 }} {{ (1 + 2) * 3 }} {{ 7 // 2 }} {{ -7 // 2 }} {{ 7 % 3 }} {{ -7 % 3 }} {{ 2 ** 10 }} {{ 7 / 2 }} {{ 6 / 2 }} {{ 1.5 + 1 }} {{ 0.1 + 0.2 }} {{ 1e3 }} {{ -n }} {{ n - 10 }})J",
         R"J(7 9 3 -4 1 2 1024 3.5 3.0 2.5 0.30000000000000004 1000.0 -7 -3)J"},
        {"ConcatAndStringOps",
         R"J({{ 'a' ~ 1 ~ none ~ t }} {{ 'ab' + 'cd' }} {{ 'ab' * 3 }} {{ [1] + [2] }} {{ 'x' ~ undefined_var ~ 'y' }})J",
         R"J(a1NoneTrue abcd ababab [1, 2] xy)J"},
        {"Comparisons",
         R"J({{ 1 < 2 < 3 }} {{ 3 > 2 > 2 }} {{ 1 == 1.0 }} {{ 'a' < 'b' }} {{ [1,2] == [1,2] }} {{ 1 != 2 }} {{ none == none }} {{ 2 >= 2 }})J",
         R"J(True False True True True True True True)J"},
        {"BooleanLogic",
         R"J({{ true and 'x' }} {{ false or 'y' }} {{ not none }} {{ 0 or [] or 'z' }} {{ '' and 1 }} {{ not 1 == 2 }})J",
         R"J(x y True z  True)J"},
        {"InOperator",
         R"J({{ 'ell' in s }} {{ 2 in xs }} {{ 'a' in d }} {{ 'z' not in d }} {{ 5 not in xs }})J",
         R"J(True True True True True)J"},
        {"ConditionalExpression",
         R"J({{ 'yes' if n > 5 else 'no' }} {{ 'a' if false else 'b' if true else 'c' }}[{{ 'x' if false }}])J",
         R"J(yes b[])J"},
        {"FilterBindsTighterThanArithmetic",
         R"J({{ xs|length - 1 }} {{ -(xs|length) }} {{ 'a ' + s|trim + '!' }})J",
         R"J(2 -3 a Hello World!)J"},
        {"Literals",
         R"J({{ [1, 'two', 3.0, none, true] }} {{ {'k': 'v', 'n': [1]} }} {{ (1, 2) }} {{ 'it''s' }} {{ "q\"uote\n" }})J",
         R"J([1, 'two', 3.0, None, True] {'k': 'v', 'n': [1]} (1, 2) its q"uote
)J"},
        {"Slicing",
         R"J({{ xs[1:] }} {{ xs[:-1] }} {{ xs[::-1] }} {{ xs[::2] }} {{ s[1:6] }} {{ u[::-1] }} {{ u[-2:] }} {{ xs[-1] }} {{ u[0] }})J",
         R"J([1, 2] [3, 1] [2, 1, 3] [3, 2] Hello 好你 eßürG 你好 2 G)J"},
        {"AttributeAndItemLookup",
         R"J({{ msgs[0].role }} {{ msgs[0]['content'] }} {{ d.a }} {{ nested.k[1].x }} {{ nested['k'][0] }} [{{ d.missing }}] {{ d.missing is defined }} {{ msgs[9] is defined }})J",
         R"J(system S 1 y 1 [] False False)J"},
        {"IfElifElse",
         R"J({% for i in [1, 2, 3] %}{% if i == 1 %}one{% elif i == 2 %}two{% else %}many{% endif %},{% endfor %})J",
         R"J(one,two,many,)J"},
        {"ForLoopVariables",
         R"J({% for x in xs %}{{ loop.index }}/{{ loop.index0 }}/{{ loop.revindex }}/{{ loop.revindex0 }}/{{ loop.first }}/{{ loop.last }}/{{ loop.length }}/{{ loop.previtem is defined and loop.previtem }}/{{ loop.nextitem }};{% endfor %})J",
         R"J(1/0/3/2/True/False/3/False/1;2/1/2/1/False/False/3/3/2;3/2/1/0/False/True/3/1/;)J"},
        {"ForLoopCycleFilterElse",
         R"J({% for x in xs if x > 1 %}{{ loop.cycle('a', 'b') }}{{ x }}{{ loop.length }} {% endfor %}{% for x in empty %}never{% else %}empty{% endfor %})J",
         R"J(a32 b22 empty)J"},
        {"ForOverDictItemsAndUnpacking",
         R"J({% for k, v in d.items() %}{{ k }}={{ v }};{% endfor %}{% for k in d %}{{ k }}{% endfor %}{% for a, b in [[1, 2], [3, 4]] %}{{ a + b }}{% endfor %})J",
         R"J(b=2;a=1;ba37)J"},
        {"BreakAndContinue",
         R"J({% for x in range(10) %}{% if x is odd %}{% continue %}{% endif %}{% if x > 6 %}{% break %}{% endif %}{{ x }}{% endfor %})J",
         R"J(0246)J"},
        {"SetScopingAndNamespace",
         R"J({% set x = 1 %}{% for i in xs %}{% set x = i %}{% endfor %}{{ x }} {% set ns = namespace(x=1, items=[]) %}{% for i in xs %}{% set ns.x = ns.x + i %}{% endfor %}{{ ns.x }} {% set a, b = 1, 2 %}{{ a }}{{ b }})J",
         R"J(1 7 12)J"},
        {"SetBlock", R"J({% set block %}Hi {{ n }}!{% endset %}[{{ block }}])J", R"J([Hi 7!])J"},
        {"MacrosWithDefaults",
         R"J({% macro greet(name, punct='!') %}Hello {{ name }}{{ punct }}{% endmacro %}{{ greet('A') }} {{ greet('B', '?') }} {{ greet(name='C', punct='.') }})J",
         R"J(Hello A! Hello B? Hello C.)J"},
        {"MacroRecursionAndGlobals",
         R"J({% macro fact(k) %}{% if k <= 1 %}1{% else %}{{ k * fact(k - 1)|int }}{% endif %}{% endmacro %}{{ fact(5) }} {% macro show() %}{{ n }}{% endmacro %}{{ show() }})J",
         R"J(120 7)J"},
        {"WhitespaceControl", R"J(a  {%- if true -%}  b  {%- endif -%}  c {{- ' d ' -}} e)J",
         R"J(abc d e)J"},
        {"TrimAndLstripBlocks",
         R"J(line1
    {% if true %}
    inside
    {% endif %}
line2
  {{ 'kept indent' }}
)J",
         R"J(line1
    inside
line2
  kept indent)J"},
        {"PlusDisablesLstrip",
         R"J(x
    {%+ if true %}y{% endif %}
)J",
         R"J(x
    y)J"},
        {"CommentsAndRaw",
         R"J(a{# a comment #}b
  {#- trimmed -#}
 c {% raw %}{{ not evaluated }}{% endraw %})J",
         R"J(abc {{ not evaluated }})J"},
        {"TrailingNewlineDropped",
         R"J(text
)J",
         R"J(text)J"},
        {"StringFilters",
         R"J({{ s|trim }}|{{ s|upper }}|{{ s|lower }}|{{ 'hello wORLD-x'|title }}|{{ 'hELLO'|capitalize }}|{{ s|replace('o', '0') }}|{{ s|length }}|{{ u|length }}|{{ 'xxhixx'|trim('x') }})J",
         R"J(Hello World| HELLO WORLD | hello world |Hello World-X|Hello| Hell0 W0rld |13|8|hi)J"},
        {"ListFilters",
         R"J({{ xs|first }} {{ xs|last }} {{ xs|sort }} {{ xs|sort(reverse=true) }} {{ xs|reverse|list }} {{ xs|join(', ') }} {{ xs|sum }} {{ xs|min }} {{ xs|max }} {{ [1, 2, 1, 3]|unique|list }} {{ ['B', 'a', 'b']|unique|list }} {{ 'abc'|list }})J",
         R"J(3 2 [1, 2, 3] [3, 2, 1] [2, 1, 3] 3, 1, 2 6 1 3 [1, 2, 3] ['B', 'a'] ['a', 'b', 'c'])J"},
        {"MapSelectReject",
         R"J({{ msgs|map(attribute='role')|join(',') }} {{ msgs|selectattr('role', 'equalto', 'user')|map(attribute='content')|list }} {{ msgs|rejectattr('role', 'eq', 'user')|list|length }} {{ xs|select('odd')|list }} {{ xs|reject('odd')|list }} {{ ['a', 'b']|map('upper')|list }} {{ msgs|selectattr('missing', 'undefined')|list|length }})J",
         R"J(system,user,assistant,user ['U1', 'U2'] 2 [3, 1] [2] ['A', 'B'] 4)J"},
        {"DefaultFilter",
         R"J({{ missing|default('dflt') }} {{ none|default('x') }} {{ ''|default('y', true) }} {{ missing|d('z') }})J",
         R"J(dflt None y z)J"},
        {"DictFilters",
         R"J({{ d|dictsort }} {{ d|dictsort(by='value', reverse=true) }} {{ d|items|list }} {{ d|length }})J",
         R"J([('a', 1), ('b', 2)] [('b', 2), ('a', 1)] [('b', 2), ('a', 1)] 2)J"},
        {"TojsonFilter",
         R"J({{ d|tojson }} {{ nested|tojson }} {{ u|tojson }} {{ 'q"\\
	'|tojson }} {{ [none, true, 1.5, 2]|tojson }} {{ nested|tojson(indent=2) }} {{ d|tojson(sort_keys=true) }} {{ {}|tojson }} {{ []|tojson(indent=4) }})J",
         R"J({"b": 2, "a": 1} {"k": [1, {"x": "y"}]} "Grüße 你好" "q\"\\\n\t" [null, true, 1.5, 2] {
  "k": [
    1,
    {
      "x": "y"
    }
  ]
} {"a": 1, "b": 2} {} [])J"},
        {"NumberFilters",
         R"J({{ '42'|int + 1 }} {{ 'x'|int }} {{ 3.7|int }} {{ '2.5'|float }} {{ -3|abs }} {{ 2.567|round(2) }} {{ 2.5|round }} {{ 7|string ~ 'x' }} {{ 3.0 }})J",
         R"J(43 0 3 2.5 3 2.57 2.0 7x 3.0)J"},
        {"IndentAndMisc",
         R"J({{ 'a
b

c'|indent(2) }}|{{ 'a
b'|indent(2, true) }}|{{ 'one two  three'|wordcount }}|{{ '<b>&'|e }}|{{ '%s-%d'|format('x', 5) }})J",
         R"J(a
  b

  c|  a
  b|3|&lt;b&gt;&amp;|x-5)J"},
        {"StringifyContainers",
         R"J({{ msgs[0] }} {{ xs }} {{ ['it\'s', "q\""] }} {{ none }} {{ t }} {{ {'a': none, 'b': false} }})J",
         R"J({'role': 'system', 'content': 'S'} [3, 1, 2] ["it's", 'q"'] None True {'a': None, 'b': False})J"},
        {"Tests", R"J({{ n is defined }} {{ nope is undefined }} {{ none is none }} {{ s is string }} {{ n is number }} {{ n is integer }} {{ f is float }} {{ d is mapping }} {{ xs is iterable }} {{ s is iterable }} {{ n is iterable }} {{ t is boolean }} {{ t is true }} {{ n is odd }} {{ 10 is divisibleby 5 }} {{ 3 is in xs }} {{ 'a' is lower }} {{ xs is sequence }} {{ n is not string }} {{ none is sameas none }} {{ range is callable }})J", R"J(True True True True True True True True True True False True True True True True True True True True True)J"},
        {"StringMethods",
         R"J({{ s.strip() }}|{{ s.lstrip() }}|{{ s.rstrip() }}|{{ 'a,b,,c'.split(',') }}|{{ ' a  b '.split() }}|{{ 'a b c'.split(' ', 1) }}|{{ 'a-b-c'.rsplit('-', 1) }}|{{ s.startswith(' He') }}|{{ s.endswith(('x', 'd ')) }}|{{ s.replace('l', 'L', 2) }}|{{ 'x'.upper() }}|{{ 'Y'.lower() }}|{{ 'ab cd'.title() }}|{{ '{} and {}'.format(1, 'two') }}|{{ '{0}{name}'.format('a', name='b') }}|{{ '-'.join(['a', 'b']) }}|{{ s.find('World') }}|{{ 'aaa'.count('a') }}|{{ '

x
'.strip('
') }})J",
         R"J(Hello World|Hello World | Hello World|['a', 'b', '', 'c']|['a', 'b']|['a', 'b c']|['a-b', 'c']|True|True| HeLLo World |X|y|Ab Cd|1 and two|ab|a-b|7|3|x)J"},
        {"DictMethods",
         R"J({{ d.get('a') }} {{ d.get('zz', 'no') }} {{ d.get('zz') }} {{ d.keys()|list }} {{ d.values()|list }} {{ d.items()|list }})J",
         R"J(1 no None ['b', 'a'] [2, 1] [('b', 2), ('a', 1)])J"},
        {"RangeAndDict",
         R"J({{ range(3)|list }} {{ range(1, 7, 2)|list }} {{ dict(a=1, b='x') }} {{ range(3, 0, -1)|list }})J",
         R"J([0, 1, 2] [1, 3, 5] {'a': 1, 'b': 'x'} [3, 2, 1])J"},
};

std::string render(const std::string& source, const ojson& context = ojson::object()) {
  return Template::parse(source, "test").render(context);
}

TEST(JinjaTemplateTest, RendersLikePythonJinja2) {
  const ojson context = ojson::parse(kContext);
  for (const RenderCase& c : kCases) {
    SCOPED_TRACE(c.name);
    std::string got;
    try {
      got = render(c.source, context);
    } catch (const std::exception& e) {
      ADD_FAILURE() << "threw: " << e.what();
      continue;
    }
    EXPECT_EQ(got, c.expected);
  }
}

// The error a render or parse throws (fails the test when none is thrown).
TemplateError error_of(const std::string& source, const ojson& context = ojson::object()) {
  try {
    render(source, context);
  } catch (const TemplateError& e) {
    return e;
  }
  ADD_FAILURE() << "no error from: " << source;
  return TemplateError(TemplateError::Kind::kRuntime, "");
}

void expect_error(const std::string& source, TemplateError::Kind kind, int line,
                  const std::string& part, const ojson& context = ojson::object()) {
  const TemplateError e = error_of(source, context);
  EXPECT_EQ(e.kind(), kind) << e.what();
  EXPECT_EQ(e.line(), line) << e.what();
  EXPECT_NE(std::string(e.what()).find(part), std::string::npos) << e.what();
  EXPECT_NE(std::string(e.what()).find("template 'test' line " + std::to_string(line) + ": "),
            std::string::npos)
      << e.what();
}

TEST(JinjaTemplateTest, UnknownOrUnsupportedConstructsNameTheLine) {
  using K = TemplateError::Kind;
  expect_error("a\n{{ x | nosuch }}", K::kSyntax, 2, "unknown filter 'nosuch'");
  expect_error("a\nb\n{% if x is nosuch %}{% endif %}", K::kSyntax, 3, "unknown test 'nosuch'");
  expect_error("{% frobnicate %}", K::kSyntax, 1, "unknown tag 'frobnicate'");
  expect_error("\n{% include 'other.jinja' %}", K::kUnsupported, 2, "unsupported tag 'include'");
  expect_error("{% extends 'base' %}", K::kUnsupported, 1, "unsupported tag 'extends'");
  expect_error("{% for x in xs recursive %}{% endfor %}", K::kUnsupported, 1, "recursive");
  expect_error("{% if x %}\nopen", K::kSyntax, 2, "expected 'elif' or 'else' or 'endif'");
  expect_error("{{ 'unterminated }}", K::kSyntax, 1, "unterminated string literal");
  expect_error("x\n{{ 1 + }}", K::kSyntax, 2, "unexpected '}}'");
  expect_error("{% for x in %}{% endfor %}", K::kSyntax, 1, "unexpected '%}'");
  expect_error("{# never closed", K::kSyntax, 1, "unterminated comment");
}

TEST(JinjaTemplateTest, RuntimeErrorsNameTheLine) {
  using K = TemplateError::Kind;
  const TemplateError raised = error_of("ok\n{{ raise_exception('Roles must alternate') }}");
  EXPECT_EQ(raised.kind(), K::kRaised);
  EXPECT_EQ(raised.message(), "Roles must alternate");
  EXPECT_EQ(raised.line(), 2);
  expect_error("{{ foo.bar }}", K::kUndefined, 1, "'foo' is undefined");
  expect_error("\n\n{{ d.missing.x }}", K::kUndefined, 3,
               "'dict object' has no attribute 'missing'", ojson{{"d", ojson::object()}});
  expect_error("{{ 'a' + none }}", K::kRuntime, 1,
               "can only concatenate str (not \"NoneType\") to str");
  expect_error("{{ 'a' + missing }}", K::kUndefined, 1, "'missing' is undefined");
  expect_error("{% for x in none %}{% endfor %}", K::kRuntime, 1,
               "'NoneType' object is not iterable");
  expect_error("{{ '</think>' in none }}", K::kRuntime, 1,
               "argument of type 'NoneType' is not iterable");
  expect_error("{{ xs.append(4) }}", K::kUndefined, 1, "unsafe", ojson{{"xs", {1}}});
  expect_error("{% set x = 1 %}{% set x.y = 2 %}", K::kRuntime, 1, "only namespace() objects");
  expect_error("{{ 1 // 0 }}", K::kRuntime, 1, "division or modulo by zero");
  expect_error("{% macro m(a) %}{{ a }}{% endmacro %}{{ m(1, 2) }}", K::kRuntime, 1,
               "takes 1 arguments, 2 given");
  expect_error("{{ {'a': missing}|tojson }}", K::kUndefined, 1, "not JSON serializable");
}

// Hostile templates (issue 49) fail fast with a TemplateError instead of crashing, hanging or
// taking gigabytes: nesting past the parser's limit, loops past the step budget, strings past the
// size cap (each case's time is printed; a hang would meet the test's timeout).
TEST(JinjaTemplateTest, HostileTemplatesFailFastWithinTheirBudgets) {
  using K = TemplateError::Kind;
  using Clock = std::chrono::steady_clock;
  struct Case {
    std::string name, source, part;
    K kind;
  };
  const std::string parens(10000, '(');
  const std::vector<Case> cases = {
      {"10,000 nested parentheses", "{{ " + parens + "1" + std::string(10000, ')') + " }}",
       "nesting deeper than 200 levels", K::kSyntax},
      {"10,000 nots",
       "{{ " +
           [] {
             std::string n;
             for (int i = 0; i < 10000; ++i) n += "not ";
             return n;
           }() +
           "1 }}",
       "nesting deeper than", K::kSyntax},
      {"10,000 unary minus", "{{ " + std::string(10000, '-') + "1 }}", "nesting deeper than",
       K::kSyntax},
      {"1,000 nested ifs",
       [] {
         std::string t;
         for (int i = 0; i < 1000; ++i) t += "{% if true %}";
         for (int i = 0; i < 1000; ++i) t += "{% endif %}";
         return t;
       }(),
       "nesting deeper than", K::kSyntax},
      {"nested loops over range(1000000)",
       "{% for i in range(1000000) %}{% for j in range(1000000) %}{% endfor %}{% endfor %}",
       "budget of 10000000 evaluation steps", K::kRuntime},
      {"a gigabyte string", "{{ 'a' * 1000000000 }}", "passes the template string limit",
       K::kRuntime},
      {"string doubling",
       "{% set ns = namespace(s='ab') %}{% for i in range(64) %}{% set ns.s = ns.s ~ ns.s %}"
       "{% endfor %}{{ ns.s|length }}",
       "passes the template string limit", K::kRuntime},
      {"string doubling with +",
       "{% set ns = namespace(s='ab') %}{% for i in range(64) %}{% set ns.s = ns.s + ns.s %}"
       "{% endfor %}",
       "passes the template string limit", K::kRuntime},
      {"list doubling",
       "{% set ns = namespace(l=[1]) %}{% for i in range(64) %}{% set ns.l = ns.l + ns.l %}"
       "{% endfor %}",
       "passes the template list limit", K::kRuntime},
      {"replace amplifying", "{{ (('a' * 30000000)|replace('a', 'aaaa')) }}",
       "passes the template string limit", K::kRuntime},
      {"center to a gigabyte", "{{ 'x'|center(1000000000) }}", "passes the template string limit",
       K::kRuntime},
      {"output past the cap",
       "{% set s = 'x' * 1000 %}{% for i in range(100000) %}{{ s }}{% endfor %}",
       "the rendered text", K::kRuntime},
      {"a macro calling itself", "{% macro m(n) %}{{ m(n + 1) }}{% endmacro %}{{ m(0) }}",
       "recursed too deeply", K::kRuntime},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    const auto t0 = Clock::now();
    try {
      (void)render(c.source);
      ADD_FAILURE() << "rendered without an error";
    } catch (const TemplateError& e) {
      EXPECT_EQ(e.kind(), c.kind) << e.what();
      EXPECT_NE(std::string(e.what()).find(c.part), std::string::npos) << e.what();
    }
    // Reported, not asserted (timings are for benchmarks): about a second at most on the
    // development machine, the step budget's case.
    std::cout << c.name << ": " << std::chrono::duration<double>(Clock::now() - t0).count()
              << " s\n";
  }
  // A deep but reasonable template still renders.
  std::string deep = "{{ " + std::string(150, '(') + "1" + std::string(150, ')') + " }}";
  EXPECT_EQ(render(deep), "1");
}

TEST(JinjaTemplateTest, UndefinedBehavesLikeJinjaDefault) {
  EXPECT_EQ(render("[{{ missing }}]{{ missing is defined }}{{ missing|length }}{% for x in missing "
                   "%}x{% endfor %}"),
            "[]False0");
  EXPECT_EQ(render("{{ missing == missing }} {{ not missing }} {{ missing|default('d') }} {{ "
                   "missing ~ 'x' }}"),
            "True True d x");
  EXPECT_EQ(render("{{ none.attr is defined }} {{ (5).real is defined }}"), "False False");
}

TEST(JinjaTemplateTest, StrftimeNowReadsTheGivenClock) {
  RenderOptions options;
  options.now = 1736942400;  // 2025-01-15 12:00 UTC
  const std::string out = Template::parse("{{ strftime_now('%Y') }}-{{ strftime_now('%b') }}")
                              .render(ojson::object(), options);
  EXPECT_EQ(out, "2025-Jan");
}

TEST(JinjaTemplateTest, FloatsPrintAsPythonRepr) {
  EXPECT_EQ(float_repr(22.0), "22.0");
  EXPECT_EQ(float_repr(0.1), "0.1");
  EXPECT_EQ(float_repr(1e16), "1e+16");
  EXPECT_EQ(float_repr(1.5e-5), "1.5e-05");
  EXPECT_EQ(float_repr(0.0001), "0.0001");
  EXPECT_EQ(float_repr(-2.5), "-2.5");
  EXPECT_EQ(float_repr(123456789012345.0), "123456789012345.0");
}

TEST(JinjaTemplateTest, ParsedTemplateRendersManyContexts) {
  const Template t =
      Template::parse("{% for m in messages %}{{ m.role }}:{{ m.content }};{% endfor %}");
  EXPECT_EQ(t.render(ojson::parse(R"({"messages": [{"role": "user", "content": "a"}]})")),
            "user:a;");
  EXPECT_EQ(t.render(ojson::parse(R"({"messages": []})")), "");
  EXPECT_EQ(Template::parse("{{ x }}", "t", TemplateOptions{false, false}).render(ojson{{"x", 1}}),
            "1");
  EXPECT_EQ(Template::parse("  {% if true %}\nx{% endif %}", "t", TemplateOptions{false, false})
                .render(ojson::object()),
            "  \nx");
}

}  // namespace
}  // namespace crl::text::jinja

namespace crl::text::jinja {
namespace {

// vLLM's content-format detection: a loop over the content of a message from a loop over
// `messages` (or a name set from it, under filters, tests and slices).
TEST(JinjaContentFormatTest, FindsLoopsOverAMessagesContent) {
  auto loops = [](const std::string& src) {
    return Template::parse(src).iterates_message_content();
  };
  EXPECT_TRUE(loops(
      "{% for m in messages %}{% for p in m['content'] %}{{ p.text }}{% endfor %}{% endfor %}"));
  EXPECT_TRUE(
      loops("{% for m in messages %}{% for p in m.content %}{{ p.text }}{% endfor %}{% endfor %}"));
  EXPECT_TRUE(loops(
      "{% set a = messages[1:] %}{% set b = a %}{% for m in b | reverse %}"
      "{% if m.content is string %}{{ m.content }}{% else %}"
      "{% for p in m['content'] | selectattr('type', 'equalto', 'text') %}{{ p.text }}{% endfor %}"
      "{% endif %}{% endfor %}"));
  EXPECT_FALSE(loops("{% for m in messages %}{{ m['content'] }}{% endfor %}"));
  EXPECT_FALSE(
      loops("{% for m in messages %}{% for t in m.tool_calls %}{{ t }}{% endfor %}{% endfor %}"));
  EXPECT_FALSE(
      loops("{% for p in message['content'] %}{{ p }}{% endfor %}"));  // no loop over messages
  EXPECT_FALSE(
      loops("{% for m in tools %}{% for p in m.content %}{{ p }}{% endfor %}{% endfor %}"));
  // Targets vLLM's walk cannot follow: it answers "string".
  EXPECT_FALSE(loops("{% for i, m in messages %}{% for p in m.content %}{% endfor %}{% endfor %}"));
  EXPECT_FALSE(
      loops("{% set ns = namespace(m=none) %}{% set ns.m = messages %}"
            "{% for m in messages %}{% for p in m.content %}{% endfor %}{% endfor %}"));
}

}  // namespace
}  // namespace crl::text::jinja
