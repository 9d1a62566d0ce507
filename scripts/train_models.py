#!/usr/bin/env python3
"""Train specd's small target/draft pair on a corpus that ships with Python.

    python scripts/train_models.py           # same as: make_models.py --trained

The corpus is the Python standard library (source files, without tests), the prose of
its `pydoc_data` help topics, and short chat conversations built from both, so that the
models see code, prose and the chat format. Both models share make_models.py's
byte-level BPE tokenizer and train on the same token windows:

  target-trained  Llama, hidden 512, 2 layers, ~10.2 M parameters, 1100 steps
  draft-trained   Llama, hidden 192, 3 layers, tied embeddings, ~2.0 M parameters, 800 steps
  draft-xtok      draft-trained's recipe with its own tokenizer (make_models' tokenizer-xtok:
                  6000 tokens, other merges), ~2.3 M parameters: a cross-vocabulary draft,
                  trained on the same text windows as the others, re-encoded

Training runs in float32 with a fixed number of steps, fixed seeds, deterministic
algorithms and a fixed thread count (SPECD_TRAIN_THREADS, default 1 per model; the two
models train in parallel processes), so a machine type reproduces the same weights.
float32, not bfloat16 autocast: on a CPU without native bf16 (AVX2 only) autocast made a
target step 18x slower (15 s against 0.85 s), which turned ten minutes into hours. Models are saved as
float32 safetensors in the same layout as the random-weight models.
"""

from __future__ import annotations

import json
import math
import os
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parent))
import make_models as mm  # noqa: E402

SEED = 4321
# Threads per training process; results are reproducible for a fixed value.
THREADS = int(os.environ.get("SPECD_TRAIN_THREADS", "1"))
SEQ_LEN = 256
# Fractions of training windows drawn from each source.
MIX = {"code": 0.55, "prose": 0.3, "chat": 0.15}

# Recipe: at this budget (~10 minutes on 2 cores, each model on one) depth learns slowly
# per step: a 384-wide 6-layer target stayed above loss 5.9 after 250 steps at any
# learning rate tried (7e-4 to 4e-3), a 512-wide 2-layer one reached 5.5 and, with 1100 steps, ends well
# below the draft. The draft gets fewer steps than the target so that, like real drafts,
# it is the weaker model; its steps cost under half a target step, so it finishes first.
TRAINED_MODELS = {
    "target-trained": dict(
        arch=dict(hidden_size=512, num_hidden_layers=2, num_attention_heads=8,
                  num_key_value_heads=2, intermediate_size=1536, tie_word_embeddings=False),
        steps=int(os.environ.get("SPECD_TRAIN_TARGET_STEPS", "1100")), batch=4, lr=2e-3,
    ),
    "draft-trained": dict(
        arch=dict(hidden_size=192, num_hidden_layers=3, num_attention_heads=3,
                  num_key_value_heads=1, intermediate_size=512, tie_word_embeddings=True),
        steps=int(os.environ.get("SPECD_TRAIN_DRAFT_STEPS", "800")), batch=4, lr=2e-3,
    ),
    # draft-trained's recipe with tokenizer-xtok's vocabulary: a cross-vocabulary draft.
    "draft-xtok": dict(
        arch=dict(hidden_size=192, num_hidden_layers=3, num_attention_heads=3,
                  num_key_value_heads=1, intermediate_size=512, tie_word_embeddings=True),
        steps=int(os.environ.get("SPECD_TRAIN_DRAFT_STEPS", "800")), batch=4, lr=2e-3,
        tokenizer="tokenizer-xtok",
    ),
}

log = mm.log


# ----------------------------------------------------------------------------- data


def help_topics() -> list[tuple[str, str]]:
    from pydoc_data.topics import topics

    return [(k, topics[k].strip()) for k in sorted(topics)]


def chat(tok, user: str, assistant: str) -> list[int]:
    msgs = [{"role": "user", "content": user}, {"role": "assistant", "content": assistant}]
    text = tok.apply_chat_template(msgs, tokenize=False)
    return tok(text, add_special_tokens=False)["input_ids"]


