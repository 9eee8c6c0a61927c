"""Celery dispatch: the public dispatcher's no-op tool jobs/s against plain Celery + Redis's.

Side by side on the same Redis, the same worker kind (prefork, concurrency 1) and the same
~200-byte result, one job in flight at a time (a runner waits for each tool attempt), in
jobs alternating between the sides (all three workers up at once):
- `plain`: a Celery app with Celery's defaults (early ack, prefetch 4, results kept 1 day),
  `send_task(...).get()`;
- `plain_dayzero_conf`: the same no-op task on an app with dayzero's delivery settings
  (`workers.celery_app.make_celery_app`: late ack, reject on worker loss, prefetch 1), to show
  what those cost apart from the dispatcher;
- `dispatcher`: `CeleryDispatcher.run_tool(ToolJob)` running the `echo` tool through
  `dayzero.run_tool` (payload parsed, arguments validated against the tool's schema, the job's
  span, its `expires`); the result is deleted once read.
Without DATABASE_URL the worker loads no attempt fence (the late-duplicate check reads the
database); that check is left out on both sides. Also counts the result keys each side leaves
in Redis. Prints JSON.

    python -m benchmarks.dispatch [--jobs 400] [--repeats 3] [--redis redis://127.0.0.1:6379/11]
    PYTHONPATH=/path/to/other/checkout:. python -P -m benchmarks.dispatch  # that checkout's code
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
NOOP_TASK = "bench.noop"
RESULT = {"ok": True, "content": {"echo": {}, "note": "x" * 180}}


def _register_noop(app: Any) -> None:
    @app.task(name=NOOP_TASK, shared=False)
    def noop() -> dict[str, Any]:
        return RESULT


def plain_app(url: str) -> Any:
    from celery import Celery

    app = Celery("plain", broker=url, backend=url)
    app.conf.update(task_serializer="json", result_serializer="json", accept_content=["json"])
    _register_noop(app)
    return app


def dayzero_app(url: str) -> Any:
    from workers.celery_app import make_celery_app

    app = make_celery_app(url, url, main="dayzero-bench")
    _register_noop(app)  # routed to the default queue `celery`
    return app


def _worker_app() -> Any:
    """The app a benchmark worker process serves (`-A benchmarks.dispatch:worker_app`)."""
    url = os.environ["DZ_BENCH_REDIS"]
    return plain_app(url) if os.environ["DZ_BENCH_APP"] == "plain" else dayzero_app(url)


worker_app = _worker_app() if os.environ.get("DZ_BENCH_APP") else None


def start_worker(kind: str, url: str, queues: str, log: Path) -> subprocess.Popen:
    env = {
        **{k: v for k, v in os.environ.items() if k != "DATABASE_URL"},
        # the caller's path first (another checkout when measuring one), then this repository
        "PYTHONPATH": os.pathsep.join(p for p in (os.environ.get("PYTHONPATH"), str(REPO)) if p),
        "DZ_BENCH_APP": kind,
        "DZ_BENCH_REDIS": url,
        "DAYZERO_TOOL_MODULES": "testing.fixture_tools",
        "DAYZERO_TOOLS": "",
        "OMP_NUM_THREADS": "1",
    }
    cmd = [
        sys.executable, "-m", "celery", "-A", "benchmarks.dispatch:worker_app", "worker",
        "--queues", queues, "--pool", "prefork", "--concurrency", "1", "--loglevel", "WARNING",
        "--hostname", f"bench-{kind}@%h", "--without-gossip", "--without-mingle", "--without-heartbeat",
    ]  # fmt: skip
    proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=log.open("wb"), stderr=subprocess.STDOUT)
    return proc


def wait_ready(app: Any, run_one: Any, proc: subprocess.Popen, timeout_s: float = 60.0) -> None:
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        if proc.poll() is not None:
            raise RuntimeError("benchmark worker exited")
        try:
            run_one(5.0)
            return
        except Exception:
            time.sleep(0.2)
    raise RuntimeError("benchmark worker did not answer")


def result_keys(url: str) -> int:
    import redis

    return sum(1 for _ in redis.Redis.from_url(url).scan_iter("celery-task-meta-*"))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--jobs", type=int, default=400)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--redis", default=os.environ.get("DAYZERO_BENCH_REDIS_URL", "redis://127.0.0.1:6379/11"))
    args = ap.parse_args()
    import redis
    from rich.progress import Progress

    from orchestrator.dispatch import CeleryDispatcher

    url = args.redis
    redis.Redis.from_url(url).flushdb()  # this benchmark's own database number only
    logs = Path(os.environ.get("TMPDIR", "/tmp")) / "dayzero-bench-dispatch"
    logs.mkdir(parents=True, exist_ok=True)

    plain = plain_app(url)
    dz = dayzero_app(url)
    dispatcher = CeleryDispatcher(url, url, app=dz)
    fields = {
        "tool": "echo", "arguments": "{}", "task_id": "bench", "step_index": 1, "attempt": 1,
        "idempotency_key": "bench:1:1", "timeout_s": 30.0,
    }  # fmt: skip
    try:
        from core.payloads import ToolJob

        job: Any = ToolJob(**fields)  # type: ignore[arg-type]
    except ImportError:  # the code before issue 16 took a dict (for before/after figures)
        job = fields

    def plain_one(timeout: float = 30.0) -> Any:
        return plain.send_task(NOOP_TASK, queue="plain").get(timeout=timeout)

    def plain_conf_one(timeout: float = 30.0) -> Any:
        return dz.send_task(NOOP_TASK, queue="celery").get(timeout=timeout)

    def dispatcher_one(timeout: float = 30.0) -> Any:
        out = dispatcher.run_tool(job)
        if not out.get("ok"):
            raise RuntimeError(out)
        return out

    sides = {
        "plain": ("plain", "plain", plain, plain_one),
        "plain_dayzero_conf": ("dayzero", "celery", dz, plain_conf_one),
        "dispatcher": ("dayzero", "tools", dz, dispatcher_one),
    }
    # All three workers run at once and the jobs alternate between the sides (one job in flight
    # at a time), so a load swing on this shared machine hits every side alike.
    procs = {
        name: start_worker(kind, url, q, logs / f"{name}.log") for name, (kind, q, _, _) in sides.items()
    }
    times: dict[str, list[float]] = {k: [] for k in sides}
    try:
        for name, (_, _, app, one) in sides.items():
            wait_ready(app, one, procs[name])
            for _ in range(20):  # warm-up: connections, the pool child, imports
                one()
        keys0 = result_keys(url)
        order = list(sides)
        with Progress(transient=True) as progress:
            bar = progress.add_task("dispatch", total=args.repeats * args.jobs)
            for i in range(args.repeats * args.jobs):
                for name in order[i % 3 :] + order[: i % 3]:  # rotate who goes first
                    t0 = time.perf_counter()
                    sides[name][3]()
                    times[name].append(time.perf_counter() - t0)
                progress.advance(bar)
        dispatcher.close()  # its pending deletes of read results are done first
        keys = result_keys(url) - keys0
    finally:
        for proc in procs.values():
            proc.terminate()
        for proc in procs.values():
            proc.wait(timeout=30)
    rates = {k: len(v) / sum(v) for k, v in times.items()}
    print(
        json.dumps(
            {
                "benchmark": "dispatch",
                "jobs_per_side": args.repeats * args.jobs,
                "cpus": os.cpu_count(),
                "load_avg_1m_at_start": os.getloadavg()[0],
                "jobs_per_s": rates,
                "job_ms_p50": {k: 1000 * statistics.median(v) for k, v in times.items()},
                "dispatcher_vs_plain": rates["dispatcher"] / rates["plain"],
                "dayzero_conf_vs_plain": rates["plain_dayzero_conf"] / rates["plain"],
                # plain Celery keeps every result a day; the dispatcher deletes its own once read
                "result_keys_left": keys,
                "result_keys_left_by_dispatcher": keys - 2 * args.repeats * args.jobs,
            },
            indent=2,
        )
    )


if __name__ == "__main__":
    main()
