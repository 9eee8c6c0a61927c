"""Tokenizers for the engine.

`ByteTokenizer` is the bundled tokenizer of the small random-weight model (no hub downloads are
possible): ids 0..255 are the raw UTF-8 bytes, then the Kimi chat/tool/media special tokens.
Byte-level with no merges makes decode -> encode the identity for any text, which is what lets
the next agent turn re-tokenize the previous reply into exactly the ids the model generated
(and so hit the prefix cache right through it). `HFTokenizer` wraps a `tokenizer.json` from a
model directory for real checkpoints.
"""

from __future__ import annotations

import codecs
import re
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Protocol

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


class Tokenizer(Protocol):
    vocab_size: int
    bos_token_id: int | None
    eos_token_ids: tuple[int, ...]

    def encode(self, text: str, *, allow_special: bool = False) -> list[int]: ...
    def decode(self, ids: Iterable[int], *, skip_special_tokens: bool = False) -> str: ...
    def token_id(self, token: str) -> int: ...
    def is_special(self, token_id: int) -> bool: ...


class ByteTokenizer:
    """UTF-8 bytes + named special tokens. `encode(allow_special=False)` never produces a special
    id from user text (a message cannot forge `<|im_end|>`)."""

    def __init__(self, special_tokens: Sequence[str] = KIMI_SPECIAL_TOKENS) -> None:
        self.special_tokens = tuple(special_tokens)
        self._special_ids = {t: 256 + i for i, t in enumerate(self.special_tokens)}
        self._id_to_special = {v: k for k, v in self._special_ids.items()}
        self.vocab_size = 256 + len(self.special_tokens)
        self.bos_token_id = self._special_ids.get("[BOS]")
        self.eos_token_ids = tuple(
            self._special_ids[t] for t in ("<|im_end|>", "[EOS]") if t in self._special_ids
        )
        self._split = re.compile("(" + "|".join(re.escape(t) for t in self.special_tokens) + ")")

    def token_id(self, token: str) -> int:
        try:
            return self._special_ids[token]
        except KeyError:
            raise ValueError(f"unknown special token {token!r}") from None

    def is_special(self, token_id: int) -> bool:
        return token_id >= 256

    def encode(self, text: str, *, allow_special: bool = False) -> list[int]:
        if not allow_special:
            return list(text.encode("utf-8"))
        out: list[int] = []
        for part in self._split.split(text):
            if part in self._special_ids:
                out.append(self._special_ids[part])
            elif part:
                out.extend(part.encode("utf-8"))
        return out

    def decode(self, ids: Iterable[int], *, skip_special_tokens: bool = False) -> str:
        dec = IncrementalDecoder(self, skip_special_tokens=skip_special_tokens)
        return dec.push(ids) + dec.flush()


class IncrementalDecoder:
    """Streams text from token ids; an incomplete UTF-8 sequence is held back until complete."""

    def __init__(self, tokenizer: ByteTokenizer, *, skip_special_tokens: bool = False) -> None:
        self.tok = tokenizer
        self.skip = skip_special_tokens
        self._utf8 = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def push(self, ids: Iterable[int]) -> str:
        out = []
        buf = bytearray()
        for t in ids:
            if t < 256:
                buf.append(t)
                continue
            if buf:
                out.append(self._utf8.decode(bytes(buf)))
                buf.clear()
            if not self.skip:
                out.append(self._utf8.decode(b"", final=True))
                out.append(self.tok._id_to_special.get(t, f"<|unk_{t}|>"))
        if buf:
            out.append(self._utf8.decode(bytes(buf)))
        return "".join(out)

    def flush(self) -> str:
        return self._utf8.decode(b"", final=True)


class HFTokenizer:
    """A `tokenizer.json` (Hugging Face `tokenizers`) from a model directory."""

    def __init__(self, path: str | Path) -> None:
        from tokenizers import Tokenizer as _Tok

        self._tok = _Tok.from_file(str(path))
        self.vocab_size = self._tok.get_vocab_size(with_added_tokens=True)
        self.bos_token_id = self._tok.token_to_id("[BOS]")
        self.eos_token_ids = tuple(
            i for i in (self._tok.token_to_id("<|im_end|>"), self._tok.token_to_id("[EOS]")) if i is not None
        )
        added = self._tok.get_added_tokens_decoder()
        self._special = {i for i, t in added.items() if t.special}

    def token_id(self, token: str) -> int:
        i = self._tok.token_to_id(token)
        if i is None:
            raise ValueError(f"unknown special token {token!r}")
        return i

    def is_special(self, token_id: int) -> bool:
        return token_id in self._special

    def encode(self, text: str, *, allow_special: bool = False) -> list[int]:
        return self._tok.encode(text, add_special_tokens=False).ids

    def decode(self, ids: Iterable[int], *, skip_special_tokens: bool = False) -> str:
        return self._tok.decode(list(ids), skip_special_tokens=skip_special_tokens)


class _DiffDecoder:
    """Streaming decode for tokenizers without a byte-level view: decode all, emit the new tail
    (a trailing U+FFFD, an incomplete character, is held back)."""

    def __init__(self, tokenizer: Tokenizer, *, skip_special_tokens: bool = False) -> None:
        self.tok = tokenizer
        self.skip = skip_special_tokens
        self.ids: list[int] = []
        self.sent = 0

    def push(self, ids: Iterable[int]) -> str:
        self.ids.extend(ids)
        text = self.tok.decode(self.ids, skip_special_tokens=self.skip)
        stable = len(text.rstrip("\ufffd"))
        out, self.sent = text[self.sent : stable], max(self.sent, stable)
        return out

    def flush(self) -> str:
        text = self.tok.decode(self.ids, skip_special_tokens=self.skip)
        out, self.sent = text[self.sent :], len(text)
        return out


def make_detokenizer(
    tokenizer: Tokenizer, *, skip_special_tokens: bool = False
) -> IncrementalDecoder | _DiffDecoder:
    if isinstance(tokenizer, ByteTokenizer):
        return IncrementalDecoder(tokenizer, skip_special_tokens=skip_special_tokens)
    return _DiffDecoder(tokenizer, skip_special_tokens=skip_special_tokens)


def load_tokenizer(model_dir: str | Path | None) -> ByteTokenizer | HFTokenizer:
    """The model directory's `tokenizer.json` if it has one, else the bundled byte tokenizer."""
    if model_dir is not None and (Path(model_dir) / "tokenizer.json").is_file():
        return HFTokenizer(Path(model_dir) / "tokenizer.json")
    return ByteTokenizer()
