"""Shared driver of the reference scripts for vLLM's grammar-engine tool parsers
(`kimi_k2_tool_reference.py`, `qwen3_coder_tool_reference.py`).

The parser class is the one vLLM's chat serving builds for `--enable-auto-tool-choice
--tool-call-parser NAME` (with a `--reasoning-parser` or without: `ParserManager.get_parser`),
driven the way its serving code drives it: `parse` on a whole answer; `parse_delta` once
per generated token (the token's id and the text released with it, the prompt's ids on
every call, `finished` on the last). The tokenizer is a small stand-in (each token's
text is fixed), so the cases can place markers as single tokens or spell them over
several tokens, and hold text back as a stop string does.
"""
import json

from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest
from vllm.parser.parser_manager import ParserManager

SPECIAL = ["<|im_start|>", "<|im_end|>", "<|endoftext|>"]
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


def pieces(text, split_markers, markers):
    """Cut `text` into tokens: markers whole (unless `split_markers`), other text in
    runs of 1, 2 and 3 characters."""
    out, i, n = [], 0, 0
    every = SPECIAL + markers
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


def run(tool_parser, reasoning, kwargs, tok, prompt, steps, req):
    cls = ParserManager.get_parser(tool_parser_name=tool_parser,
                                   reasoning_parser_name=reasoning, enable_auto_tools=True)
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


def requests(tools):
    msgs = [{"role": "user", "content": "x"}]
    return [
        ("auto", ChatCompletionRequest(model="m", messages=msgs, tools=tools)),
        ("none", ChatCompletionRequest(model="m", messages=msgs, tools=tools,
                                       tool_choice="none")),
        ("no_tools", ChatCompletionRequest(model="m", messages=msgs)),
    ]


def write(out, tok, tools, cases):
    out.write('{"vocab": %s, "special": %s, "tools": %s,\n"cases": [\n' % (
        json.dumps(tok.get_vocab(), ensure_ascii=False), json.dumps(SPECIAL),
        json.dumps(tools)))
    out.write(",\n".join(json.dumps(c, ensure_ascii=False) for c in cases))
    out.write("\n]}\n")
