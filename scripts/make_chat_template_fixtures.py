#!/usr/bin/env python3
"""Renders the chat-template fixtures the C++ Jinja interpreter is tested against.

Input:  tests/fixtures/chat_templates/templates.json, real chat templates (each with where its
        text came from, its bos/eos tokens, and whether its tool calls take arguments as a JSON
        string or an object).
Output: tests/fixtures/chat_templates/expected.json, one case per (template, conversation,
        options): the render python3-jinja2 gives, or the error it raises; and per template, a
        conversation whose contents are lists of text parts rendered both ways a server can pass
        them (the list as given, and the parts joined by newlines), for the content-format check.

Jinja2 is set up exactly as Hugging Face transformers does in utils/chat_template_utils.py:
ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True) with the loopcontrols
extension and the `{% generation %}` tag (its AssistantTracker, which renders its body), a
`tojson` filter that is json.dumps(ensure_ascii=False, indent=...), and the globals
`raise_exception` and `strftime_now` (frozen here at FIXED_NOW so the renders are stable).
Variables are passed as apply_chat_template does: messages, tools (None when absent), documents
(None), add_generation_prompt, the special tokens that are set, then the extra kwargs.
continue_final_message follows transformers too (a tag appended to the last message, the render
cut where the tag lands).

Usage: python3 scripts/make_chat_template_fixtures.py   (no network; rerun after editing inputs)
"""
import copy
import datetime
import json
import os

import jinja2
import jinja2.ext
from jinja2.sandbox import ImmutableSandboxedEnvironment

HERE = os.path.dirname(os.path.abspath(__file__))
FIXTURES = os.path.join(HERE, "..", "tests", "fixtures", "chat_templates")
FIXED_NOW = datetime.datetime(2025, 1, 15, 9, 30, 0)

TOOLS = [
    {"type": "function", "function": {
        "name": "get_current_temperature",
        "description": "Get the current temperature at a location.",
        "parameters": {"type": "object", "properties": {
            "location": {"type": "string", "description": "The location, as \"City, Country\""},
            "unit": {"type": "string", "enum": ["celsius", "fahrenheit"],
                     "description": "The unit to return the temperature in."}},
            "required": ["location", "unit"]}}},
    {"type": "function", "function": {
        "name": "get_wind_speed",
        "description": "Get the current wind speed in km/h at a location.",
        "parameters": {"type": "object", "properties": {
            "location": {"type": "string", "description": "The location"}},
            "required": ["location"]}}},
]

SYSTEM = {"role": "system", "content": "You are a concise assistant."}
CHAT = [
    {"role": "user", "content": "Hello, who are you?"},
    {"role": "assistant", "content": "I am a helpful assistant."},
    {"role": "user", "content": "What is 2 + 2?"},
]
UNICODE = [{"role": "user",
            "content": "Grüße, 你好, Привет 🎉 — \"quotes\" 'single' <tag> {{ not jinja }} {% raw %} "
                       "back\\slash\nnew line\ttab  trailing space "}]
TOOL_CALL = {"id": "call12345", "type": "function",
             "function": {"name": "get_current_temperature",
                          "arguments": {"location": "Paris, France", "unit": "celsius"}}}
TOOL_CHAT = [
    {"role": "user", "content": "What's the temperature in Paris?"},
    {"role": "assistant", "content": None, "tool_calls": [TOOL_CALL]},
    {"role": "tool", "tool_call_id": "call12345", "name": "get_current_temperature", "content": "22.0"},
]
THINK_CHAT = [
    {"role": "user", "content": "Is 17 prime?"},
    {"role": "assistant", "content": "<think>\nCheck divisors up to 4.\n</think>\n\nYes, 17 is prime."},
    {"role": "user", "content": "And 21?"},
]
# Contents as lists of text parts (OpenAI's form), the second part with edge spaces a template may trim.
PARTS_CHAT = [
    {"role": "system", "content": [{"type": "text", "text": "Be brief."}]},
    {"role": "user", "content": [{"type": "text", "text": "Describe this:"},
                                 {"type": "text", "text": "  a red tree  "}]},
]
REASONING_CHAT = [
    {"role": "user", "content": "Is 17 prime?"},
    {"role": "assistant", "content": "Yes, 17 is prime.", "reasoning_content": "Check divisors up to 4."},
    {"role": "user", "content": "And 21?"},
    {"role": "assistant", "content": "No: 21 = 3 * 7.", "reasoning_content": "3 divides 21."},
]


