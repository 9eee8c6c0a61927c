"""llguidance over a byte-level vocabulary: token i < 256 is the byte i, then the special tokens.

Lets a test run a JSON schema's grammar over text without a model's tokenizer."""

from __future__ import annotations

import functools
import json
from collections.abc import Sequence
from typing import Any

import llguidance

# The grammar options the serving path uses: compact JSON (no free whitespace).
STRICT: dict[str, Any] = {"whitespace_flexible": False}
# Separators of `json.dumps(x, separators=(", ", ": "))`; without them a non-flexible grammar only
# admits "," and ":".
SPACED: dict[str, Any] = {**STRICT, "item_separator": ", ", "key_separator": ": "}
SEPARATORS = {"compact": ((",", ":"), STRICT), "spaced": ((", ", ": "), SPACED)}


class ByteVocab:
    """The object `llguidance.TokenizerWrapper` reads: `tokens`, `eos_token_id`, `bos_token_id`,
    `special_token_ids`, and a call that encodes text (bytes or str) to ids."""

    def __init__(self, special_tokens: Sequence[str] = ("<|eos|>",)) -> None:
        self.tokens = [bytes([i]) for i in range(256)] + [t.encode() for t in special_tokens]
        self.eos_token_id = 256
        self.bos_token_id = None
        self.special_token_ids = list(range(256, 256 + len(special_tokens)))

    def __call__(self, text: bytes | str) -> list[int]:
        return list(text.encode("utf-8") if isinstance(text, str) else text)


@functools.cache
def byte_tokenizer() -> llguidance.LLTokenizer:
    return llguidance.LLTokenizer(llguidance.TokenizerWrapper(ByteVocab()))


def compile_schema(schema: dict, options: dict[str, Any] = STRICT) -> tuple[str, str | None, list[str]]:
    """(grammar, error or None, warnings) as `LLMatcher.validate_grammar_with_warnings` reports them."""
    grammar = llguidance.LLMatcher.grammar_from_json_schema(schema, defaults=options)
    is_error, messages = llguidance.LLMatcher.validate_grammar_with_warnings(grammar)
    return grammar, (messages[0] if is_error else None), ([] if is_error else list(messages))


def accepts(grammar: str, text: str) -> tuple[bool, str]:
    """Feed `text` byte by byte; (whether every byte was taken and the grammar may stop there, the
    first line of the matcher's error)."""
    tok = byte_tokenizer()
    matcher = llguidance.LLMatcher(tok, grammar, log_level=0)
    ok = matcher.consume_tokens(tok.tokenize_str(text)) and matcher.is_accepting()
    return ok, matcher.get_error().split("\n", 1)[0]


def dumps(instance: Any, style: str) -> str:
    return json.dumps(instance, separators=SEPARATORS[style][0], ensure_ascii=False)
