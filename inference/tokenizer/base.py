"""What every tokenizer of the engine offers, and the errors a checkpoint's tokenizer files raise.

A tokenizer knows its special tokens by name (from the checkpoint's files, never from constants),
encodes text either with special-token names recognised (template text) or never (user text: a
message cannot forge `<|im_end|>`), and describes each id as bytes so output can be decoded
incrementally and a grammar engine can build its token trie.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, Protocol


class TokenizerFilesError(ValueError):
    """A checkpoint's tokenizer files are missing or unusable; the message names the file and what
    to do."""


class Tokenizer(Protocol):
    vocab_size: int
    bos_token_id: int | None
    eos_token_ids: tuple[int, ...]
    special_tokens: Mapping[str, int]  # every special token's text -> id

    def encode(self, text: str, *, allow_special: bool = False) -> list[int]: ...
    def decode(self, ids: Iterable[int], *, skip_special_tokens: bool = False) -> str: ...
    def token_id(self, token: str) -> int: ...
    def is_special(self, token_id: int) -> bool: ...
    def token_bytes(self) -> list[bytes] | None: ...  # per id; None where ids are not bytes
    def grammar_tokenizer(self) -> Any: ...  # the llguidance tokenizer (cached)


def special_token_id(specials: Mapping[str, int], token: str) -> int:
    """`token`'s id, or a ValueError naming it (what `Tokenizer.token_id` raises)."""
    try:
        return specials[token]
    except KeyError:
        raise ValueError(f"unknown special token {token!r}") from None


def ids_of(value: Any, lookup: Mapping[str, int]) -> list[int]:
    """Token ids named by a config value: an id, a list of ids, a token's text or an
    `{"content": text}` object (as `tokenizer_config.json` writes them); unknown texts are dropped."""
    if value is None:
        return []
    if isinstance(value, bool):
        return []
    if isinstance(value, int):
        return [value]
    if isinstance(value, list):
        return [i for v in value for i in ids_of(v, lookup)]
    if isinstance(value, Mapping):
        return ids_of(value.get("content"), lookup)
    if isinstance(value, str) and value in lookup:
        return [lookup[value]]
    return []
