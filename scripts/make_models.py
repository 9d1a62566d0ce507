#!/usr/bin/env python3
"""Build specd's small test models: a byte-level BPE tokenizer and a Llama target/draft pair.

No model can be downloaded where specd's tests run, so the project makes its own. The
tokenizer is trained on the Python standard library that ships with the interpreter
(source code plus the prose of `pydoc_data`), and both models share it.

    python scripts/make_models.py            # random-weight target/ and draft/
    python scripts/make_models.py --trained  # trained target-trained/, draft-trained/ and
                                             # draft-xtok/ (its own tokenizer-xtok/)
    python scripts/make_models.py --agent    # agent/: <think> tokens, for reasoning parsers
    python scripts/make_models.py --agent-tools  # agent-tools/: hermes tool calls
    python scripts/make_models.py --agent-tools-kimi  # agent-tools-kimi/: kimi_k2 tool calls
    python scripts/make_models.py --agent-tools-qwen3coder  # agent-tools-qwen3coder/: qwen3_coder calls
    python scripts/make_models.py --agent-tools-llama3  # agent-tools-llama3/: llama3_json calls
    python scripts/make_models.py --tiktoken # target-tiktoken/: target/ in the tiktoken format

Models land in ${SPECD_MODELS_DIR:-~/.cache/specd/models}/<name>/, each with
config.json, generation_config.json, model.safetensors, tokenizer.json and
tokenizer_config.json (with a chat template). A finished folder holds `.specd-complete`;
folders are built in a temporary directory and renamed into place, under a file lock, so
concurrent callers never see a half-written model. Everything is deterministic from the
seed for a given Python standard library (its version is recorded in specd-model.json).

Needs torch, transformers and tokenizers (the vLLM venv has them).
"""

from __future__ import annotations

import argparse
import fcntl
import hashlib
import json
import os
import platform
import shutil
import subprocess
import sys
import sysconfig
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

SEED = 1234
VOCAB_SIZE = 4096
BOS = "<|begin_of_text|>"
EOS = "<|end_of_text|>"
IM_START = "<|im_start|>"
IM_END = "<|im_end|>"
SPECIAL_TOKENS = [BOS, EOS, IM_START, IM_END]  # ids 0..3 in this order
# ChatML-style turns; the BOS comes from the template, so tokenize chat with
# add_special_tokens=False (vLLM's default for chat).
CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
COMPLETE = ".specd-complete"
# tokenizer-xtok, the vocabulary of draft-xtok (a draft that does not speak the target's
# ids): another size, and a split that keeps identifiers with underscores whole and
# digits single, so its merges and ids differ from the first one's. Spaces attach to
# the word after them as in GPT-2's split, which most real tokenizers share.
XTOK_TOKENIZER = {
    "vocab_size": 6000,
    "split": r" ?[A-Za-z_]+| ?[0-9]| ?[^\sA-Za-z_0-9]+|\s+(?!\S)|\s+",
}
# Saved as float32, lossless for drafters that run the model themselves. vLLM's CPU
# backend serves it as bfloat16 anyway (its dtype "auto" picks bfloat16 on the CPU).
DTYPE = "float32"

# Architecture of each model; all share the tokenizer and a 2048-token context.
RANDOM_MODELS = {
    "target": dict(hidden_size=256, num_hidden_layers=4, num_attention_heads=4,
                   num_key_value_heads=2, intermediate_size=688, tie_word_embeddings=False),
    "draft": dict(hidden_size=128, num_hidden_layers=2, num_attention_heads=2,
                  num_key_value_heads=1, intermediate_size=344, tie_word_embeddings=True),
}


def log(msg: str) -> None:
    print(f"make_models: {msg}", file=sys.stderr, flush=True)


def models_dir() -> Path:
    env = os.environ.get("SPECD_MODELS_DIR")
    return Path(env) if env else Path.home() / ".cache" / "specd" / "models"


def stdlib_dir() -> Path:
    return Path(sysconfig.get_paths()["stdlib"])