def conversations(template):
    """(name, variables) pairs; messages are deep-copied by the caller."""
    tool_chat = copy.deepcopy(TOOL_CHAT)
    if template["tool_arguments"] == "string":
        for m in tool_chat:
            for c in m.get("tool_calls", []):
                c["function"]["arguments"] = json.dumps(c["function"]["arguments"])
    out = [
        ("system_multi_turn_gen", {"messages": [SYSTEM] + CHAT, "add_generation_prompt": True}),
        ("system_multi_turn_no_gen", {"messages": [SYSTEM] + CHAT, "add_generation_prompt": False}),
        ("no_system_gen", {"messages": CHAT, "add_generation_prompt": True}),
        ("single_user_no_gen", {"messages": CHAT[:1], "add_generation_prompt": False}),
        ("unicode_special_chars", {"messages": UNICODE, "add_generation_prompt": True}),
        ("tools_no_call", {"messages": [SYSTEM] + CHAT, "tools": TOOLS, "add_generation_prompt": True}),
        ("tool_call_and_result", {"messages": [SYSTEM] + tool_chat, "tools": TOOLS,
                                  "add_generation_prompt": True}),
        ("tool_call_empty_content", {"messages": [dict(m, content="") if m.get("tool_calls") else m
                                                  for m in tool_chat], "tools": TOOLS,
                                     "add_generation_prompt": True}),
        ("tool_call_then_answer", {"messages": tool_chat + [
            {"role": "assistant", "content": "It is 22 °C in Paris."},
            {"role": "user", "content": "Thanks!"}], "tools": TOOLS, "add_generation_prompt": True}),
        ("think_in_history", {"messages": THINK_CHAT, "add_generation_prompt": True}),
        ("continue_final_message", {"messages": CHAT + [{"role": "assistant", "content": "The answer is"}],
                                    "add_generation_prompt": False, "continue_final_message": True}),
    ]
    if "enable_thinking" in template["template"] or "reasoning_content" in template["template"]:
        out += [
            ("enable_thinking_false", {"messages": [SYSTEM] + CHAT, "add_generation_prompt": True,
                                       "enable_thinking": False}),
            ("enable_thinking_true", {"messages": [SYSTEM] + CHAT, "add_generation_prompt": True,
                                      "enable_thinking": True}),
            ("reasoning_content", {"messages": REASONING_CHAT, "add_generation_prompt": False}),
            ("reasoning_content_gen_no_think", {"messages": REASONING_CHAT[:3], "add_generation_prompt": True,
                                                "enable_thinking": False}),
        ]
    return out


class GenerationTag(jinja2.ext.Extension):
    """transformers' AssistantTracker as far as rendering goes: {% generation %} renders its body."""
    tags = {"generation"}

    def parse(self, parser):
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(["name:endgeneration"], drop_needle=True)
        return jinja2.nodes.CallBlock(self.call_method("_render"), [], [], body).set_lineno(lineno)

    def _render(self, caller):
        return caller()


def make_env():
    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                          sort_keys=sort_keys)

    def strftime_now(fmt):
        return FIXED_NOW.strftime(fmt)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[GenerationTag, jinja2.ext.loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    return env


def render(env, template, variables):
    variables = copy.deepcopy(variables)
    messages = variables.pop("messages")
    continue_final = variables.pop("continue_final_message", False)
    tag = "CONTINUE_FINAL_MESSAGE_TAG "
    final = None
    if continue_final:
        final = messages[-1]["content"]
        messages[-1]["content"] = final + tag
    kwargs = {"messages": messages, "tools": variables.pop("tools", None), "documents": None,
              "add_generation_prompt": variables.pop("add_generation_prompt")}
    for key in ("bos_token", "eos_token"):
        if template[key] is not None:
            kwargs[key] = template[key]
    kwargs.update(variables)
    out = env.from_string(template["template"]).render(**kwargs)
    if continue_final:
        if final.strip() not in out or tag.strip() not in out:
            raise ValueError("continue_final_message is set but the final message does not appear in the chat")
        at = out.rindex(tag.strip())
        out = out[:at] if out[at:at + len(tag)] == tag else out[:at].rstrip()
    return out


def main():
    with open(os.path.join(FIXTURES, "templates.json"), encoding="utf-8") as f:
        templates = json.load(f)
    env = make_env()
    cases = []
    for t in templates:
        for name, variables in conversations(t):
            case = {"template": t["name"], "case": name, "variables": variables}
            try:
                case["expected"] = render(env, t, variables)
            except Exception as e:  # the C++ side must fail too, with this message for raise_exception
                case["error"] = str(e)
                case["error_kind"] = "raise_exception" if isinstance(e, jinja2.exceptions.TemplateError) and \
                    not isinstance(e, jinja2.exceptions.UndefinedError) else type(e).__name__
            cases.append(case)
    content_parts = []
    for t in templates:
        joined = [dict(m, content="\n".join(p["text"] for p in m["content"])) for m in PARTS_CHAT]
        entry = {"template": t["name"], "messages": PARTS_CHAT}
        for key, messages in (("as_list", PARTS_CHAT), ("joined", joined)):
            try:
                entry[key] = render(env, t, {"messages": messages, "add_generation_prompt": True})
            except Exception as e:
                entry[key + "_error"] = str(e)
        content_parts.append(entry)
    doc = {"generator": "scripts/make_chat_template_fixtures.py", "jinja2": jinja2.__version__,
           "now": FIXED_NOW.isoformat(), "cases": cases, "content_parts": content_parts}
    with open(os.path.join(FIXTURES, "expected.json"), "w", encoding="utf-8") as f:
        json.dump(doc, f, ensure_ascii=False, indent=1)
        f.write("\n")
    ok = sum("expected" in c for c in cases)
    print(f"{len(cases)} cases ({ok} renders, {len(cases) - ok} errors) from {len(templates)} templates")


if __name__ == "__main__":
    main()
