"""A task's steps, derived from its history rows and its task row (no row per step: migration 0011).

What the database holds about steps:
- each finished step: the history row (`events`) of the event that finished it (`step_index`,
  `step_status`, its last attempt), which also carries the message the step appended;
- the open steps: `open_step .. next_step - 1` on the task row, the first at `open_status` /
  `open_attempt` (`open_status` FAILED: they were abandoned when the task ended), the others
  PENDING. Steps run strictly in order, and only a model turn creates several steps at once;
- a tool step's name, call id and arguments: its model turn's tool call (the turn's message is
  on the model step's history row: tool step `m + 1 + i` runs the turn's call `i`);
- when a step was created: model step 0 when its first attempt started, a model step after a
  tool step when that one finished, a tool step when its model turn finished.
Pure functions over rows (anything with the columns' attributes): the readers in
`tasks.queries` and the runner's recovery (`runner.loop`) share them.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from orchestrator.statemachine import StepStatus

# The error of a step still open when its task ended (`runner.boundary.abandon_open_steps`).
ABANDONED = {"kind": "abandoned", "message": "the task ended before this step finished"}


@dataclass(frozen=True, slots=True)
class StepRow:
    """One step as the `steps` table showed it before migration 0011 (same attribute names)."""

    task_id: str
    step_index: int
    kind: str  # "model" | "tool"
    status: str
    tool_name: str | None
    tool_call_id: str | None
    arguments: str | None
    attempt_count: int
    next_attempt_at: dt.datetime | None
    started_at: dt.datetime | None
    runner_id: str | None
    resumed: int
    error: dict[str, Any] | None
    usage: dict[str, Any] | None
    created_at: dt.datetime | None
    finished_at: dt.datetime | None


def tool_calls_by_step(history: Iterable[Any]) -> dict[int, tuple[Any, Mapping[str, Any]]]:
    """Tool step index -> (its model turn's history row, its tool call)."""
    calls: dict[int, tuple[Any, Mapping[str, Any]]] = {}
    for h in history:
        if h.role == "assistant" and h.step_index is not None:
            for i, call in enumerate(h.tool_calls or ()):
                calls[h.step_index + 1 + i] = (h, call)
    return calls


def _call_fields(call: Mapping[str, Any] | None) -> tuple[str | None, str | None, str | None]:
    if call is None:
        return None, None, None
    fn = call.get("function") or {}
    return fn.get("name"), call.get("id"), fn.get("arguments")


def open_steps(task: Any, history: Iterable[Any]) -> list[StepRow]:
    """The task's open steps (what the runner needs to resume it): `history` needs only its rows
    with a message (the model turns')."""
    if task.open_step is None or task.open_status == StepStatus.FAILED:
        return []
    calls = tool_calls_by_step(history)
    return [_open_row(task, s, calls.get(s), None) for s in range(task.open_step, task.next_step)]


def derive_steps(task: Any, history: Iterable[Any], first_starts: Mapping[int, dt.datetime]) -> list[StepRow]:
    """Every step of the task, in order. `history`: its history rows that finish a step or carry
    a model turn, in `seq` order; `first_starts`: step index -> the start of its failed or lost
    attempt 1 (`step_attempts`), for the creation time of a model step that began with one."""
    rows = list(history)
    calls = tool_calls_by_step(rows)
    done = {h.step_index: h for h in rows if h.step_status is not None}
    out: list[StepRow] = []
    for s in range(task.next_step):
        call = calls.get(s)
        if call is not None:
            created = call[0].created_at  # its model turn finished
        elif s > 0 and s - 1 in done:
            created = done[s - 1].created_at  # the tool step before it finished
        else:
            created = _first_start(task, s, done.get(s), first_starts)
        h = done.get(s)
        if h is not None:
            name, call_id, args = _call_fields(call[1] if call else None)
            out.append(
                StepRow(
                    task_id=task.id,
                    step_index=s,
                    kind="tool" if call else "model",
                    status=h.step_status,
                    tool_name=name,
                    tool_call_id=call_id,
                    arguments=args,
                    attempt_count=h.attempt or 0,
                    next_attempt_at=None,
                    started_at=h.started_at,
                    runner_id=h.runner_id,
                    resumed=h.resumed or 0,
                    error=h.error,
                    usage=h.usage,
                    created_at=created,
                    finished_at=h.created_at,
                )
            )
        elif task.open_step is not None and s >= task.open_step:
            out.append(_open_row(task, s, call, created))
    return out


def _first_start(task: Any, s: int, h: Any, first_starts: Mapping[int, dt.datetime]) -> dt.datetime | None:
    if s in first_starts:
        return first_starts[s]
    if h is not None and h.attempt == 1:
        return h.started_at
    if s == task.open_step and task.open_attempt == 1:
        return task.open_started_at
    return None


def open_step_state(task: Any, s: int) -> tuple[str, int]:
    """(status, attempt count) of open step `s` (`open_step <= s < next_step`): the first at
    `open_status` / `open_attempt`, the others PENDING, all FAILED once abandoned with the task."""
    first = s == task.open_step
    if task.open_status == StepStatus.FAILED:
        status = StepStatus.FAILED.value
    else:
        status = task.open_status if first else StepStatus.PENDING.value
    return str(status), task.open_attempt if first else 0


def _open_row(
    task: Any, s: int, call: tuple[Any, Mapping[str, Any]] | None, created: dt.datetime | None
) -> StepRow:
    first = s == task.open_step
    abandoned = task.open_status == StepStatus.FAILED
    status, attempts = open_step_state(task, s)
    name, call_id, args = _call_fields(call[1] if call else None)
    return StepRow(
        task_id=task.id,
        step_index=s,
        kind="tool" if call else "model",
        status=status,
        tool_name=name,
        tool_call_id=call_id,
        arguments=args,
        attempt_count=attempts,
        next_attempt_at=task.open_next_attempt_at if first else None,
        started_at=task.open_started_at if first else None,
        runner_id=task.open_runner_id if first else None,
        resumed=0,
        error=dict(ABANDONED) if abandoned else None,
        usage=None,
        created_at=created,
        finished_at=(task.finished_at or task.updated_at) if abandoned else None,
    )
