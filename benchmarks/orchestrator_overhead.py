"""Orchestrator overhead per step on PostgreSQL with default durability.

A 20-cycle task (model step, tool step, repeated; then the final answer: 41 steps) with an
instant in-process model and an instant tool (~200-byte result), so what is measured is the
orchestrator: claim, transactions, outbox, transcript. Prints JSON.

Accounting: a step is one executed attempt (41 per 20-cycle task). A step's latency is from
the end of the previous step's commit to the end of its own; the first step of a task also
carries the task's start (claim, load, the commit that starts it), so p99 includes it. WAL is
counted for this benchmark's database only: the records (pg_walinspect) of the transactions
that touched its relations, commit records included; other databases' writes are left out;
`wal_by_task_length` also splits it by table and index.
Steps per task are read from the database, so a task that stops early (a budget) is divided
by the steps it ran.

    python -m benchmarks.orchestrator_overhead [--tasks 40] [--runners 4] [--tool echo_inline]
    PYTHONPATH=/path/to/other/checkout:. python -P -m benchmarks.orchestrator_overhead  # that code

(`-P` keeps the working directory off the path, so the other checkout's packages are measured.)
Results are data under `docs/results/`; the design they informed is in `docs/architecture.md`.
The database's CPU is read from /proc (a local server only).
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import statistics
import time
import uuid
from typing import Any

from rich.progress import Progress
from sqlalchemy import text

from benchmarks import pg_wal
from orchestrator.config import Budgets
from orchestrator.db import migrate
from orchestrator.db.engine import make_engine
from orchestrator.dispatch import InProcessDispatcher
from orchestrator.inference_client import AssistantTurn, Sampling, parse_chat_completion
from orchestrator.runner import Runner, RunnerConfig
from testing.scripted_model import reply

try:
    from orchestrator.tasks.create import NewTask, create_tasks
except ImportError:  # the code before issue 16, for before/after figures with this accounting
    from orchestrator.store import NewTask, create_task

    def create_tasks(conn: Any, specs: Any, budgets: Any) -> list[Any]:
        return [create_task(conn, s, budgets) for s in specs]


from tools.config import ToolsConfig
from workers.tool_jobs import build_registry

ADMIN_URL = os.environ.get("DAYZERO_BENCH_PG_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/postgres")
CYCLES = 20
# The instant tool: `echo` goes through the dispatcher's pool thread; `--tool echo_inline` is the
# same tool declared `inline` (run on the runner's thread: `ToolSpec.inline`).
TOOL = ["echo"]


def script(cycles: int = CYCLES) -> str:
    return "script:" + json.dumps({"cycles": cycles, "tool": TOOL[0]})


class InstantModel:
    """The scripted agent, called in-process: no network, no model time."""

    def chat(self, messages: Any, tools: Any, sampling: Sampling) -> AssistantTurn:
        return parse_chat_completion(reply(list(messages)), 0.0)

    def close(self) -> None:
        pass


def make_runner(url: str, runner_id: str) -> Runner:
    registry = build_registry(ToolsConfig(skip_unavailable=True, modules=("testing.fixture_tools",)))
    return Runner(
        make_engine(url),
        InstantModel(),
        InProcessDispatcher(registry),
        registry,
        RunnerConfig(runner_id=runner_id, lease_s=30, poll_interval_s=0.01),
    )


BUDGETS = Budgets(max_steps=1000)  # the 40-cycle tasks (81 steps) must not hit a step budget


def submit(url: str, n: int, cycles: int = CYCLES) -> list[str]:
    engine = make_engine(url)
    with engine.begin() as conn:
        specs = [NewTask(tenant="bench", goal=script(cycles), max_steps=1000) for _ in range(n)]
        ids = [out[0] for out in create_tasks(conn, specs, BUDGETS)]  # type: ignore[index]
    engine.dispose()
    return ids


def steps_run(url: str, ids: list[str]) -> tuple[int, int]:
    """(steps the tasks ran, tasks that succeeded), from the database."""
    engine = make_engine(url)
    with engine.connect() as conn:
        steps, ok = conn.execute(
            text(
                "SELECT sum(step_count), count(*) FILTER (WHERE status = 'SUCCEEDED') FROM tasks "
                "WHERE id = ANY(:ids)"
            ),
            {"ids": ids},
        ).one()
    engine.dispose()
    return int(steps or 0), int(ok or 0)


def wal_record_bytes(url: str, start_lsn: int, end_lsn: int) -> tuple[int, int]:
    """(record bytes without full-page images, full-page-image bytes): `pg_wal.record_bytes`."""
    return pg_wal.record_bytes(url, start_lsn, end_lsn)


def wal_by_length(url: str, lengths: tuple[int, ...] = (5, 10, 20, 40), n_tasks: int = 10) -> dict[str, Any]:
    """WAL record bytes per task for tasks of different lengths: appended, never rewritten, so
    the bytes per step stay flat as tasks grow."""
    runner = make_runner(url, "bench-wal")
    out = {}
    for cycles in lengths:
        ids = submit(url, n_tasks, cycles)
        lsn0, _ = wal_and_sizes(url)
        while runner.run_once():
            pass
        lsn1, _ = wal_and_sizes(url)
        rec, fpi = wal_record_bytes(url, lsn0, lsn1)
        ran, ok = steps_run(url, ids)
        steps = ran / n_tasks  # as run, not as planned
        by_rel = pg_wal.record_bytes_by_relation(url, lsn0, lsn1)
        out[f"cycles_{cycles}"] = {
            "steps": steps,
            "tasks_succeeded": ok,
            "wal_record_bytes_per_task": rec / n_tasks,
            "wal_record_bytes_per_step": rec / n_tasks / steps,
            "full_page_image_bytes_per_task": fpi / n_tasks,
            "wal_record_bytes_per_task_by_relation": {k: round(v / n_tasks) for k, v in by_rel.items()},
        }
    return out


def wal_and_sizes(url: str) -> tuple[int, int]:
    return pg_wal.lsn_and_table_bytes(url)


def commit_floor_ms(url: str, n: int = 200) -> dict[str, float]:
    """p50s of what every durable step waits for on this box, whatever the orchestrator does:
    `insert_commit`: a one-row INSERT, then COMMIT (two round trips, one WAL flush);
    `autocommit_insert`: the same INSERT as its own transaction (one round trip, one WAL flush:
    the shape of a step's write now); `fdatasync_8k`: the disk alone, one 8 KB write + fdatasync
    of a file in the temporary directory (pg_test_fsync's test; the same disk here)."""
    import tempfile

    engine = make_engine(url)
    times: dict[str, list[float]] = {"insert_commit": [], "autocommit_insert": [], "fdatasync_8k": []}
    with engine.connect() as conn:
        conn.exec_driver_sql("CREATE TABLE IF NOT EXISTS bench_floor (x int)")
        conn.commit()
        for i in range(n):
            t0 = time.perf_counter()
            conn.exec_driver_sql("INSERT INTO bench_floor VALUES (%(i)s)", {"i": i})
            conn.commit()
            times["insert_commit"].append(time.perf_counter() - t0)
        dbapi = conn.connection.driver_connection
        dbapi.autocommit = True
        for i in range(n):
            t0 = time.perf_counter()
            dbapi.execute("INSERT INTO bench_floor VALUES (%s)", (i,), prepare=True)
            times["autocommit_insert"].append(time.perf_counter() - t0)
        dbapi.autocommit = False
        conn.exec_driver_sql("DROP TABLE bench_floor")
        conn.commit()
    engine.dispose()
    block = os.urandom(8192)
    with tempfile.NamedTemporaryFile() as f:
        for _ in range(n):
            t0 = time.perf_counter()
            os.pwrite(f.fileno(), block, 0)
            os.fdatasync(f.fileno())
            times["fdatasync_8k"].append(time.perf_counter() - t0)
    return {f"{k}_ms_p50": 1000 * statistics.median(v) for k, v in times.items()}


def single_runner(url: str, n_tasks: int) -> dict[str, Any]:
    """Per-step latency, one runner, tasks one after another: from the end of the previous
    step's commit (or the start of `run_once`, for a task's first step: claim, load and the
    start commit included) to the end of this step's execute+commit."""
    submit(url, 2)  # warm-up tasks: connection pool, statement caches
    runner = make_runner(url, "bench-1")
    runner.run_until_idle(timeout_s=120)
    ids = submit(url, n_tasks)
    durations: list[float] = []
    firsts: list[float] = []  # the durations of the tasks' first steps (their start included)
    starts: list[float] = []  # claim + load + first commit, per task
    lasts: list[float] = []  # the tasks' last steps
    execute, run_once = runner._execute, runner.run_once
    mark = [0.0, True]  # (end of the last timed thing, the next step is a task's first)
    model_cpu = [0.0, 0]  # the scripted model's own CPU (not the orchestrator's), calls
    chat = runner.inference.chat

    def timed_chat(*args: Any) -> Any:
        c0 = time.thread_time()
        try:
            return chat(*args)
        finally:
            model_cpu[0] += time.thread_time() - c0
            model_cpu[1] += 1

    def timed(task: Any, step: Any) -> None:
        first = mark[1]
        if first:
            starts.append(time.perf_counter() - mark[0])
            mark[1] = False
        execute(task, step)
        t = time.perf_counter()
        durations.append(t - mark[0])
        if first:
            firsts.append(t - mark[0])
        mark[0] = t

    def timed_run_once() -> bool:
        mark[0], mark[1] = time.perf_counter(), True
        before = len(durations)
        worked = run_once()
        if len(durations) > before:
            lasts.append(durations[-1])  # the step that ended the task
        return worked

    runner._execute = timed  # type: ignore[method-assign]
    runner.inference.chat = timed_chat  # type: ignore[method-assign]
    wal0, size0 = wal_and_sizes(url)
    db0 = pg_wal.server_cpu_seconds(url)
    t0, cpu0 = time.perf_counter(), time.process_time()
    with Progress(transient=True) as progress:
        bar = progress.add_task("1 runner", total=n_tasks)
        while timed_run_once():
            progress.update(bar, completed=len(starts))
    wall, cpu = time.perf_counter() - t0, time.process_time() - cpu0
    db1 = pg_wal.server_cpu_seconds(url)
    wal1, size1 = wal_and_sizes(url)
    rec, fpi = wal_record_bytes(url, wal0, wal1)
    steps, ok = steps_run(url, ids)
    assert steps == len(durations), (steps, len(durations))  # every executed step was timed once
    later = sorted(set(durations) - set(firsts))  # (perf_counter differences do not repeat)
    durations.sort()
    return {
        "tasks": len(ids),
        "tasks_succeeded": ok,
        "steps": steps,
        "steps_per_s": steps / wall,
        "step_ms_p50": 1000 * statistics.median(durations),
        "step_ms_p99": 1000 * durations[int(0.99 * (len(durations) - 1))],
        "task_start_ms_p50": 1000 * statistics.median(starts),
        # A task's first step is 1 in 41, more than 1%: it is what p99 measures.
        "first_step_ms_p50": 1000 * statistics.median(firsts),
        "later_steps_ms_p99": 1000 * later[int(0.99 * (len(later) - 1))],
        # the step that ends a task (its terminal transition)
        "last_step_ms_p50": 1000 * statistics.median(lasts),
        "scripted_model_cpu_ms_per_call": 1000 * model_cpu[0] / max(1, model_cpu[1]),
        # CPU per step: this process's (runner, tool thread, heartbeat: less swayed by a busy
        # shared disk than the latencies), the database's (all its processes; None when it runs
        # elsewhere), their sum, and the 2-core ceiling that sum implies
        **pg_wal.cpu_per_step(cpu, pg_wal.cpu_between(db0, db1), steps),
        "wal_bytes_per_task_server_wide": (wal1 - wal0) / n_tasks,
        "wal_record_bytes_per_task": rec / n_tasks,  # without full-page images (checkpoint timing)
        "full_page_image_bytes_per_task": fpi / n_tasks,
        "table_bytes_per_task": (size1 - size0) / n_tasks,
    }


def _worker(
    url: str, runner_id: str, ready: Any, start: Any, counts: Any, ends: Any, cpus: Any, idx: int
) -> None:
    runner = make_runner(url, runner_id)
    n = 0
    execute = runner._execute

    def counted(task: Any, step: Any) -> None:
        nonlocal n
        execute(task, step)
        n += 1

    runner._execute = counted  # type: ignore[method-assign]
    ready.release()
    start.wait()
    cpu0 = time.process_time()
    while runner.run_once():
        pass
    ends[idx] = time.perf_counter()  # before interpreter teardown, which is not runner work
    cpus[idx] = time.process_time() - cpu0
    counts[idx] = n


def many_runners(url: str, n_runners: int, n_tasks: int) -> dict[str, Any]:
    ids = submit(url, n_tasks)
    ctx = mp.get_context("spawn")
    ready, start = ctx.Semaphore(0), ctx.Event()
    counts, ends, cpus = ctx.Array("i", n_runners), ctx.Array("d", n_runners), ctx.Array("d", n_runners)
    procs = [
        ctx.Process(target=_worker, args=(url, f"bench-{i}", ready, start, counts, ends, cpus, i))
        for i in range(n_runners)
    ]
    for p in procs:
        p.start()
    for _ in procs:  # every process imported, connected and built its runner
        ready.acquire()
    db0 = pg_wal.server_cpu_seconds(url)
    t0 = time.perf_counter()
    start.set()
    for p in procs:
        p.join()
    db1 = pg_wal.server_cpu_seconds(url)  # the runners' backends have exited: reaped, counted
    wall = max(ends) - t0
    steps = sum(counts)  # every step is one `_execute`
    assert steps == steps_run(url, ids)[0]
    return {
        "runners": n_runners,
        "tasks": len(ids),
        "steps": steps,
        "steps_per_s": steps / wall,
        "wall_s": wall,
        **pg_wal.cpu_per_step(sum(cpus), pg_wal.cpu_between(db0, db1), steps),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--tasks", type=int, default=40)
    ap.add_argument("--runners", type=int, default=4)
    ap.add_argument("--tool", default="echo", choices=("echo", "echo_inline"))
    args = ap.parse_args()
    TOOL[0] = args.tool
    load_at_start = os.getloadavg()  # a shared box: the figures mean little without it
    name = f"dz_bench_{uuid.uuid4().hex[:8]}"
    admin = make_engine(ADMIN_URL, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.exec_driver_sql(f'CREATE DATABASE "{name}"')
        sync = conn.exec_driver_sql("SHOW synchronous_commit").scalar_one()
    url = ADMIN_URL.rsplit("/", 1)[0] + "/" + name
    try:
        migrate.upgrade(make_engine(url))
        floor = commit_floor_ms(url)
        one = single_runner(url, args.tasks)
        many = many_runners(url, args.runners, args.tasks * 2)
        by_length = wal_by_length(url)
    finally:
        with admin.connect() as conn:
            conn.exec_driver_sql(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    print(
        json.dumps(
            {
                "benchmark": "orchestrator_overhead",
                "cycles_per_task": CYCLES,
                "tool": TOOL[0],
                "steps_per_task": 2 * CYCLES + 1,
                "synchronous_commit": sync,
                "cpus": os.cpu_count(),
                "load_avg_1m_at_start": load_at_start[0],
                "load_avg_1m_at_end": os.getloadavg()[0],
                "insert_commit_floor_ms_p50": floor["insert_commit_ms_p50"],
                "floors": floor,
                "one_runner": one,
                "many_runners": many,
                "wal_by_task_length": by_length,
            },
            indent=2,
        )
    )


if __name__ == "__main__":
    main()
