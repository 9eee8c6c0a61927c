"""Demo model eval through the full stack: REST API + runner + Celery workers (tools and
preprocessing) + `dayzero infer serve` serving the bundled model, each its own process, on a
scratch PostgreSQL database (and Redis on 127.0.0.1:6379). Prints JSON.

The tasks are `benchmarks/demo_eval.py`'s (held-out paraphrase families, same seeds). Each task's
files are uploaded with `POST /v1/attachments` (images and PDFs, as a client sends them), the task
is submitted with `POST /v1/tasks` (its question as the goal, the uploads as its attachments, the
default sampling: greedy), preprocessed by the workers, run by `dayzero runner` against the
inference server (processed images by reference, the shared blob store), and judged on its status,
result and transcript with the same check as the embedded eval (`training.demo_model.evaluate.judge`).

    python -m benchmarks.demo_eval_stack [--per-category 3] [--categories image,document] [--out F]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict
from pathlib import Path
from typing import Any

import httpx

REPO = Path(__file__).resolve().parents[1]

MODEL = "dayzero-demo"
DEMO_INDEX = REPO / "inference" / "demo_model" / "weights" / "model.safetensors.index.json"
TERMINAL = ("SUCCEEDED", "FAILED", "CANCELLED", "TIMED_OUT")


class Stack:
    """The processes of one run; logs under `log_dir`; stopped (process group) on exit."""

    def __init__(self, log_dir: Path, env: dict[str, str]) -> None:
        self.log_dir, self.env = log_dir, env
        self.procs: dict[str, subprocess.Popen] = {}

    def start(self, name: str, *args: str, **env: str) -> None:
        log = (self.log_dir / f"{name}.log").open("wb")
        self.procs[name] = subprocess.Popen(
            [sys.executable, "-m", "orchestrator.cli", *args],
            cwd=REPO, env={**self.env, **env}, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip

    def log(self, name: str) -> str:
        return (self.log_dir / f"{name}.log").read_text(errors="replace")

    def wait_http(self, name: str, url: str, timeout_s: float = 240) -> None:
        end = time.monotonic() + timeout_s
        while time.monotonic() < end:
            if self.procs[name].poll() is not None:
                raise SystemExit(f"{name} exited:\n{self.log(name)[-3000:]}")
            try:
                if httpx.get(url, timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.3)
        raise SystemExit(f"{name} not up at {url}:\n{self.log(name)[-3000:]}")

    def stop(self) -> None:
        for proc in reversed(list(self.procs.values())):
            if proc.poll() is None:
                proc.terminate()
        for proc in self.procs.values():
            try:
                proc.wait(20)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, 9)
                proc.wait(10)


@contextmanager
def stack(db_url: str, work: Path, redis_db: int) -> Iterator[tuple[str, Stack]]:
    """Start the four services; yields (API base URL, Stack)."""
    from inference.demo_model.spec import DEMO_DIR
    from testing.kafka_broker import free_port

    broker = f"redis://127.0.0.1:6379/{redis_db}"  # a database of its own: no other test's workers
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "DAYZERO_", "CELERY_", "KAFKA_"))},
        "PYTHONPATH": str(REPO), "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1",
        "DATABASE_URL": db_url, "CELERY_BROKER_URL": broker, "CELERY_RESULT_BACKEND": broker,
        "DAYZERO_BLOB_DIR": str(work / "blobs"), "DAYZERO_WORKSPACE_DIR": str(work / "ws"),
        "DAYZERO_POLL_INTERVAL_S": "0.05",
    }  # fmt: skip
    ports = {n: free_port() for n in ("inference", "api", "worker", "runner")}
    s = Stack(work, env)
    try:
        infer = f"http://127.0.0.1:{ports['inference']}"
        s.start("inference", "infer", "serve", "--model", str(DEMO_DIR), "--port", str(ports["inference"]),
                "--device", "cpu", "--served-model-name", MODEL, "--max-model-len", "4096",
                "--num-blocks", "512", "--block-size", "16", "--max-num-seqs", "4")  # fmt: skip
        s.start("api", "serve", "--port", str(ports["api"]), "--log-level", "warning")
        s.start("worker", "worker", "--queues", "tools,preprocess", "--pool", "solo", "--metrics-port", str(ports["worker"]),
                "--hostname", f"demo-eval-{uuid.uuid4().hex[:8]}@%h")  # fmt: skip
        s.wait_http("inference", infer + "/health")
        s.start("runner", "runner", "--metrics-port", str(ports["runner"]),
                DAYZERO_INFERENCE_URL=infer, DAYZERO_INFERENCE_MODEL=MODEL,
                DAYZERO_INFERENCE_IMAGES_BY_REFERENCE="1")  # fmt: skip
        api = f"http://127.0.0.1:{ports['api']}"
        s.wait_http("api", api + "/readyz")
        s.wait_http("worker", f"http://127.0.0.1:{ports['worker']}/metrics")
        s.wait_http("runner", f"http://127.0.0.1:{ports['runner']}/metrics")
        yield api, s
    finally:
        s.stop()


def run_task(client: httpx.Client, body: dict[str, Any], timeout_s: float) -> dict[str, Any]:
    """Submit one task and poll it to a terminal status; returns the task's JSON."""
    r = client.post("/v1/tasks", json=body)
    r.raise_for_status()
    task_id = r.json()["id"]
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        t = client.get(f"/v1/tasks/{task_id}").json()
        if t["status"] in TERMINAL:
            return t
        time.sleep(0.2)
    return {"id": task_id, "status": "NOT_FINISHED", "result": None, "steps": []}


