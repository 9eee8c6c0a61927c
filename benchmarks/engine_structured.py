"""`benchmarks.engine`'s `structured` section: decode with every request constrained by a JSON-schema
grammar vs none, on the same engine, over a tokenizer that spans the model's whole vocabulary."""

from __future__ import annotations

import json
from typing import Any

from benchmarks.engine_setup import engine_decode
from inference.tokenizer import ByteTokenizer

# the grammar of the structured section: a JSON object holding a list of short strings that may
# not close before 10,000 items (every step computes a real JSON mask; no answer completes while
# timed)
STRUCTURED_SCHEMA = {
    "type": "object",
    "properties": {
        "items": {"type": "array", "items": {"type": "string", "maxLength": 24}, "minItems": 10000}
    },
    "required": ["items"],
    "additionalProperties": False,
}


class WideVocab(ByteTokenizer):
    """A tokenizer over the model's whole vocabulary for the grammar's sake: the 256 bytes, the
    Kimi special tokens, then distinct multi-byte tokens of JSON-ish text (2- and 3-character
    strings), so a mask is computed over as many ids as a real checkpoint's (~160K) and many of
    them are valid JSON continuations, as in a real vocabulary. Prompts encode as bytes."""

    def __init__(self, vocab_size: int) -> None:
        super().__init__()
        chars = [chr(c) for c in range(32, 127)]
        extra: list[bytes] = []
        for n in (2, 3):
            for i in range(len(chars) ** n):
                if 256 + len(self.special_tokens) + len(extra) >= vocab_size:
                    break
                s, k = "", i
                for _ in range(n):
                    s, k = s + chars[k % len(chars)], k // len(chars)
                extra.append(s.encode())
        self._table = [bytes([i]) for i in range(256)] + [t.encode() for t in self.special_tokens] + extra
        self.vocab_size = len(self._table)

    def is_special(self, token_id: int) -> bool:
        return 256 <= token_id < 256 + len(self.special_tokens)

    def token_bytes(self) -> list[bytes]:
        return self._table

    def grammar_tokenizer(self) -> Any:
        import llguidance

        tok = self

        class _Vocab:
            def __init__(self) -> None:
                self.eos_token_id, self.bos_token_id = tok.eos_token_ids[0], None
                self.tokens = tok._table
                self.special_token_ids = list(range(256, 256 + len(tok.special_tokens)))

            def __call__(self, text: str | bytes) -> list[int]:
                return list(text if isinstance(text, bytes) else text.encode())

        return llguidance.LLTokenizer(
            llguidance.TokenizerWrapper(_Vocab()), eos_token=list(tok.eos_token_ids)
        )


def structured_decode(model, spec, dtype, device, batches, plen: int, steps: int) -> dict[str, Any]:
    """Decode tok/s with every request constrained by a JSON-schema grammar vs none, same engine
    shape, over the model's whole vocabulary (`WideVocab`); the overhead is the mask computation
    (overlapped with the forward) and its application per step."""
    from inference.structured.grammar import with_options

    grammar = "start: %json " + json.dumps(with_options(STRUCTURED_SCHEMA))
    tok = WideVocab(spec.vocab_size)
    out: dict[str, Any] = {"vocab": tok.vocab_size}
    for b in batches:
        free = engine_decode(model, spec, dtype, device, b, plen, steps, tokenizer=tok)
        constrained = engine_decode(
            model, spec, dtype, device, b, plen, steps, grammar=grammar, tokenizer=tok
        )
        out[f"b{b}"] = {
            "free_tok_per_s": free["tok_per_s"],
            "constrained_tok_per_s": constrained["tok_per_s"],
            "overhead_pct": round(100 * (free["tok_per_s"] / constrained["tok_per_s"] - 1), 2),
            "constrained_ms_per_step": constrained["ms_per_step"],
            "free_ms_per_step": free["ms_per_step"],
            "free": free,
            "constrained": constrained,
        }
    return out
