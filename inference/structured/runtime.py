"""Per-request grammar state inside the engine: one llguidance matcher per constrained request,
the allowed-token bitmask of each sampled row, and the tokens it consumes.

Masks are int32 bitmasks (bit `t % 32` of word `t // 32` allows token `t`), computed on the host
by llguidance's thread pool for all rows at once; the engine starts that work before the forward
and the model runner waits for it only at sampling, so on a GPU it overlaps the step.

Budget rule: a constrained answer must finish inside `max_tokens`. In a request's last
`CLOSING_WINDOW` tokens, where the grammar allows a token that closes a JSON value (its bytes are
only `"`, `]`, `}`, or an end-of-sequence token), only those are allowed, so open strings,
arrays and objects close instead of running out.
"""

from __future__ import annotations

import concurrent.futures
from collections.abc import Sequence
from typing import Any

import numpy as np

from inference.tokenizer import Tokenizer

CLOSING_WINDOW = 32
_CLOSERS = frozenset(b'"]}')


def closing_mask(tokenizer: Tokenizer, words: int) -> np.ndarray:
    allowed = np.zeros(words * 32, dtype=bool)
    table = tokenizer.token_bytes()
    if table is not None:
        for i, b in enumerate(table):
            if b and not tokenizer.is_special(i) and set(b) <= _CLOSERS:
                allowed[i] = True
    allowed[list(tokenizer.eos_token_ids)] = True
    return np.packbits(allowed, bitorder="little").view(np.int32)


class GrammarRuntime:
    def __init__(self, tokenizer: Tokenizer) -> None:
        import llguidance

        self._ll = llguidance
        self.tok = tokenizer.grammar_tokenizer()
        self.vocab_size = tokenizer.vocab_size
        self.words = (self.vocab_size + 31) // 32
        self.closing = closing_mask(tokenizer, self.words)
        self.executor = llguidance.LLExecutor()
        self.matchers: dict[str, Any] = {}
        self.remaining: dict[str, int] = {}
        self._pool = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="grammar-mask")

    def add(self, req_id: str, grammar: str, max_tokens: int) -> None:
        m = self._ll.LLMatcher(self.tok, self._ll.LLMatcher.grammar_from_lark(grammar), log_level=0)
        if m.is_error():
            raise ValueError(f"the request's grammar is invalid: {m.get_error()}")
        self.matchers[req_id] = m
        self.remaining[req_id] = max_tokens

    def drop(self, req_id: str) -> None:
        self.matchers.pop(req_id, None)
        self.remaining.pop(req_id, None)

    def __contains__(self, req_id: str) -> bool:
        return req_id in self.matchers

    def compute(self, req_ids: Sequence[str]) -> dict[str, np.ndarray]:
        """Bitmasks of the constrained requests among `req_ids` (their next token)."""
        rows = [r for r in req_ids if r in self.matchers]
        if not rows:
            return {}
        masks = np.zeros((len(rows), self.words), dtype=np.int32)
        self.executor.unsafe_compute_mask_ptr(
            [(self.matchers[r], i) for i, r in enumerate(rows)], masks.ctypes.data, self.words * 4, len(rows)
        )
        out = {}
        for i, r in enumerate(rows):
            row = masks[i]
            if self.remaining[r] <= CLOSING_WINDOW:
                closing = row & self.closing
                if closing.any():
                    row = closing
            out[r] = row
        return out

    def start(self, req_ids: Sequence[str]) -> concurrent.futures.Future | None:
        """`compute` on a thread (None when no request in `req_ids` is constrained)."""
        if not any(r in self.matchers for r in req_ids):
            return None
        return self._pool.submit(self.compute, list(req_ids))

    def consume(self, req_id: str, token: int) -> bool:
        """Advance a request's matcher; True when its grammar is complete (nothing may follow)."""
        m = self.matchers.get(req_id)
        if m is None:
            return False
        self.remaining[req_id] -= 1
        if not m.consume_token(token):
            raise RuntimeError(f"token {token} broke the grammar of {req_id}: {m.get_error()}")
        return m.is_stopped()
