"""`dayzero run "<goal>" [--image F]`: one task end to end on this machine.

With nothing configured this is the embedded default: SQLite, in-process dispatch, the embedded
engine on CPU. The same code runs against Postgres, Celery and a remote model when configured.

The task is checked by the REST body's schema (`TaskCreate`) and the tools the runner has;
errors are one line on stderr. Exit codes: 0 the task SUCCEEDED, 1 it ended otherwise (FAILED,
CANCELLED, TIMED_OUT), 2 invalid input (goal, tools, budget, image files), 3 `--timeout` passed
(the task is cancelled).
"""

from __future__ import annotations

import argparse
import json
import threading
import time
from collections.abc import Sequence
from typing import Any


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "run",
        help="run one task end to end and print its transcript",
        epilog="exit codes: 0 succeeded, 1 the task ended otherwise, 2 invalid input, 3 --timeout passed",
    )
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
        "--timeout",
        type=float,
        default=600.0,
        help="seconds to wait for the task; then it is cancelled, exit 3 (default: %(default)s)",
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


EXIT_INVALID, EXIT_TIMEOUT = 2, 3
_CANCEL_GRACE_S = 5.0  # after --timeout, how long the cancelled task is given to end


class _InvalidRun(Exception):
    """What is wrong with the command line, in one line."""


def _check(args: argparse.Namespace) -> None:
    """The checks REST makes (`TaskCreate`), plus the image files: raises `_InvalidRun`."""
    from pathlib import Path

    from pydantic import ValidationError

    from orchestrator.tasks.schemas import TaskCreate

    body: dict[str, Any] = {"goal": args.goal}
    if args.tools:
        body["allowed_tools"] = args.tools.split(",")
    if args.max_steps is not None:
        body["budget"] = {"max_steps": args.max_steps}
    try:
        TaskCreate.model_validate(body)
    except ValidationError as exc:
        e = exc.errors(include_input=False)[0]
        raise _InvalidRun(f"{'.'.join(map(str, e['loc']))}: {e['msg']}") from None
    for image in args.image:
        if not Path(image).is_file():
            raise _InvalidRun(f"no such image file: {image}")
    if args.timeout <= 0:
        raise _InvalidRun("--timeout must be positive")


def _run(args: argparse.Namespace) -> int:
    import sys

    try:
        _check(args)
        return _run_checked(args)
    except _InvalidRun as exc:
        print(f"dayzero run: {exc}", file=sys.stderr)
        return EXIT_INVALID


def _run_checked(args: argparse.Namespace) -> int:
    from orchestrator.app import make_runner
    from orchestrator.commands.transcript import console as transcript_console
    from orchestrator.commands.transcript import outcome
    from orchestrator.config import Settings
    from orchestrator.statemachine import TERMINAL_TASK_STATUSES, TaskStatus
    from orchestrator.tasks.control import request_cancel
    from orchestrator.tasks.queries import get_task, list_messages
    from orchestrator.tasks.schemas import unknown_tools_problem
    from orchestrator.tracing import setup_tracing

    console = transcript_console()
    settings = Settings()
    setup_tracing("dayzero-run", settings.otlp_endpoint)
    started = time.monotonic()
    with console.status("starting (database, tools, model)"):
        parts = make_runner(settings, upgrade=True)
    timed_out = False
    try:
        allowed = args.tools.split(",") if args.tools else None
        # the check REST and Kafka run, against the tools this runner holds
        if problem := unknown_tools_problem(allowed, parts.tools.names()):
            raise _InvalidRun(problem)
        task_id = submit_local(
            parts.engine, settings, args.goal, args.image, tools=allowed, max_steps=args.max_steps
        )
        console.print(f"task {task_id}")

        def done() -> bool:
            with parts.engine.connect() as c:
                return TaskStatus(get_task(c, task_id).status) in TERMINAL_TASK_STATUSES

        deadline = started + args.timeout

        def cancel() -> None:  # --timeout: the runner interrupts the step in flight
            with parts.engine.begin() as c:
                request_cancel(c, task_id)

        if args.json:
            with console.status("running"):
                timed_out = _drive(parts, deadline, done, cancel)
        else:
            timed_out = _run_live(console, parts, task_id, deadline, done, cancel)
        with parts.engine.connect() as conn:
            task = get_task(conn, task_id)
            messages = list_messages(conn, task_id)
    finally:
        parts.close()
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
    elif timed_out:
        print(f"dayzero run: timed out after {args.timeout:g} s; task {task.id} is {task.status}")
    line, code = outcome(task.status, task.result, task.error)
    if not args.json and not timed_out:
        print(line)
    return EXIT_TIMEOUT if timed_out else code


def _drive(parts: Any, deadline: float, done: Any, cancel: Any, on_turn: Any = None) -> bool:
    """Run the task on a worker thread until it ends; at `deadline` cancel it (the runner then
    interrupts the step in flight) and wait for the end. Returns whether the deadline passed."""
    failure: list[BaseException] = []
    ended = threading.Event()

    def work() -> None:
        try:
            parts.runner.run_until_idle(timeout_s=1e9, until=lambda: ended.is_set() or done())
        except BaseException as exc:  # shown (and re-raised) on the main thread
            failure.append(exc)

    worker = threading.Thread(target=work, name="dayzero-run", daemon=True)
    worker.start()
    timed_out = False
    while worker.is_alive():
        if on_turn is not None:
            on_turn()
        now = time.monotonic()
        if not timed_out and now >= deadline:
            timed_out = True
            cancel()
        if timed_out and now >= deadline + _CANCEL_GRACE_S:
            ended.set()  # a step that cannot be interrupted (the embedded engine): stop waiting
            break
        worker.join(0.05)
    if on_turn is not None:
        on_turn()
    if failure:
        raise failure[0]
    return timed_out


def _run_live(console: Any, parts: Any, task_id: str, deadline: float, done: Any, cancel: Any) -> bool:
    """`_drive`, showing each transcript message as it is committed (`commands.transcript`)."""
    from orchestrator.commands.transcript import Transcript
    from orchestrator.tasks.queries import list_messages

    transcript = Transcript(console)
    status = console.status("model turn 1 …")

    def show() -> None:
        with parts.engine.connect() as conn:
            messages = list_messages(conn, task_id)
        if len(messages) > transcript.shown:
            status.update(transcript.show_new(messages))

    status.start()
    try:
        return _drive(parts, deadline, done, cancel, on_turn=show)
    finally:
        status.stop()
