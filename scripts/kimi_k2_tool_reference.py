#!/usr/bin/env python3
"""Reference outputs of vLLM's own `kimi_k2` tool parser, for specd's unit tests.

    ~/.cache/specd/vllm-venv/bin/python scripts/kimi_k2_tool_reference.py \
        > src/speculation/tools/kimi_k2_vllm.json

The parser class is the one vLLM's chat serving builds for `--enable-auto-tool-choice
--tool-call-parser kimi_k2` (alone, and with `--reasoning-parser kimi_k2`:
`ParserManager.get_parser`), driven the way its serving code drives it: `parse` on a
whole answer; `parse_delta` once per generated token (the token's id and the text
released with it, the prompt's ids on every call, `finished` on the last). The tokenizer
is a small stand-in (each token's text is fixed), so the cases can place markers as
single tokens or spell them over several tokens, and hold text back as a stop string
does. Requests: `tool_choice` `auto` and `none` with tools whose schemas type the
arguments, and none without tools; thinking on and off.
"""
import json
import sys

from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest
from vllm.parser.parser_manager import ParserManager

SPECIAL = ["<|im_start|>", "<|im_end|>", "<|endoftext|>"]
MARKERS = [
    "<think>", "</think>", "<|tool_calls_section_begin|>", "<|tool_calls_section_end|>",
    "<|tool_call_begin|>", "<|tool_call_end|>", "<|tool_call_argument_begin|>",
]
EOS = "<|im_end|>"
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


class Tok:
    """A tokenizer whose tokens are fixed strings (ids handed out on first use)."""

    def __init__(self):
        self.vocab = {}
        for t in SPECIAL + MARKERS:
            self.id(t)
        self.all_special_tokens = list(SPECIAL)
        self.all_special_ids = [self.vocab[t] for t in SPECIAL]

    def id(self, text):
        return self.vocab.setdefault(text, len(self.vocab) + 1)

    def get_vocab(self):
        return dict(self.vocab)

    def decode(self, ids, **_):
        back = {v: k for k, v in self.vocab.items()}
        return "".join(back[i] for i in ids)


def pieces(text, split_markers):
    """Cut `text` into tokens: markers whole (unless `split_markers`), other text in
    runs of 1, 2 and 3 characters."""
    out, i, n = [], 0, 0
    every = SPECIAL + MARKERS
    while i < len(text):
        m = next((m for m in every if text.startswith(m, i)), None)
        if m and not split_markers:
            out.append(m)
            i += len(m)
            continue
        size = 1 + n % 3
        n += 1
        if not split_markers:
            nxt = min((text.find(m, i + 1) for m in every if text.find(m, i + 1) > 0),
                      default=len(text))
            size = min(size, max(1, nxt - i))
        out.append(text[i:i + size])
        i += size
    return out


def steps_of(tok, toks, hold):
    """One step per token, the last the unrendered EOS; `hold`: every third token's
    text comes with the next one (as a stop string holds it back)."""
    steps, held = [], ""
    for k, t in enumerate(toks):
        text = held + t
        held = ""
        if hold and k % 3 == 1:
            held, text = text, ""
        steps.append({"tokens": [[tok.id(t), t]], "text": text})
    steps.append({"tokens": [[tok.id(EOS), EOS]], "text": held})
    return steps


def delta_json(d):
    if d is None:
        return None
    calls = [[t.index, t.id, t.function.name if t.function else None,
              t.function.arguments if t.function else None] for t in d.tool_calls or []]
    return [d.reasoning, d.content, calls]


def run(reasoning, kwargs, tok, prompt, steps, req):
    cls = ParserManager.get_parser(tool_parser_name="kimi_k2", reasoning_parser_name=reasoning,
                                   enable_auto_tools=True)
    make = lambda: cls(tok, req.tools, chat_template_kwargs=kwargs)
    ids = [i for s in steps for i, _ in s["tokens"]]
    text = "".join(s["text"] for s in steps)
    r, content, calls = make().parse(text, req, enable_auto_tools=True,
                                     model_output_token_ids=ids)
    p = make()
    out = []
    for k, s in enumerate(steps):
        d = p.parse_delta(s["text"], [i for i, _ in s["tokens"]], req,
                          prompt_token_ids=prompt, finished=k == len(steps) - 1)
        out.append(delta_json(d))
    return {
        "whole": {"reasoning": r, "content": content,
                  "calls": [[c.id, c.name, c.arguments] for c in calls or []]},
        "deltas": out,
    }


def requests():
    msgs = [{"role": "user", "content": "x"}]
    return [
        ("auto", ChatCompletionRequest(model="m", messages=msgs, tools=TOOLS)),
        ("none", ChatCompletionRequest(model="m", messages=msgs, tools=TOOLS, tool_choice="none")),
        ("no_tools", ChatCompletionRequest(model="m", messages=msgs)),
    ]


def main():
    tok = Tok()
    im_start, think, end = tok.id("<|im_start|>"), tok.id("<think>"), tok.id("</think>")
    prompts = [[im_start, tok.id("assistant\n"), think], [think, tok.id("r"), end]]
    cases = []
    for reasoning in (None, "kimi_k2"):
        for kwargs in (None, {"thinking": False}):
            for choice, req in requests():
                for n, text in enumerate(TEXTS):
                    variants = [(False, False, 0), (True, False, 0), (False, True, 1)]
                    if kwargs is not None or choice != "auto":
                        variants = variants[:1]
                    for split, hold, pv in variants:
                        prompt = prompts[pv if reasoning else 0]
                        steps = steps_of(tok, pieces(text, split), hold)
                        case = {"reasoning": reasoning, "kwargs": kwargs, "choice": choice,
                                "prompt": prompt, "steps": steps}
                        case.update(run(reasoning, kwargs, tok, prompt, steps, req))
                        cases.append(case)
    out = sys.stdout
    out.write('{"vocab": %s, "special": %s, "tools": %s,\n"cases": [\n' % (
        json.dumps(tok.get_vocab(), ensure_ascii=False), json.dumps(SPECIAL),
        json.dumps(TOOLS)))
    out.write(",\n".join(json.dumps(c, ensure_ascii=False) for c in cases))
    out.write("\n]}\n")


main()
