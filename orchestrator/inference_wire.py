"""The incremental wire form of chat requests: send the server only the messages it does not have.

A server that keeps conversations (ours: `inference.chat.conversations`) acknowledges each keyed
request with the number of messages it now keeps under the key (`dayzero.conversation`). The
client remembers what it sent under that key (the message objects and their chained digests);
when the next transcript starts with those very objects, the request carries only the new
messages and `dayzero_extends: {messages: N, digest: D}`. The server answers 409
`conversation_unknown` when it lacks that exact base (evicted, restarted, another replica) and
the client sends the whole transcript once (`OpenAIChatClient`): always correct. A server that
never acknowledges (vLLM, SGLang, OpenAI) only ever gets plain, full requests.

"The very objects": the runner keeps each task's transcript between turns (`runner.transcripts`)
and appends to it, so the check that the history did not change is an identity test per message
and the digest is computed once per message, never again for the whole transcript.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from inference.wire import CONVERSATION_UNKNOWN, EMPTY_DIGEST, chain_digest

# Why a keyed request went in full (`dayzero_inference_incremental_total{outcome}`).
NO_BASE = "no_base"  # nothing acknowledged under the key yet (first turn, new process)
HISTORY_CHANGED = "history_changed"  # the transcript does not start with what was sent
UNKNOWN_TO_SERVER = CONVERSATION_UNKNOWN  # the server answered 409: sent again in full


@dataclass(slots=True)
class _Sent:
    messages: list[Any]  # what the server keeps under the key: the objects we sent
    digests: list[str] = field(default_factory=list)  # chained digest after each message


@dataclass(frozen=True, slots=True)
class WirePlan:
    """What one request sends: `messages` (all, or only the new ones with `extends`)."""

    messages: list[Any]
    extends: dict[str, Any] | None
    reason: str | None  # why it is full (None: incremental, or no key)


class ConversationMemo:
    """Per `prompt_cache_key`: what the server acknowledged keeping. Bounded LRU over keys."""

    def __init__(self, max_keys: int = 1024) -> None:
        self.max_keys = max_keys
        self._sent: OrderedDict[str, _Sent] = OrderedDict()
        self._lock = threading.Lock()

    def plan(self, key: str | None, messages: Sequence[Mapping[str, Any]]) -> WirePlan:
        msgs = list(messages)
        if key is None:
            return WirePlan(msgs, None, None)
        with self._lock:
            sent = self._sent.get(key)
        if sent is None:
            return WirePlan(msgs, None, NO_BASE)
        n = len(sent.messages)
        if n >= len(msgs) or not all(a is b for a, b in zip(sent.messages, msgs, strict=False)):
            return WirePlan(msgs, None, HISTORY_CHANGED)
        return WirePlan(msgs[n:], {"messages": n, "digest": sent.digests[-1]}, None)

    def kept(self, key: str, messages: Sequence[Mapping[str, Any]], num_kept: int) -> None:
        """The server now keeps the first `num_kept` of `messages` (all of them, in practice)
        under `key`: remember them, hashing only messages not hashed before."""
        msgs = list(messages[:num_kept])
        with self._lock:
            old = self._sent.pop(key, None)
        digests: list[str] = []
        if old is not None:
            same = 0
            for a, b in zip(old.messages, msgs, strict=False):
                if a is not b:
                    break
                same += 1
            digests = old.digests[:same]
        prev = digests[-1] if digests else EMPTY_DIGEST
        for m in msgs[len(digests) :]:
            prev = chain_digest(prev, [m])
            digests.append(prev)
        with self._lock:
            self._sent[key] = _Sent(msgs, digests)
            while len(self._sent) > self.max_keys:
                self._sent.popitem(last=False)

    def forget(self, key: str) -> None:
        with self._lock:
            self._sent.pop(key, None)
