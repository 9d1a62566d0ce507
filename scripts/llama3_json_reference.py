#!/usr/bin/env python3
"""Reference outputs of vLLM's own `llama3_json` tool parser on whole answers, for
specd's unit tests.

    ~/.cache/specd/vllm-venv/bin/python scripts/llama3_json_reference.py \
        > src/speculation/tools/llama3_json_vllm.json

For each text: what the chat serving makes of `extract_tool_calls` with
`tool_choice: "auto"` (`DelegatingParser.parse`): the content and every call's name and
arguments. (Its streaming parse is not compared: specd passes such streams through.)
"""
import json
import sys

from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest
from vllm.parser.parser_manager import ParserManager


class Tok:
    """The parser only looks its start token up."""

    def get_vocab(self):
        return {"<|python_tag|>": 1}


TEXTS = [
    'plain text',
    '',
    '{"name": "get_weather", "arguments": {"city": "Oslo"}}',
    '<|python_tag|>{"name": "f", "parameters": {"x": 1}}',
    'Sure: {"name": "f", "arguments": {"a": 1.50, "b": -0, "c": 1e3}} done',
    '{"name": "a", "arguments": {}}; {"name": "b", "arguments": {"k": [1, 2]}}',
    '{"name": "a", "arguments": {}}{"name": "b", "arguments": {}}',
    '{"name": "a", "arguments": {}} {"name": "b", "arguments": {}}',
    '{"name": "f"}',
    '{"name": 3, "arguments": {}}',
    '{"arguments": {"q": "café é"}, "name": "s"}',
    '{"name": "f", "arguments": "already a string"}',
    '{"name": "f", "arguments": {"x": 1}, "parameters": {"y": 2}}',
    '{"name": "f", "arguments": {"x": NaN, "y": Infinity, "z": -Infinity}}',
    '{"name": "f", "arguments": {"x": 1}',
    'use {x} here',
    'a {} b',
    '{"name": "f", "arguments": {"s": "a\\u00e9\\n\\"q\\""}}',
    '{"name": "f", "name": "g", "arguments": {"a": 1, "a": 2}}',
    '  {"name": "f", "arguments": {"n": 12345678901234567890, "m": 1.0e-7}}  ',
    '<|python_tag|>',
    'text with } only',
    '{ "name" : "f" , "arguments" : { "deep": {"x": [ {"y": null}, true, false ] } } }',
    '{"name": "f", "arguments": {"x": 1}} trailing {oops',
    '{"name": "日本", "arguments": {"v": "✓"}}',
]


def main():
    req = ChatCompletionRequest(
        model="m", messages=[{"role": "user", "content": "x"}],
        tools=[{"type": "function", "function": {"name": "f"}}])
    cls = ParserManager.get_parser(tool_parser_name="llama3_json", enable_auto_tools=True)
    out = []
    for text in TEXTS:
        _, content, calls = cls(Tok(), req.tools).parse(text, req, enable_auto_tools=True)
        out.append({"text": text, "content": content,
                    "calls": [[c.name, c.arguments] for c in calls or []]})
    json.dump(out, sys.stdout, ensure_ascii=False, indent=0)
    sys.stdout.write("\n")


main()
