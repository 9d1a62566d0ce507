#!/usr/bin/env python3
"""Train `agent`: a tiny reasoning-format model for specd's reasoning-parser tests.

    python scripts/make_models.py --agent

The tokenizer is make_models.py's byte-level BPE plus `<think>` and `</think>` as added,
non-special tokens (ids 4096 and 4097), as DeepSeek-R1 and Qwen3 ship them: they survive
detokenization with skip_special_tokens, and vLLM's `deepseek_r1` / `qwen3` reasoning
parsers find them in the vocabulary. The chat template opens the assistant turn with
`<think>\\n` as DeepSeek-R1's does, and drops the reasoning of earlier assistant turns.

The model (Llama, hidden 128, 2 layers, ~1.5 M parameters) trains in float32 on one
thread for a fixed number of steps on synthetic transcripts of the form
`short reasoning\\n</think>\\n\\nanswer<|im_end|>`, so that greedy decoding really closes
the reasoning block after a few tokens and then answers. About two minutes on an idle
core; deterministic for a machine type. Rebuilt when RECIPE changes.
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

NAME = "agent"
THINK_START = "<think>"
THINK_END = "</think>"
SEED = 2718
SEQ_LEN = 128
CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{% for message in messages %}"
    "{% set content = message['content'] %}"
    "{% if message['role'] == 'assistant' and '</think>' in content %}"
    "{% set content = content.split('</think>')[-1].lstrip() %}"
    "{% endif %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + content + '<|im_end|>\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n<think>\\n' }}{% endif %}"
)
RECIPE = {
    "seed": SEED,
    "seq_len": SEQ_LEN,
    "steps": 500,
    "batch": 8,
    "lr": 3e-3,
    "transcripts": 6000,
    "architecture": dict(hidden_size=128, num_hidden_layers=2, num_attention_heads=4,
                         num_key_value_heads=2, intermediate_size=344,
                         tie_word_embeddings=True),
    "template": CHAT_TEMPLATE,
    "data": 2,
}
WORDS = ("river stone cloud apple table green quiet window paper light garden seven "
         "orange silver winter music bridge candle forest little").split()

log = mm.log


def build_tokenizer(src: Path, out: Path) -> None:
    """make_models' tokenizer with the two think tokens added (not special)."""
    from tokenizers import AddedToken, Tokenizer
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer.from_file(str(src / "tokenizer.json"))
    tok.add_tokens([AddedToken(t, special=False, normalized=False)
                    for t in (THINK_START, THINK_END)])
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token=mm.BOS, eos_token=mm.EOS,
                                   pad_token=mm.EOS, model_max_length=2048,
                                   clean_up_tokenization_spaces=False)
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(str(out))
    cfg_path = out / "tokenizer_config.json"
    cfg = json.loads(cfg_path.read_text())
    cfg.update(chat_template=CHAT_TEMPLATE, add_bos_token=True,
               tokenizer_class="PreTrainedTokenizerFast")
    cfg_path.write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")
    ids = [tok.token_to_id(t) for t in (THINK_START, THINK_END)]
    assert ids == [mm.VOCAB_SIZE, mm.VOCAB_SIZE + 1], ids


def transcript(rng: random.Random) -> tuple[str, str, str]:
    """One synthetic (question, reasoning, answer)."""
    kind = rng.randrange(4)
    if kind == 0:
        a, b = rng.randrange(2, 60), rng.randrange(2, 40)
        return (f"What is {a} plus {b}?", f"{a} plus {b} makes {a + b}.",
                f"The answer is {a + b}.")
    if kind == 1:
        w = rng.choice(WORDS)
        return (f"Spell {w} backwards.", f"The letters of {w} reversed are {w[::-1]}.",
                w[::-1])
    if kind == 2:
        phrase = " ".join(rng.choice(WORDS) for _ in range(rng.randrange(2, 6)))
        return (f"Repeat after me: {phrase}", "The user wants the phrase repeated.", phrase)
    n = rng.randrange(3, 9)
    seq = ", ".join(str(i) for i in range(1, n + 1))
    return (f"Count to {n}.", f"I count from 1 to {n}.", f"{seq}.")


def build_stream(tok, count: int) -> torch.Tensor:
    rng = random.Random(SEED)
    ids: list[int] = []
    for _ in range(count):
        q, r, a = transcript(rng)
        prompt = tok.apply_chat_template([{"role": "user", "content": q}], tokenize=False,
                                         add_generation_prompt=True)
        text = f"{prompt}{r}\n{THINK_END}\n\n{a}{mm.IM_END}\n"
        ids += tok(text, add_special_tokens=False)["input_ids"]
    return torch.tensor(ids, dtype=torch.int64)


def train(out: Path, tok_dir: Path) -> None:
    from transformers import AutoTokenizer, LlamaForCausalLM

    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    tok = AutoTokenizer.from_pretrained(str(tok_dir))
    stream = build_stream(tok, RECIPE["transcripts"])
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
            log(f"  {NAME} step {i + 1}/{steps} loss {loss.item():.3f} "
                f"({time.monotonic() - start:.0f} s)")
    hf = LlamaForCausalLM(cfg)
    missing, unexpected = hf.load_state_dict(model.state_dict(), strict=False)
    assert not unexpected and set(missing) <= {"lm_head.weight"}, (missing, unexpected)
    hf.tie_weights()
    hf.eval()
    tm.check_parity(model, hf)
    meta = {"kind": "trained", "name": NAME, "recipe": RECIPE,
            "train_seconds": round(time.monotonic() - start, 1),
            "final_loss": round(loss.item(), 4)}
    mm.save_model(hf, tok_dir, out, meta)
    check_format(out, tok)


def check_format(out: Path, tok) -> None:
    """The model must close the reasoning block and answer (what the tests rely on)."""
    from transformers import LlamaForCausalLM

    model = LlamaForCausalLM.from_pretrained(str(out)).eval()
    end = tok.convert_tokens_to_ids(THINK_END)
    closed = 0
    questions = ["What is 12 plus 7?", "Spell garden backwards.", "Count to 5.",
                 "Repeat after me: quiet river light"]
    for q in questions:
        ids = tok.apply_chat_template([{"role": "user", "content": q}],
                                      add_generation_prompt=True, return_tensors="pt",
                                      return_dict=True)["input_ids"]
        with torch.no_grad():
            gen = model.generate(ids, max_new_tokens=40, do_sample=False)[0, ids.shape[1]:]
        closed += int(end in gen.tolist())
        log(f"  {NAME} sample: {q!r} -> {tok.decode(gen)!r}")
    assert closed == len(questions), f"only {closed}/{len(questions)} samples closed </think>"


def up_to_date(root: Path) -> bool:
    try:
        meta = json.loads((root / NAME / "specd-model.json").read_text())
    except (OSError, ValueError):
        return False
    return (root / NAME / mm.COMPLETE).exists() and meta.get("recipe") == RECIPE


def ensure_agent(root: Path, tok_dir: Path) -> None:
    """Build `agent` if missing or of another recipe (called with make_models' lock)."""
    if up_to_date(root):
        return
    started = time.monotonic()

    def build(out: Path) -> None:
        tok_tmp = out / ".tokenizer"
        tok_tmp.mkdir()
        build_tokenizer(tok_dir, tok_tmp)
        train(out, tok_tmp)  # save_model copies the tokenizer files next to the weights
        shutil.rmtree(tok_tmp)

    mm.install(root / NAME, build)
    log(f"{NAME}: built in {time.monotonic() - started:.0f} s")
