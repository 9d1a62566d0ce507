#!/usr/bin/env python3
"""Train `agent-tools`: a tiny reasoning, tool-calling model for specd's tool-call-parser
tests.

    python scripts/make_models.py --agent-tools

The tokenizer is make_models.py's byte-level BPE plus `<think>`, `</think>` (ids 4096,
4097), `<tool_call>` and `</tool_call>` (4098, 4099) as added, non-special tokens, as
Qwen3 ships them. The chat template renders `tools` in a system turn, opens the assistant
turn with `<think>\\n` as DeepSeek-R1's does (earlier turns lose their reasoning),
renders assistant `tool_calls` in the hermes format
(`<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>`) and `tool` messages as
turns of their own, so vLLM's `deepseek_r1` reasoning parser and `hermes` tool parser
read what it writes.

The model (Llama, hidden 128, 2 layers) trains in float32 on one thread for a fixed
number of steps on synthetic agent transcripts: a question, a short reasoning, a tool
call with JSON arguments (sometimes after a short preamble, sometimes two calls), the
tool's result in the next turn, and a reasoned final answer that quotes it; questions no
tool fits are answered directly. About six minutes on a shared core; deterministic for a machine type. Rebuilt
when RECIPE changes.
"""

from __future__ import annotations

import json
import math
import random
import shutil
import time
from pathlib import Path

import torch
import torch.nn.functional as F

import make_models as mm
import train_models as tm

NAME = "agent-tools"
THINK_START = "<think>"
THINK_END = "</think>"
CALL_START = "<tool_call>"
CALL_END = "</tool_call>"
SEED = 3141
SEQ_LEN = 256
CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{% if tools %}"
    "{{ '<|im_start|>system\\n# Tools\\n' }}"
    "{% for tool in tools %}"
    "{{ tool['function']['name'] }}: {{ tool['function']['description'] or '' }}\n"
    "{% endfor %}"
    "{{ 'Call a tool as <tool_call>{\"name\": ..., \"arguments\": ...}</tool_call>.<|im_end|>\\n' }}"
    "{% endif %}"
    "{% for message in messages %}"
    "{% set content = message['content'] or '' %}"
    "{% if message['role'] == 'assistant' and '</think>' in content %}"
    "{% set content = content.split('</think>')[-1].lstrip() %}"
    "{% endif %}"
    "{% if message['role'] == 'assistant' and message['tool_calls'] %}"
    "{{ '<|im_start|>assistant\\n' + content }}"
    "{% for tc in message['tool_calls'] %}"
    "{% set f = tc['function'] %}"
    "{% if not loop.first %}{{ '\\n' }}{% endif %}"
    "{{ '<tool_call>\\n{\"name\": \"' + f['name'] + '\", \"arguments\": ' }}"
    "{% if f['arguments'] is string %}{{ f['arguments'] }}"
    "{% else %}{{ f['arguments'] | tojson }}{% endif %}"
    "{{ '}\\n</tool_call>' }}"
    "{% endfor %}"
    "{{ '<|im_end|>\\n' }}"
    "{% else %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + content + '<|im_end|>\\n' }}"
    "{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n<think>\\n' }}{% endif %}"
)


def tool(name: str, description: str, params: dict) -> dict:
    return {"type": "function", "function": {
        "name": name, "description": description,
        "parameters": {"type": "object", "properties": params,
                       "required": list(params)}}}


TOOLS = [
    tool("get_weather", "the weather in a city", {"city": {"type": "string"}}),
    tool("add", "the sum of two numbers", {"a": {"type": "number"}, "b": {"type": "number"}}),
    tool("search", "search the notes", {"query": {"type": "string"}}),
]
RECIPE = {
    "seed": SEED,
    "seq_len": SEQ_LEN,
    "steps": 600,
    "batch": 8,
    "lr": 3e-3,
    "conversations": 4000,
    "architecture": dict(hidden_size=128, num_hidden_layers=2, num_attention_heads=4,
                         num_key_value_heads=2, intermediate_size=344,
                         tie_word_embeddings=True),
    "template": CHAT_TEMPLATE,
    "tools": TOOLS,
    "data": 2,
}
CITIES = "Paris Rome Oslo Lima Cairo Tokyo Quito Delhi Berlin Madrid".split()
SKIES = "sunny cloudy rainy windy foggy".split()
WORDS = ("river stone cloud apple table green quiet window paper light garden seven "
         "orange silver winter music bridge candle forest little").split()
