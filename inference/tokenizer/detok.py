"""Incremental detokenization: text out as token ids come in, O(new tokens) per push.

Where a tokenizer describes its ids as bytes (byte tokenizer, byte-level BPE, tiktoken), the
stream is the concatenation of those bytes through an incremental UTF-8 decoder: exact, and an
incomplete character is held back until it completes. Other tokenizers (sentencepiece-style
`tokenizer.json` decoders that strip or merge spaces) decode a short window of recent ids and
emit what it adds, as the field does (a prefix offset and a read offset).
"""

from __future__ import annotations

import codecs
from collections.abc import Iterable

from inference.tokenizer.base import Tokenizer


class BytesDecoder:
    def __init__(self, tokenizer: Tokenizer, table: list[bytes], *, skip_special_tokens: bool) -> None:
        self.tok = tokenizer
        self.table = table
        self.skip = skip_special_tokens
        self._utf8 = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def push(self, ids: Iterable[int]) -> str:
        is_special = self.tok.is_special
        if type(ids) is list and len(ids) == 1:  # a decode step's one token: no generator, no join
            t = ids[0]
            if self.skip and is_special(t):
                return ""
            return self._utf8.decode(self.table[t] if 0 <= t < len(self.table) else b"\xef\xbf\xbd")
        data = b"".join(
            self.table[t] if 0 <= t < len(self.table) else b"\xef\xbf\xbd"
            for t in ids
            if not (self.skip and is_special(t))
        )
        return self._utf8.decode(data)

    def flush(self) -> str:
        return self._utf8.decode(b"", final=True)


class WindowDecoder:
    """Decodes ids[prefix:] and emits the text past ids[prefix:read]; a trailing U+FFFD (an
    incomplete character) is held back. The window moves on once text is emitted."""

    def __init__(self, tokenizer: Tokenizer, *, skip_special_tokens: bool) -> None:
        self.tok = tokenizer
        self.skip = skip_special_tokens
        self.ids: list[int] = []
        self.prefix = 0  # start of the decoding window
        self.read = 0  # ids whose text has been emitted

    def _text(self, lo: int, hi: int) -> str:
        return self.tok.decode(self.ids[lo:hi], skip_special_tokens=self.skip)

    def push(self, ids: Iterable[int]) -> str:
        self.ids.extend(ids)
        done = self._text(self.prefix, self.read)
        full = self._text(self.prefix, len(self.ids))
        if len(full) <= len(done) or full.endswith("\ufffd"):
            return ""
        self.prefix, self.read = self.read, len(self.ids)
        return full[len(done) :]

    def flush(self) -> str:
        out = self._text(self.prefix, len(self.ids))[len(self._text(self.prefix, self.read)) :]
        self.prefix = self.read = len(self.ids)
        return out


def make_detokenizer(
    tokenizer: Tokenizer, *, skip_special_tokens: bool = False
) -> BytesDecoder | WindowDecoder:
    table = tokenizer.token_bytes()
    if table is not None:
        return BytesDecoder(tokenizer, table, skip_special_tokens=skip_special_tokens)
    return WindowDecoder(tokenizer, skip_special_tokens=skip_special_tokens)
