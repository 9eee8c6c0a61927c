"""`dayzero run "<goal>" [--image F]`: one task end to end on this machine.

With nothing configured this is the embedded default: SQLite, in-process dispatch, the embedded
engine on CPU. The same code runs against Postgres, Celery and a remote model when configured.
"""

from __future__ import annotations

import argparse
import json
import threading
import time
from collections.abc import Sequence
from typing import Any


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("run", help="run one task end to end and print its transcript")
    p.add_argument("goal", help="what the agent should do")
    p.add_argument("--image", action="append", default=[], help="image file to attach (repeatable)")
    p.add_argument("--tools", default=None, help="comma-separated allowed tools (default: all)")
    p.add_argument(
        "--max-steps",
        type=int,
        default=None,
        help="most steps the task may take (default: DAYZERO_BUDGET_MAX_STEPS)",
    )
    p.add_argument(
        "--timeout", type=float, default=600.0, help="seconds to wait for the task (default: %(default)s)"
    )
    p.add_argument("--json", action="store_true", help="print the task as JSON")
    p.set_defaults(func=_run)


def submit_local(
    db: Any,
    settings: Any,
    goal: str,
    files: Sequence[str] = (),
    *,
    tools: Sequence[str] | None = None,
    max_steps: int | None = None,
) -> str:
    """Create the local tenant's task for `goal` with `files` attached (the command's `--image`),
    as `dayzero run` does; returns the task id. `benchmarks/demo_eval.py` submits through here."""
    from orchestrator.attachments import attach_files
    from orchestrator.tasks.create import NewTask, create_task

    with db.begin() as conn:
        att_ids = attach_files(conn, settings, "local", files) if files else []
        task_id, _ = create_task(
            conn,
            NewTask(
                tenant="local", goal=goal, allowed_tools=tools, max_steps=max_steps, attachment_ids=att_ids
            ),
            settings.budgets,
        )
    return task_id


def _run(args: argparse.Namespace) -> int:
    from orchestrator.app import make_runner
    from orchestrator.commands.transcript import console as transcript_console
    from orchestrator.commands.transcript import outcome
    from orchestrator.config import Settings
    from orchestrator.statemachine import TERMINAL_TASK_STATUSES, TaskStatus
    from orchestrator.tasks.queries import get_task, list_messages
    from orchestrator.tracing import setup_tracing

    console = transcript_console()
    settings = Settings()
    setup_tracing("dayzero-run", settings.otlp_endpoint)
    with console.status("starting (database, tools, model)"):
        parts = make_runner(settings, upgrade=True)
    try:
        task_id = submit_local(
            parts.engine,
            settings,
            args.goal,
            args.image,
            tools=args.tools.split(",") if args.tools else None,
            max_steps=args.max_steps,
        )
        console.print(f"task {task_id}")

        def done() -> bool:
            with parts.engine.connect() as c:
                return TaskStatus(get_task(c, task_id).status) in TERMINAL_TASK_STATUSES

        if args.json:
            with console.status("running"):
                parts.runner.run_until_idle(timeout_s=args.timeout, until=done)
        else:
            _run_live(console, parts, task_id, args.timeout, done)
        with parts.engine.connect() as conn:
            task = get_task(conn, task_id)
            messages = list_messages(conn, task_id)
    finally:
        parts.close()
    line, code = outcome(task.status, task.result, task.error)
    if args.json:
        print(
            json.dumps(
                {
                    "id": task.id,
                    "status": task.status,
                    "result": task.result,
                    "error": task.error,
                    "messages": messages,
                },
                default=str,
                indent=2,
            )
        )
    else:
        print(line)
    return code


def _run_live(console: Any, parts: Any, task_id: str, timeout_s: float, done: Any) -> None:
    """Drive the task on a worker thread and show each transcript message as it is committed."""
    from orchestrator.commands.transcript import Transcript
    from orchestrator.tasks.queries import list_messages

    failure: list[BaseException] = []

    def drive() -> None:
        try:
            parts.runner.run_until_idle(timeout_s=timeout_s, until=done)
        except BaseException as exc:  # shown (and re-raised) on the main thread
            failure.append(exc)

    worker = threading.Thread(target=drive, name="dayzero-run", daemon=True)
    worker.start()
    transcript = Transcript(console)
    status = console.status("model turn 1 …")
    status.start()
    try:
        while True:
            alive = worker.is_alive()
            with parts.engine.connect() as conn:
                messages = list_messages(conn, task_id)
            if len(messages) > transcript.shown:
                status.update(transcript.show_new(messages))
            if not alive:
                break
            time.sleep(0.05)
    finally:
        status.stop()
    worker.join()
    if failure:
        raise failure[0]
