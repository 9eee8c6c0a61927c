"""`dayzero submit GOAL`: submit a task through the REST API (default) or to Kafka (`--kafka`).

Over REST, `--attach FILE` uploads files first and `--follow` shows the task as `dayzero run`
does (`commands.transcript`), reading its event stream and its transcript from the API."""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from typing import Any


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("submit", help="submit a task via REST or Kafka")
    p.add_argument("goal", nargs="?", help="the task goal (or give --body)")
    p.add_argument("--body", default=None, help="JSON task body (a file path, or - for stdin)")
    p.add_argument("--tools", default=None, help="comma-separated allowed tools")
    p.add_argument(
        "--max-steps",
        type=int,
        default=None,
        help="most steps the task may take (default: the server's budget)",
    )
    p.add_argument("--metadata", action="append", default=[], help="key=value (repeatable)")
    p.add_argument(
        "--idempotency-key",
        default=None,
        help="resubmitting with the same key returns the same task (default: none)",
    )
    p.add_argument("--kafka", action="store_true", help="produce to dayzero.tasks instead of calling REST")
    p.add_argument("--tenant", default=None, help="tenant (required with --kafka)")
    p.add_argument(
        "--url",
        default=os.environ.get("DAYZERO_API_URL", "http://127.0.0.1:8000"),
        help="the API's base URL (or DAYZERO_API_URL; default: %(default)s)",
    )
    p.add_argument("--api-key", default=os.environ.get("DAYZERO_API_KEY"), help="default: $DAYZERO_API_KEY")
    p.add_argument(
        "--follow",
        action="store_true",
        help="REST: show the task's transcript until it ends, print its answer and exit 0 only if it succeeded",
    )
    p.add_argument(
        "--attach",
        action="append",
        default=[],
        metavar="FILE",
        help="REST: upload an image (PNG, JPEG, WebP, GIF) or PDF and attach it to the task (repeatable)",
    )
    p.set_defaults(func=_submit)


def _body(args: argparse.Namespace) -> dict[str, Any]:
    if args.body:
        text = sys.stdin.read() if args.body == "-" else open(args.body).read()  # noqa: SIM115
        body = json.loads(text)
    else:
        body = {}
    if args.goal:
        body["goal"] = args.goal
    if "goal" not in body:
        raise SystemExit("a goal is required (argument or in --body)")
    if args.tools:
        body["allowed_tools"] = args.tools.split(",")
    if args.max_steps:
        body.setdefault("budget", {})["max_steps"] = args.max_steps
    for item in args.metadata:
        k, sep, v = item.partition("=")
        if not sep:
            raise SystemExit(f"--metadata {item!r} is not key=value")
        body.setdefault("metadata", {})[k] = v
    return body


def _submit(args: argparse.Namespace) -> int:
    if args.kafka and args.attach:
        raise SystemExit("--attach uploads through the REST API; it cannot be used with --kafka")
    body = _body(args)
    return _via_kafka(args, body) if args.kafka else _via_rest(args, body)


def _via_kafka(args: argparse.Namespace, body: dict[str, Any]) -> int:
    from kafka import KafkaProducer

    from orchestrator.config import Settings
    from orchestrator.kafka.producer import send_task

    if not args.tenant:
        raise SystemExit("--tenant is required with --kafka")
    settings = Settings()
    bootstrap = settings.kafka_bootstrap_servers
    if not bootstrap:
        raise SystemExit("KAFKA_BOOTSTRAP_SERVERS is not set")
    producer = KafkaProducer(bootstrap_servers=bootstrap, acks="all")
    try:
        fut = send_task(
            producer,
            args.tenant,
            body,
            idempotency_key=args.idempotency_key,
            topic=settings.kafka.tasks_topic,
        )
        meta = fut.get(timeout=30)
    finally:
        producer.close()
    print(json.dumps({"topic": meta.topic, "partition": meta.partition, "offset": meta.offset}))
    return 0


