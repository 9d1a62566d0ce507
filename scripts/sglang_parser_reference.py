"""What SGLang's own parser classes make of fixed answers, for specd's unit tests.

Run with the SGLang venv (scripts/sglang-cpu-upstream.sh install):

    ~/.cache/specd/sglang-venv/bin/python scripts/sglang_parser_reference.py \
        > src/speculation/tools/sglang_reference.json

It records, as SGLang 0.5.23's chat serving composes them (`serving_chat.py`):
- `partial`: `_partial_json_loads` (partial_json_parser's `loads`, then `raw_decode` on
  extra data or an unbalanced closer) of every prefix of a few call texts and of texts
  that take the wrapper's own paths, with strings allowed and not, and the name of
  the exception where it raises;
- `hermes`: the `hermes` detector on answers, whole (`_process_tool_calls`) and
  streamed chunk by chunk (`parse_stream_chunk`, `parse_stream_end` and
  `_check_for_unstreamed_tool_args` on the last);
- `r1`: the `deepseek-r1` reasoning parser, whole and streamed the same way.
"""

import json
import re
import sys

from partial_json_parser.core.options import Allow
from sglang.srt.entrypoints.openai.protocol import Tool
from sglang.srt.function_call.function_call_parser import FunctionCallParser
from sglang.srt.function_call.utils import _partial_json_loads
from sglang.srt.parser.reasoning_parser import ReasoningParser

NAMES = ["get_weather", "add", "search"]
TOOLS = [
    Tool(type="function", function={"name": n, "parameters": {"type": "object"}})
    for n in NAMES
]

CALL_TEXTS = [
    '{"name": "get_weather", "arguments": {"city": "Oslo"}}',
    '\n{"name": "add", "arguments": {"a": 3, "b": 11.5}}\n</tool_call>',
    '{"name": "search", "parameters": {"query": "green river", "tags": ["a", "b\\"c"], '
    '"n": -1e5, "ok": true, "x": null}}',
    '{"name": "get_weather", "arguments": {"city": "S\\u00e3o Paulo", "days": [1, 2]}}',
]

# Texts on which `_partial_json_loads` leaves the library's plain path: leading
# whitespace before extra data, a closer with nothing open ("pop from empty list"),
# `fix_fast`'s assertions, `_fix`'s errors, Python-only whitespace, non-ASCII text.
WRAPPER_TEXTS = [
    '  {"name": "add", "arguments": {"a": 1}}  </tool_call>',
    '{"name": "add", "arguments": {"a": [1, 2]}}}\n',
    '{"a": [1] 2}',
    '{"a": 1, 2}',
    '{"a": 1, "b": 2 3}',
    '\t"partial string',
    '{"a": 1,\x1c',
    ' {"city": "Z\u00fcrich", "n": -.5e} x',
]

ANSWERS = [
    'I will check.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo"}}\n'
    "</tool_call>",
    '<tool_call>\n{"name": "add", "arguments": {"a": 3, "b": 4}}\n</tool_call>\n'
    '<tool_call>\n{"name": "search", "arguments": {"query": "river"}}\n</tool_call>',
    '  Let me see.  <tool_call>\n{"name": "unknown", "arguments": {"x": 1}}\n</tool_call>',
    '<tool_call>{"name": "search", "parameters": {"query": "quiet"}}</tool_call>',
    '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Li',
    "It is sunny in Oslo. <tool",
    "Done.</tool_call> really",
    '<tool_call>\n{"name": "add", "arguments": {"a": 1e400}}\n</tool_call>',
    '<tool_call>\nnot json\n</tool_call>',
    "No tools needed here.",
]

REASONING = [
    "<think>Let me think.</think>The answer.",
    "Plain thought</think>\n\nAnswer <tool_call>",
    "<think><think>double</think>x</think>y",
    "never closed <thi",
    "</think>",
    "a </thi",
]


def chunks(text):
    """Token-like pieces: words with their leading space, markup tags, punctuation."""
    return re.findall(r"</?\w+>|\s*\w+|\s+|.", text, re.S)


def by_char(text):
    return list(text)


def partial_cases():
    out = []
    for text in CALL_TEXTS + WRAPPER_TEXTS:
        for n in range(1, len(text) + 1):
            for strings in (True, False):
                flags = Allow.ALL if strings else Allow.ALL & ~Allow.STR
                try:
                    obj, end = _partial_json_loads(text[:n], flags)
                    res = {"value": json.dumps(obj, ensure_ascii=False), "end": end}
                    raised = None
                except Exception as e:
                    res, raised = None, type(e).__name__
                out.append(
                    {"text": text[:n], "strings": strings, "result": res, "raised": raised}
                )
    return out


def call_view(c):
    return {"index": c.tool_index, "name": c.name, "parameters": c.parameters}


def hermes_whole(text):
    parser = FunctionCallParser(TOOLS, "hermes")
    if not parser.has_tool_call(text):
        return {"content": text, "calls": []}
    normal, calls = parser.parse_non_stream(text)
    return {"content": normal, "calls": [call_view(c) for c in calls]}


def hermes_stream(pieces):
    parser = FunctionCallParser(TOOLS, "hermes")
    steps = []
    for i, piece in enumerate(pieces):
        normal, calls = parser.parse_stream_chunk(piece)
        calls = list(calls)
        if i == len(pieces) - 1:
            end_text, end_calls = parser.parse_stream_end()
            normal = (normal or "") + end_text
            calls += end_calls
            d = parser.detector
            if d.prev_tool_call_arr and d.streamed_args_for_tool:
                k = len(d.prev_tool_call_arr) - 1
                if k < len(d.streamed_args_for_tool):
                    exp = d.prev_tool_call_arr[k].get("arguments", {})
                    exp = exp if isinstance(exp, str) else json.dumps(exp, ensure_ascii=False)
                    act = d.streamed_args_for_tool[k]
                    rest = exp[len(act):] if exp.startswith(act) else ""
                    if rest:
                        calls.append({"index": k, "name": None, "parameters": rest})
        steps.append(
            {
                "piece": piece,
                "content": normal,
                "calls": [c if isinstance(c, dict) else call_view(c) for c in calls],
            }
        )
    return steps


def r1_stream(pieces):
    p = ReasoningParser("deepseek-r1", stream_reasoning=True, force_reasoning=True)
    steps = []
    for i, piece in enumerate(pieces):
        r, c = p.parse_stream_chunk(piece)
        if i == len(pieces) - 1:
            er, ec = p.parse_stream_end()
            r = (r or "") + (er or "")
            c = (c or "") + (ec or "")
        steps.append({"piece": piece, "reasoning": r or "", "content": c or ""})
    return steps


def main():
    hermes = []
    for text in ANSWERS:
        for split in (chunks, by_char):
            hermes.append(
                {"text": text, "whole": hermes_whole(text), "stream": hermes_stream(split(text))}
            )
    r1 = []
    for text in REASONING:
        p = ReasoningParser("deepseek-r1", stream_reasoning=False, force_reasoning=True)
        r, c = p.parse_non_stream(text)
        for split in (chunks, by_char):
            r1.append(
                {
                    "text": text,
                    "whole": {"reasoning": r or "", "content": c or ""},
                    "stream": r1_stream(split(text)),
                }
            )
    json.dump(
        {"names": NAMES, "partial": partial_cases(), "hermes": hermes, "r1": r1},
        sys.stdout,
        ensure_ascii=False,
        indent=0,
    )
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
