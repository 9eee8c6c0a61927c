"""Held-out evaluation of the demo model: the embedded engine, greedy, real tools, per category.

Each task runs as an agent would: the model's turn through `EmbeddedEngineClient.chat`, every tool
call it makes checked (the Kimi parser's errors, then the tool's JSON schema) and executed by the
real tool, its result appended as the runner appends it, until the model answers without a call.
Follow-up tasks then add their second user turn to the model's own transcript.

A task succeeds when every turn's final answer holds the expected values (numbers matched as whole
numbers), or, for turns without values (greetings, refusals), equals the expected reply.
"""

from __future__ import annotations

import re
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from training.demo_model.corpus import CATEGORIES, Task, ToolBox, Turn, eval_tasks

__all__ = ["EXPECTED_TOOL", "TaskOutcome", "answer_ok", "evaluate", "run_task", "summarise"]

MAX_MODEL_TURNS = 6


@dataclass
class TaskOutcome:
    category: str
    success: bool
    calls: int = 0
    valid_calls: int = 0
    model_turns: int = 0
    tools_used: list[str] = field(default_factory=list)
    answers: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    seconds: float = 0.0


def answer_ok(answer: str | None, turn: Turn) -> bool:
    if answer is None:
        return False
    if not turn.needles:
        return answer.strip() == turn.expected
    for n in turn.needles:
        pat = re.escape(n)
        if n[:1].isdigit() or n[:1] == "-":
            pat = r"(?<![\d.])" + pat + r"(?!\.?\d)"  # a whole number: not part of a longer one
        if not re.search(pat, answer):
            return False
    return True


def run_task(client: Any, box: ToolBox, task: Task, *, max_tokens: int = 160) -> TaskOutcome:
    """Run one task end to end through `client.chat` (an `EmbeddedEngineClient`)."""
    from tools.base import ToolError

    t0 = time.perf_counter()
    out = TaskOutcome(task.category, success=True)
    messages: list[dict[str, Any]] = []
    for turn in task.turns:
        messages.append({"role": "user", "content": turn.user})
        answer = None
        for _ in range(MAX_MODEL_TURNS):
            resp = client.chat(
                {"messages": messages, "tools": box.tools, "temperature": 0, "max_tokens": max_tokens}
            )
            out.model_turns += 1
            msg = resp["choices"][0]["message"]
            errors = (resp.get("dayzero") or {}).get("tool_call_errors") or []
            calls = msg.get("tool_calls") or []
            out.calls += len(calls) + len(errors)
            out.problems += [f"parse: {e}" for e in errors]
            messages.append({k: v for k, v in msg.items() if k in ("role", "content", "tool_calls")})
            if errors:
                break
            if not calls:
                answer = msg.get("content")
                break
            for c in calls:
                name, raw = c["function"]["name"], c["function"]["arguments"]
                out.tools_used.append(name)
                try:
                    box.registry.parse_arguments(name, raw)
                    out.valid_calls += 1
                except ToolError as exc:
                    out.problems.append(f"schema: {exc}")
                messages.append(
                    {"role": "tool", "tool_call_id": c["id"], "content": box.run(name, raw, task.attachments)}
                )
        out.answers.append(answer or "")
        if not answer_ok(answer, turn):
            out.success = False
            out.problems.append(f"answer {answer!r}, expected {turn.expected!r}")
            break
    out.seconds = time.perf_counter() - t0
    return out


# the tool each category's tasks need (None: answer without one)
EXPECTED_TOOL = {
    "calc": "calculator",
    "calc_multi": "calculator",
    "calc_word": "calculator",
    "followup": "calculator",
    "search": "search_documents",
    "image_info": "image_info",
    "plain": None,
}


def _right_tool(o: TaskOutcome) -> bool:
    """Whether the model called only the category's tool (and at least once), or none for `plain`."""
    want = EXPECTED_TOOL[o.category]
    if want is None:
        return not o.tools_used
    return bool(o.tools_used) and set(o.tools_used) == {want}


def summarise(outcomes: Sequence[TaskOutcome]) -> dict[str, Any]:
    """Per category and overall: tasks, success rate, tool calls, valid-call rate, share of tasks
    that used the right tool (`EXPECTED_TOOL`), seconds per task."""

    def agg(xs: Sequence[TaskOutcome]) -> dict[str, Any]:
        calls = sum(x.calls for x in xs)
        return {
            "tasks": len(xs),
            "success": round(sum(x.success for x in xs) / len(xs), 4) if xs else None,
            "tool_calls": calls,
            "valid_tool_calls": round(sum(x.valid_calls for x in xs) / calls, 4) if calls else None,
            "right_tool": round(sum(_right_tool(x) for x in xs) / len(xs), 4) if xs else None,
            "s_per_task": round(sum(x.seconds for x in xs) / len(xs), 3) if xs else None,
        }

    per = {c: agg([x for x in outcomes if x.category == c]) for c in CATEGORIES}
    return {"overall": agg(outcomes), "per_category": {c: v for c, v in per.items() if v["tasks"]}}


def _client(model_dir: str, device: str, dtype: str) -> Any:
    """The embedded client on the CPU in fp32 (what `dayzero run` uses), or the same engine
    configuration on another device / in another dtype (an accuracy check of that path)."""
    from inference.embedded import EMBEDDED_ENGINE_CONFIG, EmbeddedEngineClient

    if device == "cpu" and dtype == "float32":
        return EmbeddedEngineClient.from_model_dir(model_dir)
    from inference.engine.factory import build_engine

    engine = build_engine(
        model_dir=model_dir, engine_config=EMBEDDED_ENGINE_CONFIG, device=device, dtype=dtype
    )
    return EmbeddedEngineClient(engine, model_name=Path(model_dir).name)


def _worker(args: tuple[str, int, int, int, str, str]) -> list[dict[str, Any]]:
    model_dir, per_category, rank, world, device, dtype = args
    import torch

    torch.set_num_threads(1)
    client = _client(model_dir, device, dtype)
    box = ToolBox()
    try:
        tasks = eval_tasks(box, per_category)[rank::world]
        return [asdict(run_task(client, box, t)) for t in tasks]
    finally:
        client.close()


def evaluate(
    model_dir: str | Path, per_category: int, workers: int = 1, *, device: str = "cpu", dtype: str = "float32"
) -> tuple[dict[str, Any], list[TaskOutcome]]:
    """Evaluate `per_category` held-out tasks of every category; returns (summary, outcomes).
    Outcomes are in task order (`eval_tasks`), whatever the number of workers."""
    jobs = [(str(model_dir), per_category, r, workers, device, dtype) for r in range(workers)]
    if workers <= 1:
        rows = _worker(jobs[0])
    else:
        import multiprocessing as mp

        with mp.get_context("spawn").Pool(workers) as pool:
            parts = pool.map(_worker, jobs)
        rows = [None] * sum(len(p) for p in parts)
        for r, part in enumerate(parts):  # worker r ran tasks r, r + workers, ...
            rows[r::workers] = part
    outcomes = [TaskOutcome(**r) for r in rows]
    return summarise(outcomes), outcomes