PREAMBLES = ["Let me check.\n", "I will look that up.\n"]

log = mm.log


class Format:
    """A tool-call format: the model's name, its added tokens, chat template, how an
    assistant turn with calls is written, and the body of its first call."""

    def __init__(self, name, tokens, template, recipe, turn_text, first_args, thinks=True):
        self.name, self.tokens, self.template, self.recipe = name, tokens, template, recipe
        self.turn_text, self.first_args = turn_text, first_args
        # The model reasons (`<think>` opened by the template, closed by the model)
        # before each turn.
        self.thinks = thinks


def build_tokenizer(src: Path, out: Path, fmt=None) -> None:
    """make_models' tokenizer with the format's think and tool-call tokens added (not
    special)."""
    from tokenizers import AddedToken, Tokenizer
    from transformers import PreTrainedTokenizerFast

    fmt = fmt or HERMES
    tok = Tokenizer.from_file(str(src / "tokenizer.json"))
    tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in fmt.tokens])
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token=mm.BOS, eos_token=mm.EOS,
                                   pad_token=mm.EOS, model_max_length=2048,
                                   clean_up_tokenization_spaces=False)
    fast.chat_template = fmt.template
    fast.save_pretrained(str(out))
    cfg_path = out / "tokenizer_config.json"
    cfg = json.loads(cfg_path.read_text())
    cfg.update(chat_template=fmt.template, add_bos_token=True,
               tokenizer_class="PreTrainedTokenizerFast")
    cfg_path.write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")
    ids = [tok.token_to_id(t) for t in fmt.tokens]
    assert ids == [mm.VOCAB_SIZE + i for i in range(len(fmt.tokens))], ids


def call(name: str, args: dict) -> dict:
    return {"type": "function", "function": {"name": name, "arguments": args}}


def task(rng: random.Random) -> tuple[str, list[dict], list[str], str] | tuple[str, str]:
    """(question, calls, their results, the answer quoting them), or (question, answer)
    for a question no tool fits."""
    kind = rng.randrange(5)
    if kind == 0:
        c = rng.choice(CITIES)
        t, sky = rng.randrange(-5, 35), rng.choice(SKIES)
        return (f"What is the weather in {c}?", [call("get_weather", {"city": c})],
                [json.dumps({"city": c, "temperature": t, "sky": sky})],
                f"It is {t} degrees and {sky} in {c}.")
    if kind == 1:
        a, b = rng.randrange(2, 90), rng.randrange(2, 60)
        return (f"What is {a} plus {b}?", [call("add", {"a": a, "b": b})],
                [json.dumps({"sum": a + b})], f"{a} plus {b} is {a + b}.")
    if kind == 2:
        q = " ".join(rng.choice(WORDS) for _ in range(rng.randrange(1, 4)))
        hits = [" ".join(rng.choice(WORDS) for _ in range(2)) for _ in range(2)]
        return (f"Search my notes for {q}.", [call("search", {"query": q})],
                [json.dumps({"results": hits})], f"I found {hits[0]} and {hits[1]}.")
    if kind == 3:
        c1, c2 = rng.sample(CITIES, 2)
        temps = [rng.randrange(-5, 35) for _ in range(2)]
        return (f"Compare the weather in {c1} and {c2}.",
                [call("get_weather", {"city": c1}), call("get_weather", {"city": c2})],
                [json.dumps({"city": c, "temperature": t, "sky": rng.choice(SKIES)})
                 for c, t in zip((c1, c2), temps)],
                f"{c1} has {temps[0]} degrees and {c2} has {temps[1]}.")
    n = rng.randrange(3, 9)
    if rng.randrange(2):
        return (f"Count to {n}.", ", ".join(str(i) for i in range(1, n + 1)) + ".")
    w = rng.choice(WORDS)
    return (f"Spell {w} backwards.", w[::-1])


