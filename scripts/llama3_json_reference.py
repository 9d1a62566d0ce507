#!/usr/bin/env python3
"""Reference outputs of vLLM's own `llama3_json` tool parser, for specd's unit tests.

    ~/.cache/specd/vllm-venv/bin/python scripts/llama3_json_reference.py \
        > src/speculation/tools/llama3_json_vllm.json

`whole`: for each text, what the chat serving makes of `extract_tool_calls` with
`tool_choice: "auto"` (`DelegatingParser.parse`): the content and every call's name and
arguments.

`streams`: the parser class vLLM's chat serving builds for `--enable-auto-tool-choice
--tool-call-parser llama3_json` (alone, and beside `--reasoning-parser` `deepseek_r1`,
`qwen3` and `kimi_k2`: `ParserManager.get_parser`), driven the way its serving code
drives it: `parse` on the whole answer, `parse_delta` once per generated token (the
token's id and the text released with it, the prompt's ids, `finished` on the last).
The tokenizer is a small stand-in (each token's text is fixed), so the cases can place
`<|python_tag|>` and the think markers as single tokens or spell them over several
tokens, stream one character a step, and hold text back as a stop string does.
Requests: `tool_choice` `auto` and `none`.

`partial`: vLLM's `partial_json_loads` (the `partial_json_parser` library) on every
prefix of random JSON-like texts (nested values, escapes, unicode, `NaN`, `; `-joined
values, stray characters), with and without `Allow.STR`: the value read (as
`json.dumps` writes it) and the characters taken, or null where it raises.
"""
import json
import random
import sys

from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest
from vllm.parser.parser_manager import ParserManager

from engine_tool_reference import Tok as StreamTok, pieces, run, steps_of, write_json


class Tok:
    """The parser only looks its start token up."""

    def get_vocab(self):
        return {"<|python_tag|>": 1}


SPECIAL = ["<|begin_of_text|>", "<|eot_id|>", "<|end_of_text|>"]
MARKERS = ["<|python_tag|>", "<think>", "</think>"]
EOS = "<|eot_id|>"


W = '{"name": "get_weather", "arguments": {"city": "Oslo"}}'
A = '{"name": "add", "parameters": {"a": 3, "b": 2.50}}'
STREAM_TEXTS = [
    W,
    "<|python_tag|>" + W,
    W + "; " + A,
    "<|python_tag|>" + A + "; " + W + "; " + '{"name": "search", "arguments": {"query": "é"}}',
    "Let me check. " + W,
    W + " and then some text",
    W + ";" + A,
    '{"name": "f", "arguments": {"deep": {"x": [1, {"y": null}, true], "s": "a\\"b"}}}',
    '{"name": "日本", "arguments": {"v": "✓ café", "n": -1.5e3}}',
    '{"name": "f", "arguments": {}}',
    '{"name": "f", "arguments": "raw string"}',
    '{"name": "f"}',
    '{"arguments": {"q": 1}, "name": "late"}',
    '{"name": 3, "arguments": {}}',
    '{"name": "f", "arguments": {"x": 1}',
    '{"name": "f", "arguments": {"city": "Os',
    # Cut right after the name: `finalize_generation` appends `{}` only where the name
    # goes out in the last step.
    '{"name": "get_weather", "',
    '{"name": "get_weather",',
    "{not json at all}",
    "plain answer, no call",
    "",
    "<|python_tag|>",
    'x</think>' + W,
    'reason here</think>\n\n' + W,
    'plan it\n</think>' + "<|python_tag|>" + A + "; " + W,
    '<think>r</think>{"name": "f", "arguments": {"k": [1, 2]}}',
    "reasoning only, never closed " + W,
    '{"name": "f", "arguments": {"u": "\\u00e9\\n"}, "extra": [1, 2]}',
]


