#!/usr/bin/env python3
"""Reference data for specd's draft-model forward, computed with Hugging Face transformers.

For a model directory it writes a safetensors file with, per case i:
  case{i}.context  int64 [T]   token ids
  case{i}.logits   float32 [V] logits after the last context token
  case{i}.greedy   int64 [N]   greedy continuation (full recompute at every step)
  case{i}.gaps     float32 [N] top-1 minus top-2 logit at each greedy step
The cases include a prefix of another case and a context that branches off it, so that
a drafter replaying them in order on one stream has to roll its cache back.

  draft_model_reference.py reference --model DIR --out REF [--device cuda] [--dtype float32]
      [--calibrate bfloat16]   # also print how far transformers itself lands in bf16
  draft_model_reference.py tiny --out DIR [--extra NAME=MODEL_DIR ...]
      # tiny random Llama/Qwen2/Qwen3 + references (and references of other models, as
      # DIR/NAME.ref.safetensors, in the same process: importing torch is slow)
  draft_model_reference.py random --shape qwen2.5-0.5b --out DIR   # random-init checkpoint
"""
import argparse
import json
import os
import sys

import torch
from safetensors.torch import save_file
import transformers
from transformers import AutoModelForCausalLM


def load(model_dir, device, dtype):
    m = AutoModelForCausalLM.from_pretrained(
        model_dir, dtype=getattr(torch, dtype), attn_implementation="eager"
    )
    return m.to(device).eval()


@torch.no_grad()
def last_logits(model, ids, device):
    x = torch.tensor([ids], device=device)
    return model(input_ids=x).logits[0, -1].float().cpu()


def make_cases(vocab, seed):
    g = torch.Generator().manual_seed(seed)
    rnd = lambda n: torch.randint(4, vocab, (n,), generator=g).tolist()
    a, b, c = rnd(7), rnd(40), rnd(100)
    branch = c[:60] + [(c[60] + 1) % vocab] + rnd(19)
    return [a, b, c, c[:60], branch, b[:1]]


@torch.no_grad()
def reference(model_dir, out, device="cpu", dtype="float32", new_tokens=12, seed=0, calibrate=None):
    model = load(model_dir, device, dtype)
    vocab = model.config.get_text_config().vocab_size
    other = load(model_dir, device, calibrate) if calibrate else None
    worst = 0.0
    tensors = {}
    for i, ctx in enumerate(make_cases(vocab, seed)):
        logits = last_logits(model, ctx, device)
        if other is not None:
            o = last_logits(other, ctx, device)
            worst = max(worst, float((o - logits).norm() / logits.norm()))
        seq, greedy, gaps = list(ctx), [], []
        l = logits
        for _ in range(new_tokens):
            top = torch.topk(l, 2)
            tok = int(torch.argmax(l))  # first index of the maximum
            greedy.append(tok)
            gaps.append(float(top.values[0] - top.values[1]))
            seq.append(tok)
            l = last_logits(model, seq, device)
        tensors[f"case{i}.context"] = torch.tensor(ctx, dtype=torch.int64)
        tensors[f"case{i}.logits"] = logits.contiguous()
        tensors[f"case{i}.greedy"] = torch.tensor(greedy, dtype=torch.int64)
        tensors[f"case{i}.gaps"] = torch.tensor(gaps, dtype=torch.float32)
    save_file(tensors, out, metadata={"model": str(model_dir), "dtype": dtype, "device": device,
                                      "transformers": transformers.__version__})
    print(f"wrote {out} ({len(tensors) // 4} cases)")
    if other is not None:
        print(f"transformers in {calibrate} vs {dtype}: max relative logit error {worst:.2e}")


def with_rope(cfg_cls, rope, **kw):
    # transformers 5 takes `rope_parameters`; 4.x `rope_theta` + `rope_scaling`.
    try:
        return cfg_cls(rope_parameters=rope, **kw)
    except TypeError:
        theta = rope.pop("rope_theta")
        return cfg_cls(rope_theta=theta, rope_scaling=rope if rope.get("rope_type") != "default" else None, **kw)


def tiny(out, extra=()):
    from transformers import LlamaConfig, Qwen2Config, Qwen3Config

    common = dict(vocab_size=320, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                  initializer_range=0.15, rms_norm_eps=1e-5)
    models = {
        # llama3 scaling with a short original context, so that it matters within 512.
        "llama": with_rope(LlamaConfig, {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0,
                                         "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                         "original_max_position_embeddings": 64},
                           tie_word_embeddings=False, **common),
        "qwen2": with_rope(Qwen2Config, {"rope_type": "default", "rope_theta": 1000000.0},
                           tie_word_embeddings=True, **common),
        "qwen3": with_rope(Qwen3Config, {"rope_type": "default", "rope_theta": 1000000.0},
                           head_dim=32, tie_word_embeddings=False, **common),
    }
    for name, cfg in models.items():
        torch.manual_seed(1234)
        m = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32)
        d = os.path.join(out, name)
        # The Llama one is saved in shards to exercise the index file.
        m.save_pretrained(d, max_shard_size="100KB" if name == "llama" else "5GB")
        reference(d, os.path.join(out, f"{name}.ref.safetensors"))
    for item in extra:
        name, model_dir = item.split("=", 1)
        reference(model_dir, os.path.join(out, f"{name}.ref.safetensors"))


SHAPES = {
    "qwen2.5-0.5b": dict(arch="qwen2", hidden_size=896, intermediate_size=4864, num_hidden_layers=24,
                         num_attention_heads=14, num_key_value_heads=2, tie_word_embeddings=True),
    "qwen2.5-1.5b": dict(arch="qwen2", hidden_size=1536, intermediate_size=8960, num_hidden_layers=28,
                         num_attention_heads=12, num_key_value_heads=2, tie_word_embeddings=True),
}


def random_model(shape, out, device):
    from transformers import Qwen2Config

    s = dict(SHAPES[shape])
    s.pop("arch")
    cfg = with_rope(Qwen2Config, {"rope_type": "default", "rope_theta": 1000000.0}, vocab_size=151936,
                    max_position_embeddings=32768, rms_norm_eps=1e-6, **s)
    torch.manual_seed(0)
    with torch.device(device):
        m = AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16)
    m.save_pretrained(out)
    print(f"wrote {out}")


def main():
    p = argparse.ArgumentParser()
    sub = p.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("reference")
    r.add_argument("--model", required=True)
    r.add_argument("--out", required=True)
    r.add_argument("--device", default="cpu")
    r.add_argument("--dtype", default="float32")
    r.add_argument("--new-tokens", type=int, default=12)
    r.add_argument("--calibrate", default=None)
    t = sub.add_parser("tiny")
    t.add_argument("--out", required=True)
    t.add_argument("--extra", action="append", default=[], metavar="NAME=MODEL_DIR")
    m = sub.add_parser("random")
    m.add_argument("--shape", choices=sorted(SHAPES), required=True)
    m.add_argument("--out", required=True)
    m.add_argument("--device", default="cpu")
    a = p.parse_args()
    torch.set_num_threads(max(1, min(4, os.cpu_count() or 1)))
    if a.cmd == "reference":
        reference(a.model, a.out, a.device, a.dtype, a.new_tokens, calibrate=a.calibrate)
    elif a.cmd == "tiny":
        tiny(a.out, a.extra)
    else:
        random_model(a.shape, a.out, a.device)


if __name__ == "__main__":
    sys.exit(main())