def build_streams(tok) -> dict[str, torch.Tensor]:
    """Token streams per source; documents are separated by EOS and start with BOS."""
    bos, eos = tok.convert_tokens_to_ids([mm.BOS, mm.EOS])
    root = mm.stdlib_dir()
    files = [f for f in mm.corpus_files() if f.suffix == ".py"]
    code: list[int] = []
    chats: list[int] = []
    for i, f in enumerate(files):
        text = mm.read_text(f)
        code += [bos] + tok(text, add_special_tokens=False)["input_ids"] + [eos]
        if i % 3 == 0:
            name = f.relative_to(root).with_suffix("").as_posix().replace("/", ".")
            chats += chat(tok, f"Show me the start of the Python module {name}.", text[:1200])
    prose: list[int] = []
    for key, text in help_topics():
        prose += [bos] + tok(text, add_special_tokens=False)["input_ids"] + [eos]
        chats += chat(tok, f"Explain '{key}' in Python.", text[:1500])
    return {k: torch.tensor(v, dtype=torch.int64)
            for k, v in (("code", code), ("prose", prose), ("chat", chats))}


def batches(streams: dict[str, torch.Tensor], steps: int, batch: int, seed: int):
    """Yield `steps` batches of (SEQ_LEN + 1)-token windows, sources mixed per MIX."""
    g = torch.Generator().manual_seed(seed)
    names = list(MIX)
    probs = torch.tensor([MIX[n] for n in names])
    for _ in range(steps):
        src = torch.multinomial(probs, batch, replacement=True, generator=g)
        rows = []
        for s in src.tolist():
            stream = streams[names[s]]
            start = int(torch.randint(0, len(stream) - SEQ_LEN - 1, (1,), generator=g))
            rows.append(stream[start:start + SEQ_LEN + 1])
        yield torch.stack(rows)


def reencoded(data, from_dir: Path, to_dir: Path):
    """The same windows in another vocabulary: each window's text re-encoded, the batch
    cut to its shortest row. A draft with its own tokenizer then trains on the text the
    target trained on, in the same order, as the same-vocabulary draft does."""
    from transformers import AutoTokenizer

    src, dst = AutoTokenizer.from_pretrained(str(from_dir)), AutoTokenizer.from_pretrained(str(to_dir))
    for batch in data:
        rows = [dst(src.decode(r.tolist()), add_special_tokens=False)["input_ids"] for r in batch]
        n = min(SEQ_LEN + 1, *(len(r) for r in rows))
        yield torch.tensor([r[:n] for r in rows], dtype=torch.int64)


# ---------------------------------------------------------------------------- model


class Block(nn.Module):
    """One Llama decoder layer; parameter names match transformers' LlamaDecoderLayer."""

    def __init__(self, h: int, heads: int, kv_heads: int, inter: int, eps: float):
        super().__init__()
        d = h // heads
        self.heads, self.kv_heads, self.d, self.eps = heads, kv_heads, d, eps
        self.input_layernorm = nn.Module()
        self.input_layernorm.weight = nn.Parameter(torch.ones(h))
        self.post_attention_layernorm = nn.Module()
        self.post_attention_layernorm.weight = nn.Parameter(torch.ones(h))
        self.self_attn = nn.Module()
        self.self_attn.q_proj = nn.Linear(h, heads * d, bias=False)
        self.self_attn.k_proj = nn.Linear(h, kv_heads * d, bias=False)
        self.self_attn.v_proj = nn.Linear(h, kv_heads * d, bias=False)
        self.self_attn.o_proj = nn.Linear(heads * d, h, bias=False)
        self.mlp = nn.Module()
        self.mlp.gate_proj = nn.Linear(h, inter, bias=False)
        self.mlp.up_proj = nn.Linear(h, inter, bias=False)
        self.mlp.down_proj = nn.Linear(inter, h, bias=False)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        b, t, h = x.shape
        a = self.self_attn
        y = F.rms_norm(x, (h,), self.input_layernorm.weight, self.eps)
        # One fused matmul for q, k and v: fewer passes over the activations.
        w = torch.cat([a.q_proj.weight, a.k_proj.weight, a.v_proj.weight])
        q, k, v = F.linear(y, w).split(
            [self.heads * self.d, self.kv_heads * self.d, self.kv_heads * self.d], dim=-1)
        q = rope(q.view(b, t, self.heads, self.d).transpose(1, 2), cos, sin)
        k = rope(k.view(b, t, self.kv_heads, self.d).transpose(1, 2), cos, sin)
        v = v.view(b, t, self.kv_heads, self.d).transpose(1, 2)
        o = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        x = x + a.o_proj(o.transpose(1, 2).reshape(b, t, h))
        y = F.rms_norm(x, (h,), self.post_attention_layernorm.weight, self.eps)
        m = self.mlp
        gu = F.linear(y, torch.cat([m.gate_proj.weight, m.up_proj.weight]))
        g, u = gu.chunk(2, dim=-1)
        return x + m.down_proj(F.silu(g) * u)


def rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    # transformers' Llama convention: rotate the two halves of each head.
    x1, x2 = x.chunk(2, dim=-1)
    cos, sin = cos.to(x.dtype), sin.to(x.dtype)
    return x * cos + torch.cat([-x2, x1], dim=-1) * sin


class LeanLlama(nn.Module):
    """A Llama for training only; its state dict loads into LlamaForCausalLM as is."""

    def __init__(self, cfg):
        super().__init__()
        self.cfg = cfg
        h = cfg.hidden_size
        self.model = nn.Module()
        self.model.embed_tokens = nn.Embedding(cfg.vocab_size, h)
        self.model.layers = nn.ModuleList(
            Block(h, cfg.num_attention_heads, cfg.num_key_value_heads,
                  cfg.intermediate_size, cfg.rms_norm_eps)
            for _ in range(cfg.num_hidden_layers))
        self.model.norm = nn.Module()
        self.model.norm.weight = nn.Parameter(torch.ones(h))
        self.tied = cfg.tie_word_embeddings
        if not self.tied:
            self.lm_head = nn.Linear(h, cfg.vocab_size, bias=False)
        d = h // cfg.num_attention_heads
        inv = 1.0 / (cfg.rope_parameters["rope_theta"] ** (torch.arange(0, d, 2).float() / d))
        freqs = torch.outer(torch.arange(SEQ_LEN).float(), inv)
        emb = torch.cat([freqs, freqs], dim=-1)
        self.register_buffer("cos", emb.cos(), persistent=False)
        self.register_buffer("sin", emb.sin(), persistent=False)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        std = self.cfg.initializer_range
        depth_std = std / math.sqrt(2 * self.cfg.num_hidden_layers)
        for name, p in self.named_parameters():
            if p.dim() == 1:
                continue
            # Residual output projections start small so deep sums stay in scale.
            s = depth_std if name.endswith(("o_proj.weight", "down_proj.weight")) else std
            nn.init.normal_(p, mean=0.0, std=s)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        x = self.model.embed_tokens(ids)
        t = ids.shape[1]
        cos, sin = self.cos[:t], self.sin[:t]
        for layer in self.model.layers:
            x = layer(x, cos, sin)
        x = F.rms_norm(x, (x.shape[-1],), self.model.norm.weight, self.cfg.rms_norm_eps)
        w = self.model.embed_tokens.weight if self.tied else self.lm_head.weight
        return F.linear(x, w)


# ------------------------------------------------------------------------- training