def reasoning_for(msgs: list[dict]) -> str:
    """The short reasoning before an assistant turn (after `msgs`)."""
    if msgs[-1]["role"] == "tool":
        return "The tool answered."
    q = msgs[-1]["content"]
    if "weather" in q:
        return "The user asks about the weather."
    if "plus" in q:
        return "The add tool sums numbers."
    if "notes" in q:
        return "I should search the notes."
    return "I can answer directly."


def turn_text(m: dict) -> str:
    """An assistant turn as the model writes it (the template's rendering of calls)."""
    calls = [f'{CALL_START}\n{{"name": "{c["function"]["name"]}", "arguments": '
             f'{json.dumps(c["function"]["arguments"], ensure_ascii=False)}}}\n{CALL_END}'
             for c in m.get("tool_calls", [])]
    return m["content"] + "\n".join(calls)


def hermes_args(text: str) -> str:
    body = text.split(CALL_START, 1)[-1].split(CALL_END, 1)[0]
    return json.dumps(json.loads(body)["arguments"]) if CALL_START in text else ""


HERMES = Format(NAME, [THINK_START, THINK_END, CALL_START, CALL_END], CHAT_TEMPLATE, RECIPE,
                turn_text, hermes_args)


def conversation(rng: random.Random) -> tuple[list[dict], list[dict] | None]:
    """One whole synthetic conversation and the tools it was given."""
    t = task(rng)
    if len(t) == 2:
        q, a = t
        tools = TOOLS if rng.randrange(4) else None
        return [{"role": "user", "content": q}, {"role": "assistant", "content": a}], tools
    q, calls, results, answer = t
    pre = rng.choice(PREAMBLES) if rng.randrange(4) == 0 else ""
    for k, c in enumerate(calls):
        c["id"] = f"functions.{c['function']['name']}:{k}"
    msgs = [{"role": "user", "content": q},
            {"role": "assistant", "content": pre, "tool_calls": calls}]
    msgs += [{"role": "tool", "content": r} for r in results]
    msgs.append({"role": "assistant", "content": answer})
    return msgs, TOOLS


def training_text(tok, msgs: list[dict], tools, fmt=None) -> str:
    """Each assistant turn after the prompt the template renders for it, reasoning
    first (the template drops the reasoning of earlier turns)."""
    text = ""
    for k, m in enumerate(msgs):
        if m["role"] != "assistant":
            continue
        prompt = tok.apply_chat_template(msgs[:k], tools=tools, tokenize=False,
                                         add_generation_prompt=True)
        fmt = fmt or HERMES
        turn = fmt.turn_text(m)
        if fmt.thinks:
            turn = f"{reasoning_for(msgs[:k])}\n{THINK_END}\n\n{turn}"
        text += f"{prompt}{turn}{mm.IM_END}\n"
    return text


def build_stream(tok, count: int, fmt=None) -> torch.Tensor:
    rng = random.Random(SEED)
    ids: list[int] = []
    for _ in range(count):
        msgs, tools = conversation(rng)
        ids += tok(training_text(tok, msgs, tools, fmt), add_special_tokens=False)["input_ids"]
    return torch.tensor(ids, dtype=torch.int64)


