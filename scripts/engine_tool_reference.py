"""Shared driver of the reference scripts for vLLM's parsers (`kimi_k2_tool_reference.py`,
`qwen3_coder_tool_reference.py`, `llama3_json_reference.py`,
`reasoning_parser_reference.py`).

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

    def __init__(self, markers, special=SPECIAL):
        self.vocab = {}
        for t in special + markers:
            self.id(t)
        self.all_special_tokens = list(special)
        self.all_special_ids = [self.vocab[t] for t in special]

    def id(self, text):
        return self.vocab.setdefault(text, len(self.vocab) + 1)

    def get_vocab(self):
        return dict(self.vocab)

    def decode(self, ids, **_):
        back = {v: k for k, v in self.vocab.items()}
        return "".join(back[i] for i in ids)


def pieces(text, split_markers, markers, special=SPECIAL, sizes=(1, 2, 3)):
    """Cut `text` into tokens: markers whole (unless `split_markers`), other text in
    runs of the lengths of `sizes` in turn."""
    out, i, n = [], 0, 0
    every = special + markers
    while i < len(text):
        m = next((m for m in every if text.startswith(m, i)), None)
        if m and not split_markers:
            out.append(m)
            i += len(m)
            continue
        size = sizes[n % len(sizes)]
        n += 1
        if not split_markers:
            nxt = min((text.find(m, i + 1) for m in every if text.find(m, i + 1) > 0),
                      default=len(text))
            size = min(size, max(1, nxt - i))
        out.append(text[i:i + size])
        i += size
    return out


def steps_of(tok, toks, hold, eos=EOS, stop_eos=True):
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
        steps.append({"tokens": [[tok.id(eos), eos]], "text": held})
    elif held:
        steps[-1]["text"] += held
    return steps


def ids_of(steps):
    return [i for s in steps for i, _ in s["tokens"]]


def delta_json(d, ids=True):
    """A step's delta as [reasoning, content, calls as [index, id (with `ids`), name,
    arguments]]; null where vLLM sends no chunk."""
    if d is None:
        return None
    calls = [([t.index, t.id] if ids else [t.index])
             + [t.function.name if t.function else None,
                t.function.arguments if t.function else None] for t in d.tool_calls or []]
    return [d.reasoning, d.content, calls]


def drive(make, prompt, steps, req, delta, **parse_kw):
    """`parse` on the whole answer by one parser of `make`, `parse_delta` on every step
    by another: (the first, what `parse` returned, the second, every step's `delta`)."""
    whole = make()
    parsed = whole.parse("".join(s["text"] for s in steps), req,
                         model_output_token_ids=ids_of(steps), **parse_kw)
    p = make()
    out = []
    for k, s in enumerate(steps):
        d = p.parse_delta(s["text"], [i for i, _ in s["tokens"]], req,
                          prompt_token_ids=prompt, finished=k == len(steps) - 1)
        out.append(delta(d))
    return whole, parsed, p, out


def run(tool_parser, reasoning, kwargs, tok, prompt, steps, req, whole_ids=True,
        delta_ids=True):
    """The tool parser `tool_parser` (beside reasoning parser `reasoning`): the whole
    answer's reasoning, content and calls ([id (with `whole_ids`), name, arguments]), and
    every step's delta (call ids with `delta_ids`)."""
    cls = ParserManager.get_parser(tool_parser_name=tool_parser,
                                   reasoning_parser_name=reasoning, enable_auto_tools=True)
    make = lambda: cls(tok, req.tools, chat_template_kwargs=kwargs)
    _, (r, content, calls), _, out = drive(make, prompt, steps, req,
                                           lambda d: delta_json(d, delta_ids),
                                           enable_auto_tools=True)
    return {
        "whole": {"reasoning": r, "content": content,
                  "calls": [([c.id] if whole_ids else []) + [c.name, c.arguments]
                            for c in calls or []]},
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


def write_json(out, head, sections):
    """`head`'s fields, then each (name, items) section one item a line, so that a change
    in vLLM reads as a short diff."""
    out.write("{" + ", ".join(f"{json.dumps(k)}: {json.dumps(v, ensure_ascii=False)}"
                              for k, v in head.items()) + ",\n")
    out.write("\n],\n".join(
        f"{json.dumps(name)}: [\n" + ",\n".join(json.dumps(c, ensure_ascii=False)
                                                for c in items)
        for name, items in sections))
    out.write("\n]}\n")


def write_tool_cases(out, tool_parser, markers, tools, texts, settings):
    """Every text, under every (reasoning parser, `chat_template_kwargs`) of `settings`
    and every request of `requests(tools)`: markers whole, (with thinking on by default
    and `tool_choice: auto`) also spelled over several tokens, and held back after a
    prompt that closed the reasoning."""
    tok = Tok(markers)
    im_start, think, end = tok.id("<|im_start|>"), tok.id("<think>"), tok.id("</think>")
    prompts = [[im_start, tok.id("assistant\n"), think], [think, tok.id("r"), end]]
    cases = []
    for reasoning, kwargs in settings:
        for choice, req in requests(tools):
            for text in texts:
                variants = [(False, False, 0), (True, False, 0), (False, True, 1)]
                if kwargs is not None or choice != "auto":
                    variants = variants[:1]
                for split, hold, pv in variants:
                    prompt = prompts[pv if reasoning else 0]
                    steps = steps_of(tok, pieces(text, split, markers), hold)
                    case = {"reasoning": reasoning, "kwargs": kwargs, "choice": choice,
                            "prompt": prompt, "steps": steps}
                    case.update(run(tool_parser, reasoning, kwargs, tok, prompt, steps, req))
                    cases.append(case)
    write_json(out, {"vocab": tok.get_vocab(), "special": SPECIAL, "tools": tools},
               [("cases", cases)])
