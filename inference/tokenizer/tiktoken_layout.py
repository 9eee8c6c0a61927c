"""The tiktoken layout of checkpoints (Kimi-K2 / Kimi-Linear releases): `tiktoken.model` holds the
BPE ranks (base64 token, rank per line), `tokenizer_config.json` the special tokens
(`added_tokens_decoder`), and the pre-tokenizer pattern belongs to the family's tokenizer code,
so it is data here, registered per family (`TIKTOKEN_FAMILIES`); a `pat_str` in
`tokenizer_config.json` overrides it. Ids past the ranks are special: the named ones, then
`<|reserved_token_{id}|>` up to the family's reserved count."""

from __future__ import annotations

import base64
import functools
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from inference.tokenizer.base import TokenizerFilesError, special_token_id


@dataclass(frozen=True, slots=True)
class TiktokenFamily:
    pattern: str
    num_reserved_special_tokens: int = 0


_KIMI_PATTERN = "|".join(
    [
        r"""[\p{Han}]+""",
        r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]*[\p{Ll}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?""",
        r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]+[\p{Ll}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?""",
        r"""\p{N}{1,3}""",
        r""" ?[^\s\p{L}\p{N}]+[\r\n]*""",
        r"""\s*[\r\n]+""",
        r"""\s+(?!\S)""",
        r"""\s+""",
    ]
)

# family -> its tokenizer code's pattern; keyed by the module `tokenizer_config.json`'s auto_map
# names (`tokenization_kimi.TikTokenTokenizer`)
TIKTOKEN_FAMILIES: dict[str, TiktokenFamily] = {
    "tokenization_kimi": TiktokenFamily(_KIMI_PATTERN, num_reserved_special_tokens=256),
}


def read_ranks(path: Path) -> dict[bytes, int]:
    """`tiktoken.model`: one `base64-token rank` pair per line."""
    ranks: dict[bytes, int] = {}
    for n, line in enumerate(path.read_bytes().splitlines(), 1):
        if not line.strip():
            continue
        try:
            token, rank = line.split()
            ranks[base64.b64decode(token, validate=True)] = int(rank)
        except ValueError:
            raise TokenizerFilesError(
                f"{path}:{n}: not a tiktoken rank line (want 'BASE64TOKEN RANK')"
            ) from None
    return ranks


def family_of(tokenizer_config: Mapping[str, Any], path: Path) -> TiktokenFamily:
    auto = (tokenizer_config.get("auto_map") or {}).get("AutoTokenizer") or []
    modules = {str(a).split(".")[0] for a in (auto if isinstance(auto, list) else [auto]) if a}
    found = [TIKTOKEN_FAMILIES[m] for m in modules if m in TIKTOKEN_FAMILIES]
    pattern = tokenizer_config.get("pat_str")
    if isinstance(pattern, str):
        return TiktokenFamily(pattern, found[0].num_reserved_special_tokens if found else 0)
    if not found:
        raise TokenizerFilesError(
            f"{path}: tiktoken.model needs its family's pre-tokenizer pattern; tokenizer_config.json's "
            f"auto_map names {sorted(modules) or 'no tokenizer module'}, known: {sorted(TIKTOKEN_FAMILIES)}. "
            "Add the pattern as `pat_str` to tokenizer_config.json."
        )
    return found[0]


class TiktokenTokenizer:
    def __init__(
        self,
        model_file: str | Path,
        *,
        family: TiktokenFamily,
        added_tokens: Mapping[int, Mapping[str, Any]],
        bos_token_id: int | None = None,
        eos_token_ids: tuple[int, ...] = (),
    ) -> None:
        import tiktoken

        path = Path(model_file)
        self._ranks = read_ranks(path)
        num_base = len(self._ranks)
        named = {i: str(t["content"]) for i, t in added_tokens.items() if isinstance(t.get("content"), str)}
        top = max([num_base + family.num_reserved_special_tokens - 1, *named], default=num_base - 1)
        self.special_tokens = {named.get(i, f"<|reserved_token_{i}|>"): i for i in range(num_base, top + 1)}
        if below := sorted(i for i in named if i < num_base):
            raise TokenizerFilesError(
                f"{path.parent / 'tokenizer_config.json'}: added tokens {below[:5]} fall inside "
                f"tiktoken.model's {num_base} ranks"
            )
        try:
            self._enc = tiktoken.Encoding(
                name=path.parent.name or "checkpoint",
                pat_str=family.pattern,
                mergeable_ranks=self._ranks,
                special_tokens=self.special_tokens,
            )
        except ValueError as exc:
            raise TokenizerFilesError(f"{path}: {exc}") from None
        self._pattern = family.pattern
        self._id_to_special = {i: t for t, i in self.special_tokens.items()}
        self.vocab_size = top + 1
        self.bos_token_id = bos_token_id
        self.eos_token_ids = eos_token_ids

    def token_id(self, token: str) -> int:
        return special_token_id(self.special_tokens, token)

    def is_special(self, token_id: int) -> bool:
        return token_id in self._id_to_special

    def encode(self, text: str, *, allow_special: bool = False) -> list[int]:
        if allow_special:
            return self._enc.encode(text, allowed_special="all", disallowed_special=())
        return self._enc.encode_ordinary(text)

    def decode(self, ids: Iterable[int], *, skip_special_tokens: bool = False) -> str:
        table = self.token_bytes()
        return b"".join(
            table[t] for t in ids if not (skip_special_tokens and t in self._id_to_special)
        ).decode("utf-8", errors="replace")

    @functools.cache  # noqa: B019 - one table per tokenizer, which lives as long as its engine
    def token_bytes(self) -> list[bytes]:
        table = [b""] * self.vocab_size
        for b, i in self._ranks.items():
            table[i] = b
        for t, i in self.special_tokens.items():
            table[i] = t.encode()
        return table

    @functools.cache  # noqa: B019
    def grammar_tokenizer(self) -> Any:
        import llguidance

        return llguidance.LLTokenizer.from_tiktoken(
            encoder=self._ranks,
            special_tokens=self.special_tokens,
            pattern=self._pattern,
            eos_token=list(self.eos_token_ids) or None,
            n_vocab=self.vocab_size,
        )