def corpus_files() -> list[Path]:
    """The standard library's own source files (no tests), in a fixed order."""
    root = stdlib_dir()
    skip = {"test", "tests", "idle_test", "site-packages", "dist-packages", "__pycache__"}
    files = []
    for path in root.rglob("*"):
        rel = path.relative_to(root)
        if path.suffix not in (".py", ".txt") or not path.is_file():
            continue
        if any(part in skip for part in rel.parts):
            continue
        files.append(path)
    return sorted(files, key=lambda p: p.relative_to(root).as_posix())


def read_text(path: Path) -> str:
    return path.read_bytes().decode("utf-8", errors="replace")


def corpus_fingerprint(files: list[Path]) -> str:
    h = hashlib.sha256()
    root = stdlib_dir()
    for f in files:
        h.update(f.relative_to(root).as_posix().encode())
        h.update(f.read_bytes())
    return h.hexdigest()


def train_tokenizer(out: Path, recipe: dict | None = None) -> None:
    """Train the byte-level BPE and save it with transformers' files into `out`.

    `recipe` (XTOK_TOKENIZER) gives another vocabulary size and pre-tokenizer split: a
    second tokenizer of the same corpus with different merges and ids."""
    from tokenizers import (Regex, Tokenizer, decoders, models, pre_tokenizers, processors,
                            trainers)
    from transformers import PreTrainedTokenizerFast

    files = corpus_files()
    vocab_size = recipe["vocab_size"] if recipe else VOCAB_SIZE
    log(f"training a {vocab_size}-token byte-level BPE on {len(files)} files of {stdlib_dir()}")
    tok = Tokenizer(models.BPE())
    if recipe:
        tok.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(recipe["split"]), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ])
    else:
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=2,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator((read_text(f) for f in files), trainer=trainer)
    # Text prompts start with BOS, as Llama tokenizers do.
    tok.post_processor = processors.TemplateProcessing(
        single=f"{BOS} $A",
        pair=f"{BOS} $A {BOS} $B",
        special_tokens=[(BOS, tok.token_to_id(BOS))],
    )
    for i, s in enumerate(SPECIAL_TOKENS):
        assert tok.token_to_id(s) == i, (s, tok.token_to_id(s))
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token=BOS,
        eos_token=EOS,
        pad_token=EOS,
        model_max_length=2048,
        clean_up_tokenization_spaces=False,
    )
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(str(out))
    # Keep the template inside tokenizer_config.json too, where every loader finds it.
    cfg_path = out / "tokenizer_config.json"
    cfg = json.loads(cfg_path.read_text())
    cfg["chat_template"] = CHAT_TEMPLATE
    cfg["add_bos_token"] = True
    # The generic class name loads in transformers 4.x as well as 5.x.
    cfg["tokenizer_class"] = "PreTrainedTokenizerFast"
    cfg_path.write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")
    meta = {
        "tokenizer_corpus": "python stdlib *.py/*.txt without tests",
        "python": platform.python_version(),
        "corpus_files": len(files),
        "corpus_sha256": corpus_fingerprint(files),
        "vocab_size": tok.get_vocab_size(),
        "special_tokens": {s: tok.token_to_id(s) for s in SPECIAL_TOKENS},
    }
    if recipe:
        meta["recipe"] = recipe
    (out / "specd-tokenizer.json").write_text(json.dumps(meta, indent=2) + "\n")




def llama_config(arch: dict, vocab_size: int = VOCAB_SIZE):
    from transformers import LlamaConfig

    return LlamaConfig(
        vocab_size=vocab_size,
        max_position_embeddings=2048,
        rms_norm_eps=1e-5,
        rope_theta=10000.0,
        hidden_act="silu",
        initializer_range=0.02,
        bos_token_id=0,
        eos_token_id=1,
        pad_token_id=1,
        **arch,
    )


