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
import json
import sys

from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest
from vllm.parser.parser_manager import ParserManager

SPECIAL = ["<|im_start|>", "<|im_end|>", "<|endoftext|>"]
MARKERS = {
    "qwen3": ["<think>", "</think>", "<tool_call>", "</tool_call>"],
    "kimi_k2": [
        "<think>", "</think>", "<|tool_calls_section_begin|>",
        "<|tool_calls_section_end|>", "<|tool_call_begin|>", "<|tool_call_end|>",
        "<|tool_call_argument_begin|>",
    ],
}
EOS = "<|im_end|>"


class Tok:
    """A tokenizer whose tokens are fixed strings (ids handed out on first use)."""

    def __init__(self, markers):
        self.vocab = {}
        for t in SPECIAL + markers:
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


def pieces(text, markers, split_markers=False):
    """Cut `text` into tokens: markers whole (unless `split_markers`), other text in
    runs of 1, 2 and 3 characters."""
    out, i, n = [], 0, 0
    while i < len(text):
        m = next((m for m in SPECIAL + markers if text.startswith(m, i)), None)
        if m and not split_markers:
            out.append(m)
            i += len(m)
            continue
        size = 1 + n % 3
        n += 1
        nxt = min((text.find(m, i + 1) for m in SPECIAL + markers if text.find(m, i + 1) > 0), default=len(text))
        size = min(size, max(1, nxt - i)) if not split_markers else size
        out.append(text[i:i + size])
        i += size
    return out


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


def delta_json(d):
    """A step's delta as [reasoning, content]; null where vLLM sends no chunk."""
    if d is None:
        return None
    return [d.reasoning, d.content]


def run(name, kwargs, tok, prompt, steps, req):
    cls = ParserManager.get_parser(reasoning_parser_name=name)
    make = lambda: cls(tok, None, chat_template_kwargs=kwargs)
    ids = [i for s in steps for i, _ in s["tokens"]]
    text = "".join(s["text"] for s in steps)
    p = make()
    reasoning, content, _ = p.parse(text, req, model_output_token_ids=ids)
    whole_count = p.count_reasoning_tokens(ids)
    p = make()
    out = []
    for k, s in enumerate(steps):
        d = p.parse_delta(s["text"], [i for i, _ in s["tokens"]], req,
                          prompt_token_ids=prompt, finished=k == len(steps) - 1)
        out.append(delta_json(d))
    return {
        "whole": {"reasoning": reasoning, "content": content, "count": whole_count},
        "deltas": out,
        "stream_count": p.count_reasoning_tokens(ids),
    }


def steps_of(tok, toks, stop_eos, hold):
    """One step per token; `hold`: every third token's text comes with the next one
    (as a stop string holds it back); `stop_eos`: the last step is the unrendered EOS
    (with any text still held)."""
    steps, held = [], ""
    for k, t in enumerate(toks):
        text = held + t
        held = ""
        if hold and k % 3 == 1 and (k + 1 < len(toks) or stop_eos):
            held, text = text, ""
        steps.append({"tokens": [[tok.id(t), t]], "text": text})
    if stop_eos or not steps:
        # Held text comes out with the unrendered EOS, as a stop matcher releases it.
        steps.append({"tokens": [[tok.id(EOS), EOS]], "text": held})
    elif held:
        steps[-1]["text"] += held
    return steps


TOOL_TEXTS = [
    'plan it\n</think>\n\n<tool_call>\n{"name": "f", "arguments": {"x": 1}}\n</tool_call>',
    'plan <tool_call>{"name": "f", "arguments": {}}</tool_call>',
    'r</think>text only',
    'r</think>pre <tool_call>{"name": "a", "arguments": {"q": "é"}}</tool_call><tool_call>{"name": "b", "arguments": {}}</tool_call>',
    'still thinking <tool_',
    'x</think>\n<tool_call>{"name": "f", "arguments": {"k": [1, 2]}',
    'done</think>  <tool_call>{"bad json</tool_call>',
]


def run_with_tools(tok, prompt, steps, req):
    """`qwen3` beside `hermes`: whole (reasoning, content, calls) and every step's
    [reasoning, content, calls as [index, name, arguments]]."""
    cls = ParserManager.get_parser(tool_parser_name="hermes", reasoning_parser_name="qwen3",
                                   enable_auto_tools=True)
    make = lambda: cls(tok, req.tools, chat_template_kwargs=None)
    ids = [i for s in steps for i, _ in s["tokens"]]
    text = "".join(s["text"] for s in steps)
    reasoning, content, calls = make().parse(text, req, enable_auto_tools=True,
                                             model_output_token_ids=ids)
    p = make()
    out = []
    for k, s in enumerate(steps):
        d = p.parse_delta(s["text"], [i for i, _ in s["tokens"]], req,
                          prompt_token_ids=prompt, finished=k == len(steps) - 1)
        if d is None:
            out.append(None)
            continue
        tc = [[t.index, t.function.name if t.function else None,
               t.function.arguments if t.function else None] for t in d.tool_calls]
        out.append([d.reasoning, d.content, tc])
    return {
        "whole": {"reasoning": reasoning, "content": content,
                  "calls": [[c.name, c.arguments] for c in calls or []]},
        "deltas": out,
    }


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
                steps = steps_of(tok, pieces(text, MARKERS["qwen3"]), True, v == 1)
                case = {"choice": choice, "prompt": prompt, "steps": steps}
                case.update(run_with_tools(tok, prompt, steps, req))
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
                    toks = pieces(text, markers, split)
                    for v, prompt in enumerate(prompts[: 3 if n == 0 else 1]):
                        stop_eos, hold = v != 1, v == 2
                        steps = steps_of(tok, toks, stop_eos, hold)
                        case = {"parser": name, "kwargs": kwargs, "prompt": prompt,
                                "steps": steps}
                        case.update(run(name, kwargs, tok, prompt, steps, req))
                        cases.append(case)
    vocab = {}
    for name, markers in MARKERS.items():
        vocab[name] = {"tokens": Tok(markers).get_vocab(), "special": SPECIAL}
    # One case a line, so that a change in vLLM reads as a short diff.
    out = sys.stdout
    out.write('{"vocab": %s,\n"cases": [\n' % json.dumps(vocab, ensure_ascii=False))
    out.write(",\n".join(json.dumps(c, ensure_ascii=False) for c in cases))
    out.write('\n],\n"with_hermes": [\n')
    out.write(",\n".join(json.dumps(c, ensure_ascii=False) for c in with_tools_cases()))
    out.write("\n]}\n")


main()