def train_one(name: str, spec: dict, streams, out: Path, tok_dir: Path) -> dict:
    from transformers import AutoTokenizer, LlamaForCausalLM

    vocab = len(AutoTokenizer.from_pretrained(str(tok_dir)))
    cfg = mm.llama_config(spec["arch"], vocab)
    torch.manual_seed(SEED + sum(name.encode()))
    model = LeanLlama(cfg)
    decay = [p for p in model.parameters() if p.dim() > 1]
    no_decay = [p for p in model.parameters() if p.dim() == 1]
    opt = torch.optim.AdamW(
        [{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}],
        lr=spec["lr"], betas=(0.9, 0.95), eps=1e-8, fused=True)
    steps, warmup = spec["steps"], max(1, spec["steps"] // 20)

    def lr_at(i: int) -> float:
        if i < warmup:
            return spec["lr"] * (i + 1) / warmup
        frac = (i - warmup) / max(1, steps - warmup)
        return spec["lr"] * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * frac)))

    params = sum(p.numel() for p in model.parameters())
    log(f"training {name}: {params / 1e6:.2f} M parameters, {steps} steps of "
        f"{spec['batch']}x{SEQ_LEN} tokens")
    start, losses = time.monotonic(), []
    data = batches(streams, steps, spec["batch"], SEED)
    if "tokenizer" in spec:
        data = reencoded(data, tok_dir.parent / "tokenizer", tok_dir)
    for i, batch in enumerate(data):
        for group in opt.param_groups:
            group["lr"] = lr_at(i)
        logits = model(batch[:, :-1])
        loss = F.cross_entropy(logits.float().flatten(0, 1), batch[:, 1:].flatten())
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(loss.item())
        if (i + 1) % 50 == 0 or i + 1 == steps:
            avg = sum(losses[-50:]) / len(losses[-50:])
            log(f"  {name} step {i + 1}/{steps} loss {avg:.3f} "
                f"({time.monotonic() - start:.0f} s)")
    seconds = time.monotonic() - start
    final = sum(losses[-50:]) / len(losses[-50:])

    hf = LlamaForCausalLM(cfg)
    missing, unexpected = hf.load_state_dict(model.state_dict(), strict=False)
    # Only the tied head may be absent from the lean model's state dict.
    assert not unexpected and set(missing) <= {"lm_head.weight"}, (missing, unexpected)
    if cfg.tie_word_embeddings:
        hf.tie_weights()
    hf.eval()
    check_parity(model, hf)
    meta = {"kind": "trained", "name": name, "recipe": recipe(name),
            "train_seconds": round(seconds, 1), "final_loss": round(final, 4)}
    mm.save_model(hf, tok_dir, out, meta)
    log(f"{name}: final loss {final:.3f} after {seconds:.0f} s")
    return meta


def check_parity(lean: LeanLlama, hf) -> None:
    """The exported model must compute what was trained (fp32, no autocast)."""
    ids = torch.arange(1, 65).unsqueeze(0) * 37 % lean.cfg.vocab_size
    with torch.no_grad():
        a = lean(ids)
        b = hf(input_ids=ids).logits
    err = (a - b).abs().max().item()
    assert err < 1e-3, f"exported model differs from the trained one by {err}"


def greedy_samples(model_dir: Path, prompts: list[str], n: int = 40) -> list[str]:
    from transformers import AutoTokenizer, LlamaForCausalLM

    tok = AutoTokenizer.from_pretrained(str(model_dir))
    model = LlamaForCausalLM.from_pretrained(str(model_dir)).eval()
    out = []
    for p in prompts:
        ids = tok(p, return_tensors="pt")["input_ids"]
        with torch.no_grad():
            gen = model.generate(ids, max_new_tokens=n, do_sample=False)
        out.append(tok.decode(gen[0, ids.shape[1]:]))
    return out


def _train_worker(name: str, streams, root: str, tok_dir: str) -> dict:
    """Train one model in its own process (one thread, deterministic)."""
    torch.set_num_threads(THREADS)
    torch.use_deterministic_algorithms(True)
    result = {}

    def build(out: Path) -> None:
        result.update(train_one(name, TRAINED_MODELS[name], streams, out, Path(tok_dir)))

    mm.install(Path(root) / name, build)
    return result


def recipe(name: str) -> dict:
    spec = TRAINED_MODELS[name]
    r = {"seed": SEED, "seq_len": SEQ_LEN, "dtype": "float32", "mix": MIX, "threads": THREADS,
         "steps": spec["steps"], "batch": spec["batch"], "lr": spec["lr"],
         "architecture": spec["arch"]}
    if "tokenizer" in spec:
        r["tokenizer"] = mm.XTOK_TOKENIZER
        r["windows"] = "target-trained's, re-encoded"
    return r


def up_to_date(root: Path, name: str) -> bool:
    """Built, and by the current recipe (a changed recipe retrains)."""
    try:
        meta = json.loads((root / name / "specd-model.json").read_text())
    except (OSError, ValueError):
        return False
    return (root / name / mm.COMPLETE).exists() and meta.get("recipe") == recipe(name)


