"""`dayzero run "<goal>" [--image F]`: one task end to end on this machine.

With nothing configured this is the embedded default: SQLite, in-process dispatch, the embedded
engine on CPU. The same code runs against Postgres, Celery and a remote model when configured.
"""

from __future__ import annotations

import argparse
import json


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("run", help="run one task end to end and print its transcript")
    p.add_argument("goal", help="what the agent should do")
    p.add_argument("--image", action="append", default=[], help="image file to attach (repeatable)")
    p.add_argument("--tools", default=None, help="comma-separated allowed tools (default: all)")
    p.add_argument("--max-steps", type=int, default=None)
    p.add_argument("--timeout", type=float, default=600.0, help="seconds to wait for the task")
    p.add_argument("--json", action="store_true", help="print the task as JSON")
    p.set_defaults(func=_run)


def _run(args: argparse.Namespace) -> int:
    from rich.console import Console

    from orchestrator.app import make_runner
    from orchestrator.attachments import attach_files
    from orchestrator.config import Settings
    from orchestrator.statemachine import TERMINAL_TASK_STATUSES, TaskStatus
    from orchestrator.store import NewTask, create_task, get_task, list_messages
    from orchestrator.tracing import setup_tracing

    console = Console(stderr=True)
    settings = Settings()
    setup_tracing("dayzero-run", settings.otlp_endpoint)
    with console.status("starting (database, tools, model)"):
        parts = make_runner(settings, upgrade=True)
    try:
        with parts.engine.begin() as conn:
            att_ids = attach_files(conn, settings, "local", args.image) if args.image else []
            task_id, _ = create_task(
                conn,
                NewTask(
                    tenant="local",
                    goal=args.goal,
                    allowed_tools=args.tools.split(",") if args.tools else None,
                    max_steps=args.max_steps,
                    attachment_ids=att_ids,
                ),
                settings.budgets,
            )
        console.print(f"task {task_id}")

        def done() -> bool:
            with parts.engine.connect() as c:
                return TaskStatus(get_task(c, task_id).status) in TERMINAL_TASK_STATUSES

        with console.status("running"):
            parts.runner.run_until_idle(timeout_s=args.timeout, until=done)
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
    else:
        for m in messages:
            console.print(f"[bold]{m['role']}[/bold]: {m.get('content')!s:.2000}")
            for c in m.get("tool_calls") or []:
                console.print(f"  -> {c['function']['name']}({c['function']['arguments']})")
        print(task.result if task.status == "SUCCEEDED" else f"{task.status}: {task.error}")
    return 0 if task.status == "SUCCEEDED" else 1
