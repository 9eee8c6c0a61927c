"""Big tool results by reference, and the per-task context-window policy.

**By reference.** A tool result longer than `RunnerConfig.payload_ref_bytes` is stored in the blob
store (`preprocess.store.BlobStore`, content-addressed) and its history row carries a reference
instead of the text: the content `[{"type": "dayzero_blob", "sha256": ..., "bytes": n}]`. The
runner that wrote it keeps the text in memory; a runner that reads the transcript back resolves
each reference once per process (`PayloadCache`, an LRU bounded in bytes), so the model always
sees the whole text. History rows, and the WAL of each step, stay small. Attachments are by
reference from the start (the goal's `dayzero://attachments/<id>` parts); the text of a text file
or a parsed PDF is read through the same cache when the model step resolves them
(`orchestrator.attachments.resolve_images`), so once per runner process too.

**Context policy** (the task's budget: `max_context_tokens`, `context_policy`). Before each model
call the runner bounds the prompt it is about to send from above: the previous turn's prompt
tokens (the server's count) plus one token per UTF-8 byte of the messages since, plus
`PER_MESSAGE_TOKENS` per message for the template's markup (no token is shorter than a byte).
Without a previous turn the whole transcript is counted that way. Over the cap:
- `fail`: the task fails with the typed error `context_exceeded`;
- `trim_tool_results`: the oldest tool results are replaced by a short notice, one after another
  from the start of the transcript (the last model turn's results never), until the bound is at
  most `TRIM_TO` of the cap; what was trimmed stays trimmed in later turns (the boundary only
  moves forward, so the prompt's prefix changes only when it moves). If even then the bound is
  over the cap, the task fails `context_exceeded`. The history keeps every result whole.
The boundary and the previous turn's count are kept on the task row (`stored_context_state`,
written with the model turn), so a task claimed again resumes them: its prompt stays the one the
server has cached.
"""

from __future__ import annotations

import json
import threading
from collections import OrderedDict
from collections.abc import Sequence
from typing import Any

BLOB_PART = "dayzero_blob"
CONTEXT_POLICIES = ("fail", "trim_tool_results")
PER_MESSAGE_TOKENS = 16
TRIM_TO = 0.75


def reference(sha256: str, nbytes: int) -> list[dict[str, Any]]:
    return [{"type": BLOB_PART, "sha256": sha256, "bytes": nbytes}]


def referenced_sha(content: Any) -> str | None:
    """The blob a history row's content refers to, or None (inline content)."""
    if isinstance(content, list) and len(content) == 1 and isinstance(content[0], dict):
        part = content[0]
        if part.get("type") == BLOB_PART and isinstance(part.get("sha256"), str):
            return part["sha256"]
    return None


class PayloadCache:
    """Blob texts by sha256, read from the store once per process; an LRU bounded in bytes."""

    def __init__(self, store: Any, max_bytes: int = 256 << 20) -> None:
        self.store = store
        self.max_bytes = max_bytes
        self._items: OrderedDict[str, str] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()
        self.loads = 0  # reads from the store

    def put(self, text: str) -> str:
        data = text.encode()
        sha = self.store.put(data)
        self._remember(sha, text)
        return sha

    def text(self, sha: str) -> str:
        with self._lock:
            if sha in self._items:
                self._items.move_to_end(sha)
                return self._items[sha]
        # (a text this cache put is UTF-8; an uploaded text file may not be: as a reader shows it)
        text = self.store.get(sha).decode("utf-8", errors="replace")
        self.loads += 1
        self._remember(sha, text)
        return text

    def _remember(self, sha: str, text: str) -> None:
        with self._lock:
            if sha not in self._items:
                self._items[sha] = text
                self._bytes += len(text)
            while self._bytes > self.max_bytes and len(self._items) > 1:
                _, old = self._items.popitem(last=False)
                self._bytes -= len(old)

    def resolve(self, messages: list[dict[str, Any]], start: int = 0) -> None:
        """Replace, in place from `start`, each message whose content is a reference by one with
        the text (a new dict: the history row's own stays as it was)."""
        for i in range(start, len(messages)):
            sha = referenced_sha(messages[i].get("content"))
            if sha is not None:
                messages[i] = {**messages[i], "content": self.text(sha)}


