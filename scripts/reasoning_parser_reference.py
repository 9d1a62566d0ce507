#!/usr/bin/env python3
"""Reference outputs of vLLM's own grammar-engine reasoning parsers (`qwen3`,
`kimi_k2`), for specd's unit tests.

    ~/.cache/specd/vllm-venv/bin/python scripts/reasoning_parser_reference.py \
        > src/speculation/reasoning/engine_vllm.json

The parser class is the one vLLM's chat serving builds for `--reasoning-parser NAME`
(`ParserManager.get_parser`), driven the way its serving code drives it: `parse` and
`count_reasoning_tokens` on a whole answer; `parse_delta` once per generated token (the
token's id and the text released with it, the prompt's ids on every call, `finished` on
the last) and `count_reasoning_tokens` after a stream. The tokenizer is a small
stand-in (each token's text is fixed), so the cases can place markers as single tokens,
as text spelled over several tokens, and hold text back as a stop string does. `qwen3` also runs beside the `hermes` tool
parser (`with_hermes`), as `--reasoning-parser qwen3 --tool-call-parser hermes` serves.
"""
import sys

from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest
from vllm.parser.parser_manager import ParserManager

from engine_tool_reference import (SPECIAL, Tok, drive, ids_of, pieces, run as run_tool,
                                   steps_of, write_json)

MARKERS = {
    "qwen3": ["<think>", "</think>", "<tool_call>", "</tool_call>"],
    "kimi_k2": [
        "<think>", "</think>", "<|tool_calls_section_begin|>",
        "<|tool_calls_section_end|>", "<|tool_call_begin|>", "<|tool_call_end|>",
        "<|tool_call_argument_begin|>",
    ],
}
TEXTS = [
    "I add 2 and 3.\n</think>\n\nThe answer is 5.",
    "short",
    "",
    "\n</think>\n\n",
    "a</think>b</think>c",
    "<think>\nplan it\n</think>\n\ndone",
    "x<think>y</think>z",
    "think more   \n\n</think>   \n\n  answer  ",
    "reason <tool_call>\n<function=f>\n<parameter=a>\n1\n</parameter>\n</function>\n</tool_call>",
    "ok</think>\n<tool_call>{\"name\": \"f\"}</tool_call> after",
    "mention <function=g> and a > b < c\n</think>\ntext <think> again",
    "a < b and c <thi",
    "ends with </thi",
    "café ünïcode — 日本語\n</think>\n\nyes ✓",
    "<|im_start|>odd<|im_end|> special</think><|endoftext|>end",
    "sect <|tool_calls_section_begin|><|tool_call_begin|>functions.f:0<|tool_call_argument_begin|>{}<|tool_call_end|><|tool_calls_section_end|>",
    "k2 reasoning \t\n</think>  \n",
    "   \n  ",
    "</think>",
]

# Each parser's switches: thinking on by default, off, and on by a switch (the last two
# need only one prompt and one tokenization).
KWARGS = {
    "qwen3": [None, {"enable_thinking": False}, {"enable_thinking": True}],
    "kimi_k2": [None, {"thinking": False}, {"thinking": True, "enable_thinking": False}],
}


def run(name, kwargs, tok, prompt, steps, req):
    cls = ParserManager.get_parser(reasoning_parser_name=name)
    make = lambda: cls(tok, None, chat_template_kwargs=kwargs)
    # A step's delta as [reasoning, content]; null where vLLM sends no chunk.
    delta = lambda d: None if d is None else [d.reasoning, d.content]
    whole, (reasoning, content, _), p, out = drive(make, prompt, steps, req, delta)
    return {
        "whole": {"reasoning": reasoning, "content": content,
                  "count": whole.count_reasoning_tokens(ids_of(steps))},
        "deltas": out,
        "stream_count": p.count_reasoning_tokens(ids_of(steps)),
    }


TOOL_TEXTS = [
    'plan it\n</think>\n\n<tool_call>\n{"name": "f", "arguments": {"x": 1}}\n</tool_call>',
    'plan <tool_call>{"name": "f", "arguments": {}}</tool_call>',
    'r</think>text only',
    'r</think>pre <tool_call>{"name": "a", "arguments": {"q": "é"}}</tool_call><tool_call>{"name": "b", "arguments": {}}</tool_call>',
    'still thinking <tool_',
    'x</think>\n<tool_call>{"name": "f", "arguments": {"k": [1, 2]}',
    'done</think>  <tool_call>{"bad json</tool_call>',
]


def with_tools_cases():
    tok = Tok(MARKERS["qwen3"])
    im_start, think, end = tok.id("<|im_start|>"), tok.id("<think>"), tok.id("</think>")
    prompts = [[im_start, tok.id("assistant\n")], [think, tok.id("r"), end, tok.id("\n\n")]]
    tools = [{"type": "function", "function": {"name": "f"}}]
    cases = []
    for choice in ("auto", "none"):
        req = ChatCompletionRequest(model="m", messages=[{"role": "user", "content": "x"}],
                                    tools=tools, tool_choice=choice)
        for text in TOOL_TEXTS + TEXTS[:6]:
            for v, prompt in enumerate(prompts):
                steps = steps_of(tok, pieces(text, False, MARKERS["qwen3"]), v == 1)
                case = {"choice": choice, "prompt": prompt, "steps": steps}
                # `qwen3` beside `hermes`.
                case.update(run_tool("hermes", "qwen3", None, tok, prompt, steps, req,
                                     whole_ids=False, delta_ids=False))
                cases.append(case)
    return cases


def main():
    req = ChatCompletionRequest(model="m", messages=[{"role": "user", "content": "x"}])
    cases = []
    for name, markers in MARKERS.items():
        tok = Tok(markers)
        im_start, think, end = tok.id("<|im_start|>"), tok.id("<think>"), tok.id("</think>")
        prompts = [[im_start, tok.id("assistant\n")], [im_start, think, tok.id("\n")],
                   [think, tok.id("r"), end, tok.id("\n\n")]]
        for n, kwargs in enumerate(KWARGS[name]):
            for text in TEXTS:
                for split in (False, True)[: 2 if n == 0 else 1]:
                    toks = pieces(text, split, markers)
                    for v, prompt in enumerate(prompts[: 3 if n == 0 else 1]):
                        stop_eos, hold = v != 1, v == 2
                        steps = steps_of(tok, toks, hold, stop_eos=stop_eos)
                        case = {"parser": name, "kwargs": kwargs, "prompt": prompt,
                                "steps": steps}
                        case.update(run(name, kwargs, tok, prompt, steps, req))
                        cases.append(case)
    vocab = {}
    for name, markers in MARKERS.items():
        vocab[name] = {"tokens": Tok(markers).get_vocab(), "special": SPECIAL}
    write_json(sys.stdout, {"vocab": vocab},
               [("cases", cases), ("with_hermes", with_tools_cases())])


main()
