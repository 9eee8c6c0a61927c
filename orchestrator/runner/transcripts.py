"""The runner's transcripts between claims: each task's messages, kept as decoded objects, so that
a claim reads only the history rows written since (one query, `seq > position`) instead of the
whole transcript, and decodes no JSON but theirs.

Why it is safe. History rows are append-only and each finished step appends at most one message
with its own step index, counted in the task row's `step_count` in the same transaction (the
model turn and the tool outcome, `runner.model_step` / `runner.tool_step`). A cached transcript
is kept only after a drive that ended without error (every message in memory was committed) and
is used only when the rows read since its position fit it exactly: their step indices follow the
cached ones, and the message count equals `step_count` plus the goal's messages. Anything else
(another runner wrote meanwhile and our position is stale, a restored database, a task this
runner never saw) reads the whole transcript again: the cache can make a claim cheaper, never
different. The message objects are the very ones the model step sends, so the inference client
sees its previous request's messages again by identity (`orchestrator.inference_wire`).
"""

from __future__ import annotations

import datetime as dt
import threading
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import pairwise
from typing import Any

from orchestrator.tasks.queries import message_dict


@dataclass(slots=True)
class CachedTranscript:
    created_at: dt.datetime | None  # the task row's: a different row under the id is another task
    position: int  # the task's `event_seq` when cached: rows up to it are in `messages`
    goal_messages: int  # how many of `messages` are the goal (rows of `messages`, no step)
    messages: list[dict[str, Any]]
    steps: list[int | None]  # the step index of each message (None: the goal's)
    # the model step's messages with the attachments resolved (`attachments.resolve_images`): a
    # prefix of `messages`, whose objects the next claim sends again (None: no attachments)
    resolved: list[dict[str, Any]] | None = None


@dataclass(frozen=True, slots=True)
class HistoryRow:
    """What `tasks.history.open_steps` reads of a transcript row."""

    role: str
    step_index: int | None
    tool_calls: Any


class TranscriptCache:
    """Task id -> its transcript as this runner last left it; an LRU of `max_tasks` tasks (its
    positions travel with every claim: `known()`)."""

    def __init__(self, max_tasks: int = 256) -> None:
        self.max_tasks = max_tasks
        self._items: OrderedDict[str, CachedTranscript] = OrderedDict()
        self._lock = threading.Lock()
        self.stats = {"hit": 0, "miss": 0, "mismatch": 0}
        # task id -> (its transcript list, the resolved messages) between `extend` and the view
        self._resolved: OrderedDict[str, tuple[list[dict[str, Any]], list[dict[str, Any]]]] = OrderedDict()

    def known(self) -> dict[str, int]:
        """Task id -> position, for the claim's read of new rows."""
        with self._lock:
            return {k: v.position for k, v in self._items.items()}

    def get(self, task_id: str) -> CachedTranscript | None:
        with self._lock:
            return self._items.get(task_id)

    def put(self, task_id: str, entry: CachedTranscript) -> None:
        with self._lock:
            self._items.pop(task_id, None)
            self._items[task_id] = entry
            while len(self._items) > self.max_tasks:
                self._items.popitem(last=False)

    def drop(self, task_id: str) -> None:
        with self._lock:
            self._items.pop(task_id, None)

    def extend(self, task: Any, rows: Sequence[Any]) -> CachedTranscript | None:
        """The task's whole transcript: its cached messages followed by `rows` (the history rows
        past its position), or None when they do not fit (read everything again). The cached
        lists are extended in place: their message objects stay the same."""
        entry = self.get(task.id)
        if entry is None:
            self.stats["miss"] += 1
            return None
        last = next((s for s in reversed(entry.steps) if s is not None), -1)
        fits = (
            entry.created_at == getattr(task, "created_at", None)
            and task.event_seq >= entry.position
            and all(r.step_index is not None for r in rows)
            and all(a.step_index < b.step_index for a, b in pairwise(rows))
            and (not rows or rows[0].step_index > last)
            and len(entry.messages) + len(rows) == entry.goal_messages + task.step_count
        )
        self.drop(task.id)  # the runner now owns the lists; it caches them again when it leaves
        if not fits:
            self.stats["mismatch"] += 1
            return None
        self.stats["hit"] += 1
        if entry.resolved is not None:
            with self._lock:
                self._resolved[task.id] = (entry.messages, entry.resolved)
                while len(self._resolved) > self.max_tasks:
                    self._resolved.popitem(last=False)
        entry.messages.extend(message_dict(r) for r in rows)
        entry.steps.extend(r.step_index for r in rows)
        return entry

    def take_resolved(self, task_id: str, messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """The resolved messages kept with the transcript `messages` (that very list, extended
        by `extend`), for the model step to extend; [] when there are none or the transcript was
        read anew."""
        with self._lock:
            kept = self._resolved.pop(task_id, None)
        return kept[1] if kept is not None and kept[0] is messages else []


def history_rows(messages: Sequence[dict[str, Any]], steps: Sequence[int | None]) -> list[HistoryRow]:
    """The model turns of a transcript as rows for `tasks.history.open_steps`."""
    return [
        HistoryRow("assistant", s, m.get("tool_calls"))
        for m, s in zip(messages, steps, strict=True)
        if s is not None and m.get("role") == "assistant"
    ]