def train(out: Path, tok_dir: Path, fmt=None) -> None:
    from transformers import AutoTokenizer, LlamaForCausalLM

    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    fmt = fmt or HERMES
    tok = AutoTokenizer.from_pretrained(str(tok_dir))
    stream = build_stream(tok, RECIPE["conversations"], fmt)
    cfg = mm.llama_config(RECIPE["architecture"])
    cfg.vocab_size = len(tok)
    torch.manual_seed(SEED)
    model = tm.LeanLlama(cfg)
    opt = torch.optim.AdamW(model.parameters(), lr=RECIPE["lr"], betas=(0.9, 0.95),
                            weight_decay=0.0)
    steps, batch = RECIPE["steps"], RECIPE["batch"]
    g = torch.Generator().manual_seed(SEED)
    start = time.monotonic()
    for i in range(steps):
        lr = RECIPE["lr"] * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * i / steps)))
        for group in opt.param_groups:
            group["lr"] = lr
        starts = torch.randint(0, len(stream) - SEQ_LEN - 1, (batch,), generator=g)
        rows = torch.stack([stream[s:s + SEQ_LEN + 1] for s in starts.tolist()])
        # float32 throughout: autocast to bf16 is far slower on CPUs without native bf16.
        logits = model(rows[:, :-1])
        loss = F.cross_entropy(logits.flatten(0, 1), rows[:, 1:].flatten())
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        if (i + 1) % 100 == 0:
            log(f"  {fmt.name} step {i + 1}/{steps} loss {loss.item():.3f} "
                f"({time.monotonic() - start:.0f} s)")
    hf = LlamaForCausalLM(cfg)
    missing, unexpected = hf.load_state_dict(model.state_dict(), strict=False)
    assert not unexpected and set(missing) <= {"lm_head.weight"}, (missing, unexpected)
    hf.tie_weights()
    hf.eval()
    tm.check_parity(model, hf)
    meta = {"kind": "trained", "name": fmt.name, "recipe": fmt.recipe,
            "train_seconds": round(time.monotonic() - start, 1),
            "final_loss": round(loss.item(), 4)}
    mm.save_model(hf, tok_dir, out, meta)
    check_format(out, tok, fmt)


def check_format(out: Path, tok, fmt) -> None:
    """Most tool questions must get a reasoning and a well-formed call (what the tests
    rely on)."""
    from transformers import LlamaForCausalLM

    model = LlamaForCausalLM.from_pretrained(str(out)).eval()
    good = 0
    questions = ["What is the weather in Oslo?", "What is 12 plus 7?",
                 "Search my notes for green river.", "Compare the weather in Rome and Lima."]
    for q in questions:
        ids = tok.apply_chat_template([{"role": "user", "content": q}], tools=TOOLS,
                                      add_generation_prompt=True, return_tensors="pt",
                                      return_dict=True)["input_ids"]
        with torch.no_grad():
            gen = model.generate(ids, max_new_tokens=80, do_sample=False)[0, ids.shape[1]:]
        text = tok.decode(gen, skip_special_tokens=True)
        log(f"  {fmt.name} sample: {q!r} -> {text!r}")
        try:
            good += int((THINK_END in text or not fmt.thinks) and bool(fmt.first_args(text)))
        except (ValueError, KeyError, TypeError):
            pass
    assert good >= 3, f"only {good}/{len(questions)} samples made a tool call"


def up_to_date(root: Path, fmt) -> bool:
    try:
        meta = json.loads((root / fmt.name / "specd-model.json").read_text())
    except (OSError, ValueError):
        return False
    return (root / fmt.name / mm.COMPLETE).exists() and meta.get("recipe") == fmt.recipe


def ensure_agent_tools(root: Path, tok_dir: Path, fmt=None) -> None:
    """Build the format's model if missing or of another recipe (under its own lock,
    taken by make_models)."""
    fmt = fmt or HERMES
    if up_to_date(root, fmt):
        return
    started = time.monotonic()

    def build(out: Path) -> None:
        tok_tmp = out / ".tokenizer"
        tok_tmp.mkdir()
        build_tokenizer(tok_dir, tok_tmp, fmt)
        train(out, tok_tmp, fmt)  # save_model copies the tokenizer files next to the weights
        shutil.rmtree(tok_tmp)

    mm.install(root / fmt.name, build)
    log(f"{fmt.name}: built in {time.monotonic() - started:.0f} s")
