"""Held-out evaluation of the demo model through the product: each task is run as `dayzero run`
runs it (the same submission code, runner, tools and embedded engine, greedy), its files attached
as `--image` attaches them, and judged on what the task ends with.

A task succeeds when it ends SUCCEEDED, its answer holds the expected values (numbers matched as
whole numbers) or, for a turn without values (greetings, refusals), equals the expected reply,
and the model called the expected tool (or none). Also counted: tool calls that parsed and matched
their tool's schema (`valid`), and answers holding a special token.

Tasks come from the corpus's held-out paraphrase families only (`corpus.eval_tasks`).
"""

from __future__ import annotations

import re
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from training.demo_model.corpus import CATEGORIES, Task, ToolBox, Turn, eval_tasks

__all__ = ["TaskOutcome", "answer_ok", "evaluate", "judge", "summarise"]


@dataclass
class TaskOutcome:
    category: str
    family: str
    success: bool
    status: str = ""
    calls: int = 0
    valid_calls: int = 0
    special_tokens: bool = False
    tools_used: list[str] = field(default_factory=list)
    answer: str = ""
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


def _special_tokens() -> tuple[str, ...]:
    from inference.tokenizer import KIMI_SPECIAL_TOKENS

    return tuple(KIMI_SPECIAL_TOKENS)


def judge(
    task: Task, status: str, result: str | None, messages: Sequence[Mapping[str, Any]], registry: Any
) -> TaskOutcome:
    """The verdict on one finished task from its status, result and transcript."""
    from tools.base import ToolError

    turn = task.turns[-1]
    out = TaskOutcome(task.category, task.family, success=False, status=status, answer=result or "")
    specials = _special_tokens()
    for m in messages:
        if m.get("role") != "assistant":
            continue
        content = m.get("content") if isinstance(m.get("content"), str) else ""
        if any(t in content for t in specials):  # a call (or reply) the parser could not read
            out.calls += "<|tool_call" in content
            out.problems.append(f"special tokens in a reply: {content[:120]!r}")
        for c in m.get("tool_calls") or []:
            fn = c.get("function") or {}
            out.calls += 1
            out.tools_used.append(fn.get("name", "?"))
            try:
                registry.parse_arguments(fn.get("name", ""), fn.get("arguments", ""))
                out.valid_calls += 1
            except ToolError as exc:
                out.problems.append(f"invalid call: {exc}")
    out.special_tokens = any(t in (result or "") for t in specials)
    right_tool = set(out.tools_used) == ({turn.tool} if turn.tool else set())
    if status != "SUCCEEDED":
        out.problems.append(f"task ended {status}")
    if not right_tool:
        out.problems.append(f"tools {out.tools_used}, expected {turn.tool}")
    if not answer_ok(result, turn):
        out.problems.append(f"answer {result!r}, expected {turn.expected!r}")
    out.success = status == "SUCCEEDED" and right_tool and answer_ok(result, turn) and not out.special_tokens
    return out


def summarise(outcomes: Sequence[TaskOutcome]) -> dict[str, Any]:
    """Per category and overall: tasks, success rate, tool calls, valid-call rate, answers with
    special tokens, seconds per task."""

    def agg(xs: Sequence[TaskOutcome]) -> dict[str, Any]:
        calls = sum(x.calls for x in xs)
        return {
            "tasks": len(xs),
            "success": round(sum(x.success for x in xs) / len(xs), 4) if xs else None,
            "tool_calls": calls,
            "valid_tool_calls": round(sum(x.valid_calls for x in xs) / calls, 4) if calls else None,
            "special_token_answers": sum(x.special_tokens for x in xs),
            "s_per_task": round(sum(x.seconds for x in xs) / len(xs), 3) if xs else None,
        }

    per = {c: agg([x for x in outcomes if x.category == c]) for c in CATEGORIES}
    return {"overall": agg(outcomes), "per_category": {c: v for c, v in per.items() if v["tasks"]}}


def _run_cli(model_dir: str, tasks: Sequence[Task], workdir: Path, timeout_s: float) -> list[TaskOutcome]:
    """Every task through `dayzero run`'s code path: one local runner (SQLite, in-process tools, the
    embedded engine on `model_dir`), each task submitted by `submit_local` with its files."""
    from inference.embedded import EmbeddedEngineClient
    from orchestrator.app import make_runner
    from orchestrator.commands.run import submit_local
    from orchestrator.config import Settings
    from orchestrator.embedded_client import EmbeddedChatClient
    from orchestrator.statemachine import TERMINAL_TASK_STATUSES, TaskStatus
    from orchestrator.tasks.queries import get_task, list_messages

    settings = Settings(
        DATABASE_URL=f"sqlite:///{workdir / 'eval.db'}",
        DAYZERO_BLOB_DIR=str(workdir / "blobs"),
        DAYZERO_WORKSPACE_DIR=str(workdir / "workspaces"),
    )
    engine_client = EmbeddedEngineClient.from_model_dir(model_dir, blob_url=settings.blob_dir)
    parts = make_runner(settings, inference=EmbeddedChatClient(engine_client, "dayzero-demo"), upgrade=True)
    outcomes = []
    try:
        for n, task in enumerate(tasks):
            t0 = time.perf_counter()
            turn = task.turns[-1]
            folder = workdir / "files" / str(n)
            folder.mkdir(parents=True)
            paths = []
            for f in turn.files:
                (folder / f.name).write_bytes(f.data)
                paths.append(str(folder / f.name))
            task_id = submit_local(parts.engine, settings, turn.user, paths)

            def done(task_id: str = task_id) -> bool:
                with parts.engine.connect() as c:
                    return TaskStatus(get_task(c, task_id).status) in TERMINAL_TASK_STATUSES

            parts.runner.run_until_idle(timeout_s=timeout_s, until=done)
            with parts.engine.connect() as conn:
                row = get_task(conn, task_id)
                messages = list_messages(conn, task_id)
            o = judge(task, row.status, row.result, messages, parts.tools)
            o.seconds = round(time.perf_counter() - t0, 3)
            outcomes.append(o)
    finally:
        parts.close()
    return outcomes


def _worker(args: tuple[str, int, tuple[str, ...], int, int, float]) -> list[dict[str, Any]]:
    model_dir, per_category, categories, rank, world, timeout_s = args
    import torch

    torch.set_num_threads(1)
    tasks = eval_tasks(ToolBox(), per_category, categories)[rank::world]
    with tempfile.TemporaryDirectory(prefix="dayzero-eval-") as tmp:
        return [asdict(o) for o in _run_cli(model_dir, tasks, Path(tmp), timeout_s)]


def evaluate(
    model_dir: str | Path,
    per_category: int,
    workers: int = 1,
    *,
    categories: tuple[str, ...] = CATEGORIES,
    timeout_s: float = 120.0,
) -> tuple[dict[str, Any], list[TaskOutcome]]:
    """Run `per_category` held-out tasks of each category through `dayzero run`'s path; returns
    (summary, outcomes in task order, whatever the number of workers)."""
    jobs = [(str(model_dir), per_category, categories, r, workers, timeout_s) for r in range(workers)]
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