def save_model(model, tok_dir: Path, out: Path, meta: dict) -> None:
    """Write model, tokenizer and generation config into `out`."""
    import torch
    from transformers import GenerationConfig

    model = model.to(getattr(torch, DTYPE))
    model.config.architectures = ["LlamaForCausalLM"]
    model.save_pretrained(str(out), safe_serialization=True)
    # Chat turns end with <|im_end|>, plain text with <|end_of_text|>.
    GenerationConfig(bos_token_id=0, eos_token_id=[1, 3], pad_token_id=1).save_pretrained(str(out))
    for f in sorted(tok_dir.iterdir()):
        shutil.copy2(f, out / f.name)
    params = sum(p.numel() for p in model.parameters())
    meta = {**meta, "parameters": params, "dtype": DTYPE}
    (out / "specd-model.json").write_text(json.dumps(meta, indent=2) + "\n")
    log(f"{meta['name']}: {params / 1e6:.2f} M parameters")


def build_random(name: str, tok_dir: Path, out: Path) -> None:
    import torch
    from transformers import LlamaForCausalLM

    arch = RANDOM_MODELS[name]
    torch.manual_seed(SEED + sum(name.encode()))
    model = LlamaForCausalLM(llama_config(arch))
    model.eval()
    save_model(model, tok_dir, out, {"kind": "random", "name": name, "seed": SEED, "architecture": arch})


TIKTOKEN_CLASS = Path(__file__).resolve().parent / "tiktoken" / "tokenization_specd_tiktoken.py"


def build_tiktoken(src: Path, out: Path) -> None:
    """`src`'s weights with its tokenizer re-expressed the way Kimi-K2 ships one:
    tiktoken.model ranks, a remote-code class named in `auto_map`, no tokenizer.json.
    A token's rank is its id, which keeps BPE's merge order (ids follow the merges)."""
    import base64

    from transformers import AutoTokenizer

    tok = json.loads((src / "tokenizer.json").read_text())
    char_to_byte = {ord(c): b for b, c in byte_chars().items()}
    special_ids = {t["id"] for t in tok["added_tokens"]}
    lines = []
    for text, i in sorted(tok["model"]["vocab"].items(), key=lambda kv: kv[1]):
        if i not in special_ids:
            data = bytes(char_to_byte[ord(c)] for c in text)
            lines.append(f"{base64.b64encode(data).decode()} {i}\n")
    (out / "tiktoken.model").write_text("".join(lines))
    cfg = json.loads((src / "tokenizer_config.json").read_text())
    cfg = {k: v for k, v in cfg.items() if k not in ("backend", "tokenizer_class")}
    cfg.update({
        "tokenizer_class": "TikTokenTokenizer",
        "auto_map": {"AutoTokenizer": ["tokenization_specd_tiktoken.TikTokenTokenizer", None]},
        "added_tokens_decoder": {
            str(t["id"]): {k: t[k] for k in ("content", "lstrip", "normalized", "rstrip",
                                             "single_word", "special")}
            for t in tok["added_tokens"]
        },
        "additional_special_tokens": [IM_START, IM_END],
    })
    (out / "tokenizer_config.json").write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")
    shutil.copy2(TIKTOKEN_CLASS, out / TIKTOKEN_CLASS.name)
    for name in ("config.json", "generation_config.json", "chat_template.jinja"):
        if (src / name).exists():
            shutil.copy2(src / name, out / name)
    # The weights are the target's own: a relative link, no second copy.
    (out / "model.safetensors").symlink_to(Path("..") / src.name / "model.safetensors")
    meta = json.loads((src / "specd-model.json").read_text())
    meta.update({"name": f"{src.name}-tiktoken", "tokenizer": "tiktoken", "weights_of": src.name,
                 "source_tokenizer_sha256": source_tokenizer_hash(src)})
    (out / "specd-model.json").write_text(json.dumps(meta, indent=2) + "\n")
    # The new folder must tokenize exactly as the source does.
    new = AutoTokenizer.from_pretrained(str(out), trust_remote_code=True)
    old = AutoTokenizer.from_pretrained(str(src))
    for text in tokenizer_probes():
        for special in (True, False):
            a = new.encode(text, add_special_tokens=special)
            b = old.encode(text, add_special_tokens=special)
            assert a == b, (text, special, a, b)
            assert new.decode(a) == old.decode(b), text
    # Only the tiktoken folder has the reserved ids, past the model's own vocabulary.
    assert new.encode("<|reserved_token_4100|>", add_special_tokens=False) == [4100]
    log(f"{out.name}: tiktoken tokenizer agrees with {src.name}'s on {len(tokenizer_probes())} texts")


