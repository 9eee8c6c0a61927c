"""The byte tokenizer of random-weight (`--dummy`) models: no checkpoint, so no tokenizer files.

Ids 0..255 are the raw UTF-8 bytes, then named special tokens (the Kimi chat layout's by default,
which the bundled Kimi-layout chat template uses). Byte-level with no merges makes decode ->
encode the identity for any text, so the next agent turn re-tokenizes the previous reply into
exactly the ids the model generated (and hits the prefix cache right through it).
"""

from __future__ import annotations

import functools
import re
from collections.abc import Iterable, Sequence
from typing import Any

from inference.tokenizer.base import special_token_id

KIMI_SPECIAL_TOKENS: tuple[str, ...] = (
    "[BOS]",
    "[EOS]",
    "[PAD]",
    "<|im_end|>",
    "<|im_user|>",
    "<|im_assistant|>",
    "<|im_system|>",
    "<|im_middle|>",
    "<|media_start|>",
    "<|media_content|>",
    "<|media_end|>",
    "<|media_pad|>",
    "<|tool_calls_section_begin|>",
    "<|tool_calls_section_end|>",
    "<|tool_call_begin|>",
    "<|tool_call_argument_begin|>",
    "<|tool_call_end|>",
    "<think>",
    "</think>",
)


class ByteTokenizer:
    """UTF-8 bytes + named special tokens. `encode(allow_special=False)` never produces a special
    id from user text (a message cannot forge `<|im_end|>`)."""

    def __init__(self, special_tokens: Sequence[str] = KIMI_SPECIAL_TOKENS) -> None:
        self.special_tokens = {t: 256 + i for i, t in enumerate(special_tokens)}
        self._id_to_special = {v: k for k, v in self.special_tokens.items()}
        self.vocab_size = 256 + len(self.special_tokens)
        self.bos_token_id = self.special_tokens.get("[BOS]")
        self.eos_token_ids = tuple(
            self.special_tokens[t] for t in ("<|im_end|>", "[EOS]") if t in self.special_tokens
        )
        self._split = re.compile("(" + "|".join(re.escape(t) for t in self.special_tokens) + ")")

    def token_id(self, token: str) -> int:
        return special_token_id(self.special_tokens, token)

    def is_special(self, token_id: int) -> bool:
        return token_id >= 256

    def encode(self, text: str, *, allow_special: bool = False) -> list[int]:
        if not allow_special:
            return list(text.encode("utf-8"))
        out: list[int] = []
        for part in self._split.split(text):
            if part in self.special_tokens:
                out.append(self.special_tokens[part])
            elif part:
                out.extend(part.encode("utf-8"))
        return out

    def decode(self, ids: Iterable[int], *, skip_special_tokens: bool = False) -> str:
        table = self.token_bytes()
        return b"".join(table[t] for t in ids if not (skip_special_tokens and t >= 256)).decode(
            "utf-8", errors="replace"
        )

    @functools.cache  # noqa: B019 - one table per tokenizer, which lives as long as its engine
    def token_bytes(self) -> list[bytes]:
        return [bytes([i]) for i in range(256)] + [t.encode() for t in self.special_tokens]

    @functools.cache  # noqa: B019
    def grammar_tokenizer(self) -> Any:
        import llguidance

        tok = self

        class _Vocab:  # what llguidance's TokenizerWrapper reads
            def __init__(self) -> None:
                self.eos_token_id = tok.eos_token_ids[0]
                self.bos_token_id = tok.bos_token_id
                self.tokens = tok.token_bytes()
                self.special_token_ids = list(range(256, tok.vocab_size))

            def __call__(self, text: str | bytes) -> list[int]:
                return tok.encode(text.decode("utf-8", "replace") if isinstance(text, bytes) else text)

        return llguidance.LLTokenizer(
            llguidance.TokenizerWrapper(_Vocab()), eos_token=list(tok.eos_token_ids)
        )
