#!/usr/bin/env python3
"""Reference outputs of vLLM's own `kimi_k2` tool parser, for specd's unit tests.

    ~/.cache/specd/vllm-venv/bin/python scripts/kimi_k2_tool_reference.py \
        > src/speculation/tools/kimi_k2_vllm.json

Driven by `engine_tool_reference.py` (alone, and with `--reasoning-parser kimi_k2`).
Requests: `tool_choice` `auto` and `none` with tools whose schemas type the arguments,
and none without tools; thinking on and off.
"""
import sys

from engine_tool_reference import write_tool_cases

MARKERS = [
    "<think>", "</think>", "<|tool_calls_section_begin|>", "<|tool_calls_section_end|>",
    "<|tool_call_begin|>", "<|tool_call_end|>", "<|tool_call_argument_begin|>",
]
S, E = "<|tool_calls_section_begin|>", "<|tool_calls_section_end|>"
B, A, C = "<|tool_call_begin|>", "<|tool_call_argument_begin|>", "<|tool_call_end|>"


def call(header, args):
    return f"{B}{header}{A}{args}{C}"


TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "parameters": {
        "type": "object", "properties": {"city": {"type": "string"}}}}},
    {"type": "function", "function": {"name": "add", "parameters": {
        "type": "object", "properties": {"a": {"type": "number"}, "b": {"type": "number"}}}}},
    {"type": "function", "function": {"name": "typed", "parameters": {
        "type": "object", "properties": {
            "i": {"type": "integer"}, "f": {"type": "boolean"}, "s": {"type": "string"},
            "o": {"type": "object", "properties": {"n": {"type": "integer"}}},
            "l": {"type": "array", "items": {"type": "number"}},
            "u": {"anyOf": [{"type": "integer"}, {"type": "null"}]}}}}},
]

J1 = '{"city": "Oslo"}'
TYPED = ('{"i": "7", "f": 1, "s": 5, "o": {"n": "4"}, "l": [1, "2.5"], '
         '"u": "null"}')
TEXTS = [
    "plain answer",
    "",
    "   \n ",
    "Let me check." + S + call("functions.get_weather:0", J1) + E,
    S + call("functions.add:0", '{"a": 3, "b": 2.0}')
    + call("functions.get_weather:1", '{"city":"Lima"}') + E,
    "\n\n" + S + call("functions.typed:2", TYPED) + E + " trailing",
    S + call(" functions.get_weather:0 ", ' {"city": "caf\\u00e9 é"} '),
    S + B + "functions.add:0" + A + '{"a": 1, "b": {"x": [1, 2]}',
    S + call("functions.add:0", "{}") + call("functions.get_weather", '{"city": "Rome"}') + E,
    S + call("functions.add:0", "") + E,
    S + B + "functions.add:0" + C + E,
    S + call("get_weather", '{"name": "get_weather", "arguments": {"city": "X"}}') + E,
    S + call("functions.get_weather:0", '{"city": "Oslo"}}}') + E,
    "a < b " + S + "oops" + call("functions.get_weather:7", '{"city": "a\\\\\\"}"}') + E,
    "<think>x</think> then " + S + call("functions.add:0", '{"a": 1}'),
    "reason here</think>\n\nanswer " + S + call("functions.add:0", '{"a": 1.5, "b": 1e3}') + E,
    "still reasoning " + S + call("functions.get_weather:0", '{"city": "Paris"}') + E,
    "reasoning only, never closed",
    "r</think><|im_start|>odd" + S + call("functions.add:0", '{"a": 2}') + E,
    "ends with <|tool_call",
]


write_tool_cases(sys.stdout, "kimi_k2", MARKERS, TOOLS, TEXTS,
                 [(r, k) for r in (None, "kimi_k2") for k in (None, {"thinking": False})])