def _via_rest(args: argparse.Namespace, body: dict[str, Any]) -> int:
    import httpx

    if not args.api_key:
        raise SystemExit("an API key is required: --api-key or $DAYZERO_API_KEY")
    headers = {"Authorization": f"Bearer {args.api_key}"}
    with httpx.Client(base_url=args.url, headers=headers, timeout=30) as client:
        if args.attach:
            body.setdefault("attachments", []).extend(_upload(client, path) for path in args.attach)
        extra = {"Idempotency-Key": args.idempotency_key} if args.idempotency_key else {}
        r = client.post("/v1/tasks", json=body, headers=extra)
        if r.status_code >= 400:
            print(r.text, file=sys.stderr)
            return 1
        task = r.json()
        if not args.follow:
            print(json.dumps(task))
            return 0
        try:
            return _follow(client, task["id"])
        except httpx.HTTPStatusError as exc:
            raise SystemExit(f"following task {task['id']}: HTTP {exc.response.status_code}") from None


def _upload(client: Any, path: str) -> dict[str, str]:
    """Upload one `--attach` file (`POST /v1/attachments`); returns its reference for the body."""
    import mimetypes
    from pathlib import Path

    from orchestrator.tasks.schemas import ATTACHMENT_MEDIA_TYPES

    file = Path(path)
    media_type = mimetypes.guess_type(file.name)[0]
    if media_type not in ATTACHMENT_MEDIA_TYPES:
        raise SystemExit(f"--attach {path}: {media_type or 'unknown type'}; attachments are images (PNG, "
                         "JPEG, WebP, GIF) or PDFs, named by their extension")  # fmt: skip
    try:
        data = file.read_bytes()
    except OSError as exc:
        raise SystemExit(f"--attach {path}: {exc.strerror}") from None
    r = client.post(
        "/v1/attachments",
        content=data,
        params={"filename": file.name},
        headers={"Content-Type": media_type},
    )
    if r.status_code >= 400:
        raise SystemExit(f"--attach {path}: HTTP {r.status_code}: {r.text}")
    return {"upload_id": r.json()["id"]}


def _follow(client: Any, task_id: str) -> int:
    """Show the task's transcript as `dayzero run` does, while its event stream runs; print the
    answer and return the task's exit code. A dropped stream is resumed from the last event."""
    import httpx

    from orchestrator.commands.transcript import Transcript, outcome
    from orchestrator.commands.transcript import console as transcript_console
    from orchestrator.events import TERMINAL_EVENT_TYPES

    console = transcript_console()
    console.print(f"task {task_id}")
    transcript = Transcript(console)
    last_id, ended = "", False
    status = console.status("waiting for a runner …")
    status.start()
    try:
        while not ended:
            transcript_changed = True
            try:
                resume = {"Last-Event-ID": last_id} if last_id else {}
                with client.stream("GET", f"/v1/tasks/{task_id}/events", headers=resume, timeout=None) as s:
                    s.raise_for_status()
                    for line in s.iter_lines():
                        if transcript_changed:  # before the first event, then after each step
                            status.update(transcript.show_new(_get(client, f"/v1/tasks/{task_id}/messages")))
                        field, _, value = line.partition(": ")
                        last_id = value if field == "id" else last_id
                        transcript_changed = field == "event" and value.startswith(("step.", "task."))
                        ended = ended or (field == "event" and value in TERMINAL_EVENT_TYPES)
            except httpx.TransportError as exc:  # the API restarted or the connection dropped
                status.update(f"reconnecting ({type(exc).__name__}) …")
                time.sleep(1.0)
                continue
            # The stream ends after the task's final event; anything else ends it early: resume.
            ended = ended or _get(client, f"/v1/tasks/{task_id}")["finished_at"] is not None
    finally:
        status.stop()
    transcript.show_new(_get(client, f"/v1/tasks/{task_id}/messages"))
    task = _get(client, f"/v1/tasks/{task_id}")
    line, code = outcome(task["status"], task["result"], task["error"])
    print(line)
    return code


def _get(client: Any, path: str) -> Any:
    r = client.get(path)
    r.raise_for_status()
    return r.json()
