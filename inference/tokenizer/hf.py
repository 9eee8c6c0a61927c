"""A checkpoint's `tokenizer.json` (Hugging Face `tokenizers`), as transformers' fast tokenizer
uses it: the added tokens of `tokenizer_config.json` that the JSON lacks are added, and
`encode(allow_special=True)` is exactly transformers' `tokenizer(text, add_special_tokens=False)`.
User text is encoded with special tokens treated as plain text."""

from __future__ import annotations

import functools
import json
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from inference.tokenizer.base import TokenizerFilesError, special_token_id


def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's reversible byte -> printable character map (what a ByteLevel BPE vocab spells)."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1))
    bs += list(range(ord("®"), ord("ÿ") + 1))
    cs = list(bs)
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {b: chr(c) for b, c in zip(bs, cs, strict=True)}


def _is_byte_level(decoder: Any) -> bool:
    if not isinstance(decoder, Mapping):
        return False
    if decoder.get("type") == "ByteLevel":
        return True
    return decoder.get("type") == "Sequence" and any(_is_byte_level(d) for d in decoder.get("decoders", []))


class HFTokenizer:
    def __init__(
        self,
        path: str | Path,
        *,
        added_tokens: Mapping[int, Mapping[str, Any]] | None = None,
        bos_token_id: int | None = None,
        eos_token_ids: tuple[int, ...] = (),
    ) -> None:
        """`added_tokens`: `tokenizer_config.json`'s `added_tokens_decoder` (id -> {content,
        special, ...}); `bos_token_id`/`eos_token_ids` as the checkpoint's configs name them."""
        from tokenizers import AddedToken
        from tokenizers import Tokenizer as _Tok

        try:
            self._tok = _Tok.from_file(str(path))
        except Exception as exc:  # the library's error type is not exported
            raise TokenizerFilesError(f"{path}: not a readable tokenizer.json ({exc})") from None
        known = {i: t.content for i, t in self._tok.get_added_tokens_decoder().items()}
        for i, tok in sorted((added_tokens or {}).items()):
            content = tok.get("content")
            if known.get(i) == content or not isinstance(content, str):
                continue
            self._tok.add_tokens(
                [
                    AddedToken(
                        content,
                        special=bool(tok.get("special", False)),
                        lstrip=bool(tok.get("lstrip", False)),
                        rstrip=bool(tok.get("rstrip", False)),
                        normalized=bool(tok.get("normalized", not tok.get("special", False))),
                        single_word=bool(tok.get("single_word", False)),
                    )
                ]
            )
            if self._tok.token_to_id(content) != i:
                raise TokenizerFilesError(
                    f"tokenizer_config.json names {content!r} as id {i}, but tokenizer.json gives it "
                    f"id {self._tok.token_to_id(content)}: the two files are from different checkpoints"
                )
        # a second instance that never splits special tokens out of the text (user content)
        self._plain = _Tok.from_str(self._tok.to_str())
        self._plain.encode_special_tokens = True
        self.vocab_size = self._tok.get_vocab_size(with_added_tokens=True)
        decoder = self._tok.get_added_tokens_decoder()
        self.special_tokens = {t.content: i for i, t in decoder.items() if t.special}
        self._special_ids = frozenset(self.special_tokens.values())
        self.bos_token_id = bos_token_id
        self.eos_token_ids = eos_token_ids

    def token_id(self, token: str) -> int:
        i = self._tok.token_to_id(token)
        return special_token_id({token: i} if i is not None else {}, token)

    def is_special(self, token_id: int) -> bool:
        return token_id in self._special_ids

    def encode(self, text: str, *, allow_special: bool = False) -> list[int]:
        return (self._tok if allow_special else self._plain).encode(text, add_special_tokens=False).ids

    def decode(self, ids: Iterable[int], *, skip_special_tokens: bool = False) -> str:
        return self._tok.decode(list(ids), skip_special_tokens=skip_special_tokens)

    @functools.cache  # noqa: B019 - one table per tokenizer, which lives as long as its engine
    def token_bytes(self) -> list[bytes] | None:
        """Each id's bytes for a byte-level BPE; None for other decoders (sentencepiece-style
        spaces, byte fallback), which decode through `WindowDecoder`."""
        if not _is_byte_level(json.loads(self._tok.to_str()).get("decoder")):
            return None
        inverse = {c: b for b, c in _bytes_to_unicode().items()}
        added = self._tok.get_added_tokens_decoder()
        table = [b""] * self.vocab_size
        for tok, i in self._tok.get_vocab(with_added_tokens=True).items():
            if i in added:
                table[i] = added[i].content.encode()
            elif all(c in inverse for c in tok):
                table[i] = bytes(inverse[c] for c in tok)
            else:
                table[i] = tok.encode()
        return table

    @functools.cache  # noqa: B019
    def grammar_tokenizer(self) -> Any:
        import llguidance

        return llguidance.LLTokenizer(
            self._tok.to_str(), n_vocab=self.vocab_size, eos_token=list(self.eos_token_ids) or None
        )
