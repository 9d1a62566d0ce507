"""A tokenizer in the tiktoken format for transformers' remote-code loading.

specd's `target-tiktoken` test model ships this file, a `tiktoken.model` (one
`base64(token bytes) rank` per line) and a tokenizer_config.json whose `auto_map` names
this class, and no tokenizer.json: the layout Kimi-K2 uses. Servers load it with
`--trust-remote-code`. Behaviour follows that layout's conventions:

- byte-level BPE by rank with the pre-tokenizer pattern `pat_str` (a class attribute);
- special tokens are the entries of `added_tokens_decoder`; the `num_reserved_special_tokens`
  ids right after the highest rank that it does not name are `<|reserved_token_{id}|>`;
- text prompts start with the BOS token when tokenizer_config.json sets `add_bos_token`.
"""

from __future__ import annotations

import os
from typing import Optional

import tiktoken
from tiktoken.load import load_tiktoken_bpe
from transformers import PreTrainedTokenizer

VOCAB_FILES_NAMES = {"vocab_file": "tiktoken.model"}


def byte_to_char() -> dict[int, str]:
    """The byte-level alphabet: printable bytes stand for themselves, the rest are
    shifted above U+00FF, so every token has a printable string form."""
    keep = list(range(0x21, 0x7F)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    table = {b: chr(b) for b in keep}
    extra = 0
    for b in range(256):
        if b not in table:
            table[b] = chr(256 + extra)
            extra += 1
    return table


class TikTokenTokenizer(PreTrainedTokenizer):
    vocab_files_names = VOCAB_FILES_NAMES
    model_input_names = ["input_ids", "attention_mask"]

    num_reserved_special_tokens = 256

    # GPT-2's pre-tokenizer split, the one the target model's BPE was trained with.
    pat_str = "|".join(
        [
            r"""'s|'t|'re|'ve|'m|'ll|'d""",
            r""" ?\p{L}+""",
            r""" ?\p{N}+""",
            r""" ?[^\s\p{L}\p{N}]+""",
            r"""\s+(?!\S)""",
            r"""\s+""",
        ]
    )

    def __init__(
        self,
        vocab_file: str,
        bos_token=None,
        eos_token=None,
        unk_token=None,
        pad_token=None,
        added_tokens_decoder: Optional[dict] = None,
        add_bos_token: bool = False,
        **kwargs,
    ):
        if not os.path.isfile(vocab_file):
            raise ValueError(f"no tiktoken vocabulary at {vocab_file}")
        self.vocab_file = vocab_file
        ranks = load_tiktoken_bpe(vocab_file)
        named = {int(i): getattr(t, "content", t) for i, t in (added_tokens_decoder or {}).items()}
        specials = {text: i for i, text in named.items()}
        first_reserved = max(ranks.values()) + 1
        for i in range(first_reserved, first_reserved + self.num_reserved_special_tokens):
            if i not in named:
                specials[f"<|reserved_token_{i}|>"] = i
        self.model = tiktoken.Encoding(
            name=os.path.basename(vocab_file),
            pat_str=self.pat_str,
            mergeable_ranks=ranks,
            special_tokens=specials,
        )
        self.add_bos = bool(add_bos_token)
        chars = byte_to_char()
        self.char_to_byte = {c: b for b, c in chars.items()}
        # Token strings: byte-level text for ranks, the literal text for special tokens.
        self.decoder = {rank: "".join(chars[b] for b in token) for token, rank in ranks.items()}
        self.decoder.update({i: "".join(chars[b] for b in t.encode()) for t, i in specials.items()})
        self.encoder = {s: i for i, s in self.decoder.items()}
        super().__init__(
            bos_token=bos_token,
            eos_token=eos_token,
            unk_token=unk_token,
            pad_token=pad_token,
            added_tokens_decoder=added_tokens_decoder,
            add_bos_token=add_bos_token,
            **kwargs,
        )

    @property
    def vocab_size(self) -> int:
        return self.model.n_vocab

    def get_vocab(self) -> dict[str, int]:
        return dict(self.encoder)

    def _tokenize(self, text: str, **kwargs) -> list[str]:
        return [self.decoder[i] for i in self.model.encode(text, allowed_special="all")]

    def _convert_token_to_id(self, token: str) -> int:
        return self.encoder.get(token, self.unk_token_id)

    def _convert_id_to_token(self, index: int) -> Optional[str]:
        return self.decoder.get(index)

    def convert_tokens_to_string(self, tokens: list[str]) -> str:
        data = bytearray()
        for token in tokens:
            for c in token:
                # An added token's own text may hold characters outside the alphabet.
                b = self.char_to_byte.get(c)
                data.extend([b] if b is not None else c.encode())
        return data.decode("utf-8", "replace")

    def build_inputs_with_special_tokens(self, token_ids_0, token_ids_1=None):
        bos = [self.bos_token_id] if self.add_bos and self.bos_token_id is not None else []
        if token_ids_1 is None:
            return bos + list(token_ids_0)
        return bos + list(token_ids_0) + bos + list(token_ids_1)

    def save_vocabulary(self, save_directory: str, filename_prefix: Optional[str] = None):
        name = (filename_prefix + "-" if filename_prefix else "") + VOCAB_FILES_NAMES["vocab_file"]
        out = os.path.join(save_directory, name)
        if os.path.abspath(out) != os.path.abspath(self.vocab_file):
            with open(self.vocab_file, "rb") as src, open(out, "wb") as dst:
                dst.write(src.read())
        return (out,)