# -- the context policy ------------------------------------------------------------------------
class ContextExceeded(Exception):
    """The prompt would exceed the task's `max_context_tokens` (typed `context_exceeded`)."""

    def __init__(self, bound: int, cap: int, policy: str) -> None:
        super().__init__(
            f"the prompt would hold up to {bound} tokens, over the task's max_context_tokens {cap} "
            f"(context_policy {policy}): raise the cap, or choose trim_tool_results"
        )
        self.bound, self.cap = bound, cap

    def error(self) -> dict[str, Any]:
        return {
            "kind": "context_exceeded",
            "message": str(self),
            "retryable": False,
            "max_context_tokens": self.cap,
        }


def _tokens_bound(m: dict[str, Any]) -> int:
    content = m.get("content")
    text = content if isinstance(content, str) else json.dumps(content, ensure_ascii=False)
    calls = json.dumps(m["tool_calls"], ensure_ascii=False) if m.get("tool_calls") else ""
    return len(text.encode()) + len(calls.encode()) + PER_MESSAGE_TOKENS


def stored_context_state(trimmed: int, known: tuple[int, int] | None) -> dict[str, Any]:
    """The policy's state as the task row keeps it (`tasks.context_state`, migration 0013), so a
    later claim resumes the same boundary and bound instead of recomputing other ones."""
    return {"trimmed": trimmed, "known": list(known) if known is not None else None}


def resumed_context_state(value: Any) -> tuple[int, tuple[int, int] | None]:
    """(trim boundary, known) from the task row's `context_state` (NULL or malformed: none)."""
    if not isinstance(value, dict):
        return 0, None
    trimmed = value.get("trimmed")
    known = value.get("known")
    ok_known = isinstance(known, list) and len(known) == 2 and all(type(v) is int for v in known)
    return (trimmed if type(trimmed) is int and trimmed >= 0 else 0), (
        (known[0], known[1]) if ok_known else None
    )


def trimmed_notice(nbytes: int) -> str:
    return f"[tool result of {nbytes} bytes trimmed by the task's context policy]"


def apply_context_policy(
    messages: Sequence[dict[str, Any]],
    *,
    cap: int | None,
    policy: str | None,
    known: tuple[int, int] | None,
    trimmed: int,
    notices: dict[int, dict[str, Any]],
) -> tuple[list[dict[str, Any]], int]:
    """The messages to send and the new trim boundary (tool results before message index
    `trimmed` are replaced by a notice). `known`: (message count, prompt tokens) of the previous
    turn, whose count bounds the old part. `notices`: the replacement messages made so far, by
    index, reused so that the prompt's messages stay the same objects from turn to turn (the
    incremental wire form relies on it). Raises `ContextExceeded`."""
    if cap is None:
        return list(messages), trimmed
    msgs = list(messages)
    if known is not None and known[0] <= len(msgs):
        bound = known[1] + sum(_tokens_bound(m) for m in msgs[known[0] :])
    else:
        bound = sum(_tokens_bound(m) for m in msgs)
    trimmed, saved = _trim(msgs, trimmed, None, notices)
    bound -= saved
    if bound > cap and policy == "trim_tool_results":
        last_turn = max((i for i, m in enumerate(msgs) if m.get("role") == "assistant"), default=len(msgs))
        need = bound - int(cap * TRIM_TO)
        new_trimmed, saved_more = _trim(msgs, trimmed, (need, last_turn), notices)
        trimmed, bound = new_trimmed, bound - saved_more
    if bound > cap:
        raise ContextExceeded(bound, cap, policy or "fail")
    return msgs, trimmed


def _trim(
    msgs: list[dict[str, Any]], start: int, goal: tuple[int, int] | None, notices: dict[int, dict[str, Any]]
) -> tuple[int, int]:
    """Replace tool results by notices: those before `start`, then (with `goal` = (tokens to
    save, first index never trimmed)) more until that many are saved. Returns the new boundary
    and the tokens saved (of the bound) beyond what trimming before `start` saved."""
    saved = 0
    i = 0
    end = start if goal is None else goal[1]
    while i < min(end, len(msgs)):
        m = msgs[i]
        if goal is not None and i >= start and saved >= goal[0]:
            break
        if i in notices:
            msgs[i] = notices[i]
        elif m.get("role") == "tool" and isinstance(m.get("content"), str):
            notices[i] = msgs[i] = {**m, "content": trimmed_notice(len(m["content"].encode()))}
            if goal is not None and i >= start:
                saved += _tokens_bound(m) - _tokens_bound(msgs[i])
        i += 1
    return max(start, i if goal is not None else start), saved
