"""`dayzero submit GOAL`: submit a task through the REST API (default) or to Kafka (`--kafka`)."""

from __future__ import annotations

import argparse
import json
import os
import sys
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
    p.add_argument("--follow", action="store_true", help="REST: stream the task's events until it ends")
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
    if args.idempotency_key:
        headers["Idempotency-Key"] = args.idempotency_key
    with httpx.Client(base_url=args.url, headers=headers, timeout=30) as client:
        r = client.post("/v1/tasks", json=body)
        if r.status_code >= 400:
            print(r.text, file=sys.stderr)
            return 1
        task = r.json()
        print(json.dumps(task))
        if args.follow:
            with client.stream("GET", f"/v1/tasks/{task['id']}/events", timeout=None) as s:
                for line in s.iter_lines():
                    if line.startswith("data: "):
                        print(line[6:], flush=True)
    return 0