def stream_cases():
    tok = StreamTok(MARKERS, SPECIAL)
    start, think, end = tok.id("<|begin_of_text|>"), tok.id("<think>"), tok.id("</think>")
    # Reasoning open at the end of the prompt, and closed in it.
    prompts = [[start, tok.id("assistant\n")], [think, tok.id("r"), end]]
    tools = [{"type": "function", "function": {"name": "get_weather"}}]
    msgs = [{"role": "user", "content": "x"}]
    cases = []
    for reasoning in (None, "deepseek_r1", "qwen3", "kimi_k2"):
        for choice in ("auto", "none"):
            req = ChatCompletionRequest(model="m", messages=msgs, tools=tools,
                                        tool_choice=choice)
            for text in STREAM_TEXTS:
                variants = [(False, [1, 2, 3], False, 0), (True, [1], False, 0),
                            (True, [2, 3, 1], True, 1)]
                if choice != "auto" or reasoning not in (None, "deepseek_r1"):
                    variants = [variants[0], variants[2]]
                for split, sizes, hold, pv in variants:
                    prompt = prompts[pv if reasoning else 0]
                    steps = steps_of(tok, pieces(text, split, MARKERS, SPECIAL, sizes), hold,
                                     EOS)
                    case = {"reasoning": reasoning, "choice": choice, "prompt": prompt,
                            "steps": steps}
                    case.update(run("llama3_json", reasoning, None, tok, prompt, steps, req,
                                    whole_ids=False))
                    cases.append(case)
    return tok, cases


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


def partial_cases():
    from partial_json_parser.core.options import Allow
    from vllm.tool_parsers.utils import partial_json_loads

    rng = random.Random(7)
    atoms = ['"a"', '"é✓"', '"x\\\\"', '"q\\"t"', '"\\u00e9"', "1", "-2.5", "1e3", "0",
             "true", "false", "null", "NaN", "-Infinity", "[]", "{}", '"name"']
    keys = ['"name"', '"arguments"', '"k"', '"parameters"']

    def val(d=0):
        r = rng.random()
        if d > 3 or r < 0.4:
            return rng.choice(atoms)
        if r < 0.7:
            sep = ", " if rng.random() < 0.7 else ","
            return "[" + sep.join(val(d + 1) for _ in range(rng.randrange(0, 4))) + "]"
        pairs = (rng.choice(keys) + rng.choice([": ", ":", " : "]) + val(d + 1)
                 for _ in range(rng.randrange(0, 4)))
        return "{" + ", ".join(pairs) + "}"

    out, seen, texts = [], set(), 0
    while texts < 200:
        t = val()
        if rng.random() < 0.3:
            t += rng.choice(["; ", ";", " ", "}", " x"]) + val()
        if rng.random() < 0.1:
            t = " " + t
        if len(t) > 60:
            continue
        texts += 1
        for k in range(1, len(t) + 1):
            p = t[:k]
            if p in seen:
                continue
            seen.add(p)
            for strings in (False, True):
                flags = Allow.ALL if strings else Allow.ALL & ~Allow.STR
                try:
                    v, end = partial_json_loads(p, flags)
                    r = [json.dumps(v, ensure_ascii=False), end]
                except Exception:
                    r = None
                out.append([p, strings, r])
    return out


def main():
    req = ChatCompletionRequest(
        model="m", messages=[{"role": "user", "content": "x"}],
        tools=[{"type": "function", "function": {"name": "f"}}])
    cls = ParserManager.get_parser(tool_parser_name="llama3_json", enable_auto_tools=True)
    whole = []
    for text in TEXTS:
        _, content, calls = cls(Tok(), req.tools).parse(text, req, enable_auto_tools=True)
        whole.append({"text": text, "content": content,
                      "calls": [[c.name, c.arguments] for c in calls or []]})
    tok, streams = stream_cases()
    write_json(sys.stdout, {"vocab": tok.get_vocab(), "special": SPECIAL},
               [("whole", whole), ("streams", streams), ("partial", partial_cases())])


main()
