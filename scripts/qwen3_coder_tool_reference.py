#!/usr/bin/env python3
"""Reference outputs of vLLM's own `qwen3_coder` tool parser, for specd's unit tests.

    ~/.cache/specd/vllm-venv/bin/python scripts/qwen3_coder_tool_reference.py \\
        > src/speculation/tools/qwen3_coder_vllm.json

Driven by `engine_tool_reference.py` (alone, with `--reasoning-parser qwen3`, and with
`--reasoning-parser deepseek_r1`, which vLLM composes the classic way).
`<think>`, `</think>`, `<tool_call>` and `</tool_call>` are tokens of the stand-in
tokenizer (the markers the engine matches by id); `<function=`, `</function>`,
`<parameter=` and `</parameter>` are tokens too but matched by text, as vLLM's config
has them. Requests: `tool_choice` `auto` and `none` with tools whose schemas type the
parameters, and none without tools; thinking on and off.
"""
import sys

from engine_tool_reference import write_tool_cases

MARKERS = [
    "<think>", "</think>", "<tool_call>", "</tool_call>",
    "<function=", "</function>", "<parameter=", "</parameter>",
]
TC, TE = "<tool_call>", "</tool_call>"


def param(name, value):
    return f"<parameter={name}>\n{value}\n</parameter>\n"


def fn(name, *params):
    return f"<function={name}>\n" + "".join(param(n, v) for n, v in params) + "</function>\n"


def call(name, *params):
    return f"{TC}\n" + fn(name, *params) + f"{TE}"


TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "parameters": {
        "type": "object", "properties": {"city": {"type": "string"},
                                         "days": {"type": "integer"}}}}},
    {"type": "function", "function": {"name": "add", "parameters": {
        "type": "object", "properties": {"a": {"type": "number"}, "b": {"type": "number"}}}}},
    {"type": "function", "function": {"name": "typed", "parameters": {
        "type": "object", "properties": {
            "i": {"type": "integer"}, "f": {"type": "boolean"}, "s": {"type": "string"},
            "o": {"type": "object", "properties": {"n": {"type": "integer"}}},
            "l": {"type": "array", "items": {"type": "number"}},
            "u": {"anyOf": [{"type": "integer"}, {"type": "null"}]},
            "z": {"type": "null"}, "e": {"enum": ["a", "b"]}, "x": {}}}}},
]

TEXTS = [
    "plain answer",
    "",
    "   \n ",
    "a > b and c < d, <b>bold</b>",
    "Let me check.\n" + call("get_weather", ("city", "Oslo")),
    call("add", ("a", "3"), ("b", "2.0")) + "\n" + call("get_weather", ("city", "Lima"),
                                                          ("days", "3")),
    "\n\n" + call("typed", ("i", "7"), ("f", "true"), ("s", "5"), ("o", '{"n": "4"}'),
                  ("l", '[1, "2.5"]'), ("u", "null"), ("z", "null"), ("e", "b"),
                  ("x", "[1]")),
    call("typed", ("i", "x7"), ("f", "yes"), ("o", "{bad"), ("l", "3"), ("u", "12")),
    call("typed", ("i", "-2"), ("f", "False"), ("u", "1.5"), ("l", "[]"), ("o", "{}")),
    call("get_weather", ("zip", "0150"), ("city", "Rome")) + " trailing",
    call("get_weather"),
    TC + "\n<function=add>\n<parameter=a>\n1",
    TC + "<function=add><parameter=a>1<parameter=b>2</function>" + TE,
    "<function=get_weather><parameter=city>Rome</parameter></function>",
    TC + "<function= add ><parameter= a >4</parameter></function>" + TE,
    TC + "<function=add</function>" + TE,
    TC + TE + " after",
    TC + '\n{"name": "get_weather", "arguments": {"city": "X"}}\n' + TE,
    call("get_weather", ("city", "\nSão Paulo \"q\" \\ é\n\n")),
    call("typed", ("s", "a<b>c</p> x")),
    call("get_weather", ("city", "A"), ("city", "B")),
    call("add", ("a", "1e3"), ("b", "-0.5")) + call("add", ("a", "NaN"), ("b", "7"))
    + call("nope", ("k", "v")),
    "Sure." + call("typed", ("s", "a long string that streams as it comes in pieces")),
    "<think>x</think> then " + call("add", ("a", "1")),
    "reason here</think>\n\nanswer " + call("add", ("a", "1.5"), ("b", "1e3")),
    "still reasoning " + call("get_weather", ("city", "Paris")),
    "reasoning only, never closed",
    "r</think><|im_start|>odd" + call("add", ("a", "2")),
    "ends with <tool_ca",
    "ends inside " + TC + "\n<function=get_wea",
    "text " + TC + "\n<function=add>\n<parameter=b>\n5\n</parameter>\n</function>\n" + TE
    + "\nmore text\n" + call("get_weather", ("city", "Nice")),
    "x" + TC + "<function=typed>\n<parameter=o>\n{\"n\": \"9\", \"m\": [1,\n2]}\n"
    "</parameter>\n<parameter=i>\n003\n</parameter>\n</function>\n" + TE,
]


write_tool_cases(sys.stdout, "qwen3_coder", MARKERS, TOOLS, TEXTS,
                 [(r, k) for r in (None, "qwen3", "deepseek_r1")
                  for k in (None, {"enable_thinking": False}) if k is None or r == "qwen3"])
