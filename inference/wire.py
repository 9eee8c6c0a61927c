"""The incremental form of chat requests, as client and server both speak it (stdlib only: the
orchestrator imports it without the serving stack).

A keyed request (`prompt_cache_key`) may carry `dayzero_extends: {messages: N, digest: D}` and
then only the messages after the N the server keeps under the key; D is `chain_digest` of those
N. A server without that exact base answers 409 with the error code `conversation_unknown`."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from typing import Any

EXTENDS_FIELD = "dayzero_extends"
CONVERSATION_UNKNOWN = "conversation_unknown"
EMPTY_DIGEST = ""


def chain_digest(prev: str, messages: Sequence[Any]) -> str:
    """The digest of a message list, extended message by message: `chain_digest(chain_digest("",
    a), b) == chain_digest("", a + b)`, so either side pays only for messages it has not hashed.
    Each message enters as canonical JSON (sorted keys, no spaces), which a JSON round trip keeps."""
    d = prev
    for m in messages:
        blob = json.dumps(m, sort_keys=True, ensure_ascii=False, separators=(",", ":"))
        d = hashlib.sha256(f"{d}\n{blob}".encode()).hexdigest()
    return d