def ensure_trained(root: Path, tok_dir: Path, xtok_dir: Path) -> None:
    """Train whichever model is missing (called with make_models' lock held).

    The two models train at once in two processes of one thread each: on a busy 2-core
    machine that is several times faster than one process with two threads, whose
    threads keep waiting for each other.
    """
    todo = [n for n in TRAINED_MODELS if not up_to_date(root, n)]
    if not todo:
        return
    import multiprocessing as mp
    from concurrent.futures import ProcessPoolExecutor

    from transformers import AutoTokenizer

    started = time.monotonic()
    # Every model trains on the target tokenizer's windows (draft-xtok re-encodes them).
    dirs = {n: xtok_dir if "tokenizer" in TRAINED_MODELS[n] else tok_dir for n in todo}
    streams = build_streams(AutoTokenizer.from_pretrained(str(tok_dir)))
    log("corpus tokens: " + ", ".join(f"{k} {len(v)}" for k, v in streams.items())
        + f" ({time.monotonic() - started:.0f} s)")
    with ProcessPoolExecutor(max_workers=len(todo), mp_context=mp.get_context("spawn")) as ex:
        jobs = [ex.submit(_train_worker, n, streams, str(root), str(dirs[n])) for n in todo]
        results = [j.result() for j in jobs]
    for r in results:
        log(f"{r['name']}: final loss {r['final_loss']} in {r['train_seconds']} s")
    log(f"trained {', '.join(todo)} in {time.monotonic() - started:.0f} s")


def held_out_texts() -> dict[str, str]:
    """Text the models never trained on: the stdlib's tests (code) and its licence (prose)."""
    root = mm.stdlib_dir()
    tests = sorted((root / "test").glob("test_*.py"))[:40]
    return {
        "code": "\n".join(mm.read_text(f) for f in tests),
        "prose": mm.read_text(root / "LICENSE.txt"),
    }


def evaluate(root: Path, windows: int = 16) -> dict:
    """Loss of each model and greedy top-1 agreement of draft and target on held-out text.

    Agreement is the chance that a greedy draft token is accepted by greedy verification
    given the same context; with K drafted tokens a round then accepts about
    (1 - a^(K+1)) / (1 - a) tokens, the bonus token included.
    """
    from transformers import AutoTokenizer, LlamaForCausalLM

    tok = AutoTokenizer.from_pretrained(str(root / "target-trained"))
    target = LlamaForCausalLM.from_pretrained(str(root / "target-trained")).eval()
    draft = LlamaForCausalLM.from_pretrained(str(root / "draft-trained")).eval()
    report = {}
    for kind, text in held_out_texts().items():
        ids = torch.tensor(tok(text, add_special_tokens=False)["input_ids"])
        step = max(SEQ_LEN, (len(ids) - SEQ_LEN - 1) // windows)
        batch = torch.stack([ids[i:i + SEQ_LEN + 1]
                             for i in range(0, len(ids) - SEQ_LEN - 1, step)][:windows])
        with torch.no_grad():
            t = target(input_ids=batch[:, :-1]).logits
            d = draft(input_ids=batch[:, :-1]).logits
        y = batch[:, 1:].flatten()
        a = (t.argmax(-1) == d.argmax(-1)).float().mean().item()
        report[kind] = {
            "target_loss": round(F.cross_entropy(t.flatten(0, 1), y).item(), 3),
            "draft_loss": round(F.cross_entropy(d.flatten(0, 1), y).item(), 3),
            "greedy_agreement": round(a, 3),
            "accepted_per_round_k4": round((1 - a ** 5) / (1 - a), 2) if a < 1 else 5.0,
        }
    prompts = ["def parse_args(argv):\n", "import os\n\n\nclass ",
               "The with statement is used to"]
    report["greedy_samples"] = {
        name: dict(zip(prompts, greedy_samples(root / name, prompts)))
        for name in ("target-trained", "draft-trained")
    }
    return report


def main() -> int:
    import argparse

    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--eval", action="store_true",
                    help="train if needed, then print held-out losses, draft/target "
                         "agreement and greedy samples as JSON")
    args, rest = ap.parse_known_args()
    if not args.eval:
        os.execv(sys.executable, [sys.executable, str(Path(__file__).with_name("make_models.py")),
                                  "--trained", *rest])
    import subprocess

    subprocess.run([sys.executable, str(Path(__file__).with_name("make_models.py")),
                    "--trained"], check=True, stdout=subprocess.DEVNULL)
    torch.set_num_threads(THREADS)
    print(json.dumps(evaluate(mm.models_dir()), indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