def evaluate(api: str, key: str, db_url: str, tasks: list[Any], timeout_s: float) -> list[Any]:
    """Upload each task's files, submit it, wait for it, judge it; returns `TaskOutcome`s."""
    from orchestrator.db.engine import make_engine
    from orchestrator.store import list_messages
    from training.demo_model.evaluate import judge
    from workers.tool_jobs import build_registry

    engine = make_engine(db_url)
    registry = build_registry()
    outcomes = []
    with httpx.Client(base_url=api, headers={"Authorization": f"Bearer {key}"}, timeout=30) as client:
        for task in tasks:
            t0 = time.perf_counter()
            turn = task.turns[-1]
            uploads = []
            for f in turn.files:
                r = client.post(
                    "/v1/attachments", params={"filename": f.name}, content=f.data,
                    headers={"Content-Type": f.media_type},
                )  # fmt: skip
                r.raise_for_status()
                uploads.append({"upload_id": r.json()["id"]})
            body: dict[str, Any] = {"goal": turn.user}
            if uploads:
                body["attachments"] = uploads
            out = run_task(client, body, timeout_s)
            with engine.connect() as conn:
                messages = list_messages(conn, out["id"])
            o = judge(task, out["status"], out.get("result"), messages, registry)
            o.seconds = round(time.perf_counter() - t0, 2)
            outcomes.append(o)
            print(json.dumps({"category": o.category, "success": o.success, "problems": o.problems}),
                  file=sys.stderr, flush=True)  # fmt: skip
    engine.dispose()
    return outcomes


def main(argv: list[str] | None = None) -> int:
    from benchmarks.ingest_kafka import scratch_database
    from orchestrator.auth import create_api_key
    from orchestrator.db import migrate
    from orchestrator.db.engine import make_engine
    from training.demo_model.corpus import CATEGORIES, ToolBox, eval_tasks
    from training.demo_model.evaluate import summarise

    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--per-category", type=int, default=3)
    p.add_argument("--categories", default=",".join(CATEGORIES))
    p.add_argument("--task-timeout", type=float, default=120.0)
    p.add_argument("--redis-db", type=int, default=13)
    p.add_argument("--out", type=Path, default=None)
    args = p.parse_args(argv)
    cats = tuple(c for c in args.categories.split(",") if c)
    tasks = eval_tasks(ToolBox(), args.per_category, cats)
    work = Path(f"/tmp/dz-demo-stack-{uuid.uuid4().hex[:6]}")
    work.mkdir(parents=True)
    t0 = time.perf_counter()
    with scratch_database() as db_url:
        engine = make_engine(db_url)
        migrate.upgrade(engine)
        with engine.begin() as conn:
            key = create_api_key(conn, "demo-eval").key
        engine.dispose()
        with stack(db_url, work, args.redis_db) as (api, _):
            outcomes = evaluate(api, key, db_url, tasks, args.task_timeout)
    summary = {"benchmark": "demo_eval_stack", **summarise(outcomes)}
    summary["wall_s"] = round(time.perf_counter() - t0, 1)
    summary["machine"] = {"cpus": os.cpu_count(), "device": "cpu"}
    summary["logs"] = str(work)
    index = DEMO_INDEX.read_bytes()
    summary["checkpoint"] = hashlib.sha256(index).hexdigest()
    print(json.dumps(summary, indent=2))
    if args.out:
        rows = [asdict(o) for o in outcomes]
        args.out.write_text(json.dumps({"summary": summary, "outcomes": rows}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