def source_tokenizer_hash(src: Path) -> str:
    """What target-tiktoken was made from: rebuilt when the source's tokenizer changes
    (its weights are a link, always the source's own)."""
    h = hashlib.sha256()
    for name in ("tokenizer.json", "tokenizer_config.json"):
        h.update((src / name).read_bytes())
    h.update(TIKTOKEN_CLASS.read_bytes())
    return h.hexdigest()


def tiktoken_current(dest: Path, src: Path) -> bool:
    try:
        meta = json.loads((dest / "specd-model.json").read_text())
    except (OSError, ValueError):
        return False
    return (dest / COMPLETE).exists() and meta.get("source_tokenizer_sha256") == source_tokenizer_hash(src)


def byte_chars() -> dict[int, str]:
    """GPT-2's byte-level alphabet (byte -> printable character)."""
    keep = list(range(0x21, 0x7F)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    table = {b: chr(b) for b in keep}
    for b in range(256):
        if b not in table:
            table[b] = chr(256 + len(table) - len(keep))
    return table


def tokenizer_probes() -> list[str]:
    files = corpus_files()
    texts = [read_text(f) for f in files[:: max(1, len(files) // 40)]]
    return texts + [
        "naïve café, Grüße — 数字 ✓ ½ 12345\n\tdef f(x):\n        return x\n",
        f"{BOS}a{IM_START}user\nhi{IM_END}\n{EOS} x",
    ]


def install(dest: Path, build) -> None:
    """Build into a temporary folder next to `dest`, then rename it into place."""
    tmp = Path(tempfile.mkdtemp(prefix=f".tmp-{dest.name}-", dir=dest.parent))
    try:
        tmp.chmod(0o755)
        build(tmp)
        for f in tmp.iterdir():
            if not f.is_symlink():
                f.chmod(0o644)
        (tmp / COMPLETE).write_text("ok\n")
        if dest.exists():
            shutil.rmtree(dest)
        tmp.rename(dest)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)


def ensure_tokenizer(root: Path) -> Path:
    tok_dir = root / "tokenizer"
    if not (tok_dir / COMPLETE).exists():
        install(tok_dir, train_tokenizer)
    return tok_dir


def ensure_xtok_tokenizer(root: Path) -> Path:
    """tokenizer-xtok, rebuilt when its recipe changes."""
    tok_dir = root / "tokenizer-xtok"
    try:
        meta = json.loads((tok_dir / "specd-tokenizer.json").read_text())
    except (OSError, ValueError):
        meta = {}
    if not (tok_dir / COMPLETE).exists() or meta.get("recipe") != XTOK_TOKENIZER:
        install(tok_dir, lambda out: train_tokenizer(out, XTOK_TOKENIZER))
    return tok_dir


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--trained", action="store_true",
                    default=os.environ.get("SPECD_TRAINED_MODELS", "") not in ("", "0"),
                    help="build the trained pair (target-trained, draft-trained) instead "
                         "of random weights (also SPECD_TRAINED_MODELS=1)")
    ap.add_argument("--agent", action="store_true",
                    help="build the reasoning-format test model `agent` (train_agent.py)")
    ap.add_argument("--agent-tools", action="store_true",
                    help="build the tool-calling test model `agent-tools` (train_tools.py)")
    ap.add_argument("--agent-tools-kimi", action="store_true",
                    help="build `agent-tools-kimi`, kimi_k2 tool calls (train_tools_kimi.py)")
    ap.add_argument("--agent-tools-qwen3coder", action="store_true",
                    help="build `agent-tools-qwen3coder`, qwen3_coder tool calls "
                         "(train_tools_qwen3coder.py)")
    ap.add_argument("--agent-tools-llama3", action="store_true",
                    help="build `agent-tools-llama3`, llama3_json tool calls "
                         "(train_tools_llama3.py)")
    ap.add_argument("--tiktoken", action="store_true",
                    help="build target-tiktoken (from target) only")
    ap.add_argument("--force", action="store_true", help="rebuild even if present")
    args = ap.parse_args()

    root = models_dir()
    root.mkdir(parents=True, exist_ok=True)
    if args.tiktoken:
        return make_tiktoken(root, args.force)
    if args.agent_tools:
        return make_agent_tools(root, args.force)
    if args.agent_tools_kimi:
        return make_agent_tools_kimi(root, args.force)
    if args.agent_tools_qwen3coder:
        return make_agent_tools_qwen3coder(root, args.force)
    if args.agent_tools_llama3:
        return make_agent_tools_llama3(root, args.force)
    if args.agent:
        return make_agent(root, args.force)
    with open(root / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if args.force:
            for name in ("tokenizer", "target", "draft", "target-trained", "draft-trained",
                         "tokenizer-xtok", "draft-xtok"):
                trained = name.endswith(("-trained", "-xtok"))
                if (root / name).exists() and (args.trained == trained or name == "tokenizer"):
                    shutil.rmtree(root / name)
        tok_dir = ensure_tokenizer(root)
        if args.trained:
            sys.path.insert(0, str(Path(__file__).resolve().parent))
            import train_models

            train_models.ensure_trained(root, tok_dir, ensure_xtok_tokenizer(root))
            names = list(train_models.TRAINED_MODELS)
        else:
            for name in RANDOM_MODELS:
                if not (root / name / COMPLETE).exists():
                    install(root / name, lambda out, n=name: build_random(n, tok_dir, out))
            names = list(RANDOM_MODELS)
    for name in names:
        print(root / name)
    return 0


def make_tiktoken(root: Path, force: bool) -> int:
    """target-tiktoken has a lock of its own, so a training run holding the main lock for
    an hour does not hold it up; target itself is built first when missing."""
    if not (root / "target" / COMPLETE).exists():
        subprocess.run([sys.executable, __file__], check=True, stdout=subprocess.DEVNULL)
    dest = root / "target-tiktoken"
    with open(root / ".lock-target-tiktoken", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if force or not tiktoken_current(dest, root / "target"):
            install(dest, lambda out: build_tiktoken(root / "target", out))
    print(dest)
    return 0


def make_agent(root: Path, force: bool) -> int:
    """The agent models have locks of their own, so a training run holding the main lock
    for an hour does not hold them up (only the shared tokenizer is built under the main
    lock, when missing)."""
    import train_agent

    return make_own(root, force, train_agent.NAME, train_agent.ensure_agent)


def make_agent_tools(root: Path, force: bool) -> int:
    import train_tools

    return make_own(root, force, train_tools.NAME, train_tools.ensure_agent_tools)


def make_agent_tools_kimi(root: Path, force: bool) -> int:
    import train_tools_kimi

    return make_own(root, force, train_tools_kimi.NAME, train_tools_kimi.ensure_agent_tools_kimi)


def make_agent_tools_qwen3coder(root: Path, force: bool) -> int:
    import train_tools_qwen3coder as q

    return make_own(root, force, q.NAME, q.ensure_agent_tools_qwen3coder)
def make_agent_tools_llama3(root: Path, force: bool) -> int:
    import train_tools_llama3

    return make_own(root, force, train_tools_llama3.NAME,
                    train_tools_llama3.ensure_agent_tools_llama3)


def make_own(root: Path, force: bool, name: str, ensure) -> int:
    if not (root / "tokenizer" / COMPLETE).exists():
        with open(root / ".lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            ensure_tokenizer(root)
    dest = root / name
    with open(root / f".lock-{name}", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if force and dest.exists():
            shutil.rmtree(dest)
        ensure(root, root / "tokenizer")
    print(dest)
    return 0


if __name__ == "__main__":
    sys.exit(main())
