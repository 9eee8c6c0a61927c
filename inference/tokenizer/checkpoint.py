"""A checkpoint folder's tokenizer, as released: `tokenizer.json`, or the tiktoken layout
(`tiktoken.model` + `tokenizer_config.json`). BOS and the stop ids come from the checkpoint's
`generation_config.json`, `config.json` and `tokenizer_config.json` (their union, in that order),
never from constants. A folder with neither file is refused: the byte tokenizer is only for
random-weight `--dummy` configs."""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from inference.tokenizer.base import Tokenizer, TokenizerFilesError, ids_of
from inference.tokenizer.hf import HFTokenizer
from inference.tokenizer.tiktoken_layout import TiktokenTokenizer, family_of


def read_json(path: Path) -> dict[str, Any]:
    """A checkpoint's JSON file ({} when absent); a malformed one is refused by name."""
    if not path.is_file():
        return {}
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (ValueError, UnicodeDecodeError) as exc:
        raise TokenizerFilesError(f"{path}: not valid JSON ({exc})") from None
    if not isinstance(data, dict):
        raise TokenizerFilesError(f"{path}: must hold a JSON object")
    return data


def _added_tokens(config: Mapping[str, Any], path: Path) -> dict[int, Mapping[str, Any]]:
    raw = config.get("added_tokens_decoder") or {}
    try:
        return {int(k): v for k, v in raw.items() if isinstance(v, Mapping)}
    except (ValueError, AttributeError):
        raise TokenizerFilesError(f"{path}: added_tokens_decoder must map ids to token objects") from None


def _lookup(tok: Tokenizer) -> dict[str, int]:
    return dict(tok.special_tokens)


def load_tokenizer(model_dir: str | Path) -> Tokenizer:
    d = Path(model_dir)
    tcfg_path = d / "tokenizer_config.json"
    tcfg = read_json(tcfg_path)
    gen = read_json(d / "generation_config.json")
    cfg = read_json(d / "config.json")
    added = _added_tokens(tcfg, tcfg_path)
    tok: HFTokenizer | TiktokenTokenizer
    if (d / "tokenizer.json").is_file():
        tok = HFTokenizer(d / "tokenizer.json", added_tokens=added)
    elif (d / "tiktoken.model").is_file():
        if not tcfg:
            raise TokenizerFilesError(f"{tcfg_path}: missing; tiktoken.model needs it for its special tokens")
        tok = TiktokenTokenizer(d / "tiktoken.model", family=family_of(tcfg, d), added_tokens=added)
    else:
        raise TokenizerFilesError(
            f"{d}: no tokenizer; a checkpoint folder needs tokenizer.json (Hugging Face tokenizers) or "
            "tiktoken.model + tokenizer_config.json, as the model was released (random weights: --dummy CONFIG)"
        )
    lookup = _lookup(tok)
    text_cfg = cfg.get("text_config") if isinstance(cfg.get("text_config"), Mapping) else {}

    def named(value: Any) -> list[int]:
        ids = ids_of(value, lookup)
        if not ids and isinstance(value, str | Mapping):  # a plain (non-special) token by name
            text = value if isinstance(value, str) else value.get("content")
            try:
                ids = [tok.token_id(text)] if isinstance(text, str) else []
            except ValueError:
                ids = []
        return ids

    bos = (
        named(tcfg.get("bos_token"))
        or ids_of(gen.get("bos_token_id"), lookup)
        or ids_of(cfg.get("bos_token_id", text_cfg.get("bos_token_id")), lookup)
    )
    eos: list[int] = []
    for source in (
        ids_of(gen.get("eos_token_id"), lookup),
        ids_of(cfg.get("eos_token_id", text_cfg.get("eos_token_id")), lookup),
        named(tcfg.get("eos_token")),
    ):
        eos += [i for i in source if i not in eos]
    if not eos:
        raise TokenizerFilesError(
            f"{d}: no end-of-sequence token: set eos_token_id in generation_config.json or eos_token in "
            "tokenizer_config.json"
        )
    if bad := [i for i in eos + bos if not 0 <= i < tok.vocab_size]:
        raise TokenizerFilesError(
            f"{d}: token ids {bad} of the configs are outside the tokenizer's {tok.vocab_size}"
        )
    tok.bos_token_id = bos[0] if bos else None
    tok.eos_token_ids = tuple(eos)
    return tok
