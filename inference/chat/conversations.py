"""The conversations a server has rendered, by the client's key (OpenAI's `prompt_cache_key`): the
rendered text and token ids of a conversation so far (no generation prompt), so that the next
turn, which re-sends the transcript with new messages appended, tokenizes only what they add.

Correctness rests on two conditions checked per turn: the new render must start with the
remembered text (the template rendered the old messages the same way), and every piece tokenized
on its own must be cut next to a special token (tokenizers split text at special tokens first, so
pieces cut there tokenize as the whole does). Where either fails the turn takes the full path and says so
(`PromptRenderer.stats`). The store is an LRU bounded in tokens. A conversation's ids are a list that
the next turn extends in place (`grown_ids`): no per-turn copy of the whole conversation but the
prompt handed to the engine.

A conversation also keeps its messages and their chained digest (`chain_digest`), so that a client
may send only new messages: "extend your conversation of N messages whose digest is D with these"
(the `dayzero_extends` field of a chat request). The digest is the client's proof that both sides
hold the same base; a server that lacks that exact base answers 409 `conversation_unknown` and the
client sends the whole transcript again.
"""

from __future__ import annotations

import hashlib
import json
import threading
import uuid
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from inference.wire import EMPTY_DIGEST, chain_digest


@dataclass(slots=True)
class Conversation:
    context: str  # digest of the tools and template kwargs it was rendered with
    num_messages: int
    text: str  # the render of its messages without a generation prompt
    ids: list[int]  # that text's token ids: the first `n_ids` of the list (a later turn may extend it)
    ends: list[int]  # message-end positions (prefix-cache checkpoints)
    messages: list[Any] = field(default_factory=list)  # the messages rendered, as received
    digest: str | None = None  # `chain_digest` of `messages` (None: not computed yet)
    n_ids: int = -1
    # the engine's name for the request rendered with this record (`PrefixLink.name`): that
    # request's prompt starts with `ids[:n_ids]`, and so does every turn that extends this record
    lineage: str = field(default_factory=lambda: uuid.uuid4().hex)

    def __post_init__(self) -> None:
        if self.n_ids < 0:
            self.n_ids = len(self.ids)


def context_digest(tools: Sequence[Mapping[str, Any]] | None, kwargs: Mapping[str, Any] | None) -> str:
    blob = json.dumps([tools or None, kwargs or None], sort_keys=True, ensure_ascii=False, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()


class ConversationUnknown(LookupError):
    """The server lacks the exact base a request extends (evicted, restarted, another replica, or
    a different history): the client must send the whole transcript."""


class ConversationCache:
    def __init__(self, max_tokens: int = 1 << 23) -> None:
        self.max_tokens = max_tokens
        self._items: OrderedDict[str, Conversation] = OrderedDict()
        self._tokens = 0
        self._lock = threading.Lock()

    def get(self, key: str) -> Conversation | None:
        with self._lock:
            conv = self._items.get(key)
            if conv is not None:
                self._items.move_to_end(key)
            return conv

    def put(self, key: str, conv: Conversation) -> None:
        if conv.n_ids > self.max_tokens:
            return
        with self._lock:
            old = self._items.pop(key, None)
            if old is not None:
                self._tokens -= old.n_ids
            self._items[key] = conv
            self._tokens += conv.n_ids
            while self._tokens > self.max_tokens:
                _, evicted = self._items.popitem(last=False)
                self._tokens -= evicted.n_ids

    def drop(self, key: str) -> None:
        with self._lock:
            old = self._items.pop(key, None)
            if old is not None:
                self._tokens -= old.n_ids

    def resolve(self, key: str, num_messages: int, digest: str) -> Conversation:
        """The conversation a request extends: kept under `key`, of exactly `num_messages`
        messages whose chained digest is `digest`; else `ConversationUnknown`."""
        conv = self.get(key)
        if conv is None or conv.num_messages != num_messages or not conv.messages:
            raise ConversationUnknown(key)
        if conv.digest is None:  # first extension of a conversation sent in full: hashed once
            conv.digest = chain_digest(EMPTY_DIGEST, conv.messages)
        if conv.digest != digest:
            raise ConversationUnknown(key)
        return conv

    def grown_ids(self, conv: Conversation, new: list[int]) -> list[int]:
        """`conv`'s ids followed by `new`: its own list extended in place when no other turn has
        extended it (the usual case: O(new)), else a copy."""
        with self._lock:
            if len(conv.ids) == conv.n_ids:
                conv.ids.extend(new)
                return conv.ids
        return [*conv.ids[: conv.n_ids], *new]
