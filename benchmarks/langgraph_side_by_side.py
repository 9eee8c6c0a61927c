"""The orchestrator benchmark's task on LangGraph + PostgresSaver, for side-by-side figures.

The same 20-cycle task as `orchestrator_overhead.py` (model turn, tool call, repeated; then the
final answer: 41 steps), the same scripted model (`testing.scripted_model.reply`, called
in-process) and the same instant tool (its ~200-byte echo), as a LangGraph `StateGraph` of two
nodes (model, tools) checkpointed by `PostgresSaver` with `durability="sync"` (each super-step's
checkpoint is written before the next one starts: the durability a dayzero step has).

Accounting, as close to `orchestrator_overhead.py`'s as LangGraph allows: a step is one node run
(41 per task); a step's latency is from the previous step's streamed update to its own, the
first step's from the `stream()` call (its thread's first checkpoints included). WAL is this
benchmark database's own (pg_walinspect, full-page images left out), table bytes its tables'.

LangGraph is not a dependency of dayzero; run this in a separate venv:

    python3.11 -m venv /tmp/venv-lg && /tmp/venv-lg/bin/pip install -r requirements/bench-langgraph.txt
    /tmp/venv-lg/bin/python -m benchmarks.langgraph_side_by_side [--tasks 40] [--runners 4]
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import operator
import os
import statistics
import time
import uuid
from typing import Annotated, Any, TypedDict

import psycopg
from langgraph.checkpoint.postgres import PostgresSaver
from langgraph.graph import END, START, StateGraph

from benchmarks import pg_wal  # psycopg only
from testing.scripted_model import reply  # stdlib only

ADMIN_DSN = os.environ.get("DAYZERO_BENCH_PG_DSN", "host=127.0.0.1 user=postgres dbname=postgres")
CYCLES = 20
NOTE = "x" * 180  # the instant tool's result padding, as `testing.fixture_tools.Echo`


class State(TypedDict):
    messages: Annotated[list[dict[str, Any]], operator.add]


def model(state: State) -> dict[str, Any]:
    return {"messages": [reply(state["messages"])["choices"][0]["message"]]}


def tools(state: State) -> dict[str, Any]:
    out = []
    for call in state["messages"][-1]["tool_calls"]:
        args = json.loads(call["function"]["arguments"])
        content = json.dumps({"echo": args, "note": NOTE})
        out.append({"role": "tool", "tool_call_id": call["id"], "content": content})
    return {"messages": out}


def route(state: State) -> str:
    return "tools" if state["messages"][-1].get("tool_calls") else END


def build(checkpointer: PostgresSaver) -> Any:
    g = StateGraph(State)
    g.add_node("model", model)
    g.add_node("tools", tools)
    g.add_edge(START, "model")
    g.add_conditional_edges("model", route, ["tools", END])
    g.add_edge("tools", "model")
    return g.compile(checkpointer=checkpointer)


def goal(cycles: int = CYCLES) -> dict[str, Any]:
    return {
        "messages": [{"role": "user", "content": "script:" + json.dumps({"cycles": cycles, "tool": "echo"})}]
    }


def run_task(graph: Any, durations: list[float] | None = None) -> int:
    """One task on a new thread; returns the steps it ran, appending their latencies."""
    config = {"configurable": {"thread_id": uuid.uuid4().hex}, "recursion_limit": 1000}
    steps, last = 0, time.perf_counter()
    for _ in graph.stream(goal(), config, stream_mode="updates", durability="sync"):
        now = time.perf_counter()
        if durations is not None:
            durations.append(now - last)
        steps, last = steps + 1, now
    return steps


def one_runner(dsn: str, n_tasks: int) -> dict[str, Any]:
    with PostgresSaver.from_conn_string(dsn) as saver:
        graph = build(saver)
        for _ in range(2):  # warm-up: connection, prepared statements, graph compile caches
            run_task(graph)
        lsn0, size0 = pg_wal.lsn_and_table_bytes(dsn)
        db0 = pg_wal.server_cpu_seconds(dsn)
        durations: list[float] = []
        firsts: list[float] = []
        lasts: list[float] = []
        t0, cpu0 = time.perf_counter(), time.process_time()
        steps = 0
        for _ in range(n_tasks):
            before = len(durations)
            steps += run_task(graph, durations)
            firsts.append(durations[before])
            lasts.append(durations[-1])
        wall, cpu = time.perf_counter() - t0, time.process_time() - cpu0
        db1 = pg_wal.server_cpu_seconds(dsn)
        lsn1, size1 = pg_wal.lsn_and_table_bytes(dsn)
        rec, _fpi = pg_wal.record_bytes(dsn, lsn0, lsn1)
    later = sorted(set(durations) - set(firsts))
    durations.sort()
    return {
        "tasks": n_tasks,
        "steps": steps,
        "steps_per_s": steps / wall,
        "step_ms_p50": 1000 * statistics.median(durations),
        "step_ms_p99": 1000 * durations[int(0.99 * (len(durations) - 1))],
        "first_step_ms_p50": 1000 * statistics.median(firsts),
        "later_steps_ms_p99": 1000 * later[int(0.99 * (len(later) - 1))],
        "last_step_ms_p50": 1000 * statistics.median(lasts),
        # runner, database (all its processes; None when it runs elsewhere), their sum, the ceiling
        **pg_wal.cpu_per_step(cpu, pg_wal.cpu_between(db0, db1), steps),
        "wal_record_bytes_per_task": rec / n_tasks,
        "table_bytes_per_task": (size1 - size0) / n_tasks,
    }


def _worker(
    dsn: str, n_tasks: int, ready: Any, start: Any, counts: Any, ends: Any, cpus: Any, idx: int
) -> None:
    with PostgresSaver.from_conn_string(dsn) as saver:
        graph = build(saver)
        run_task(graph)  # warm-up, not counted
        ready.release()
        start.wait()
        cpu0 = time.process_time()
        counts[idx] = sum(run_task(graph) for _ in range(n_tasks))
        ends[idx] = time.perf_counter()
        cpus[idx] = time.process_time() - cpu0


def many_runners(dsn: str, n_runners: int, n_tasks: int) -> dict[str, Any]:
    ctx = mp.get_context("spawn")
    ready, start = ctx.Semaphore(0), ctx.Event()
    counts, ends, cpus = ctx.Array("i", n_runners), ctx.Array("d", n_runners), ctx.Array("d", n_runners)
    per = n_tasks // n_runners
    procs = [
        ctx.Process(target=_worker, args=(dsn, per, ready, start, counts, ends, cpus, i))
        for i in range(n_runners)
    ]
    for p in procs:
        p.start()
    for _ in procs:
        ready.acquire()
    db0 = pg_wal.server_cpu_seconds(dsn)
    t0 = time.perf_counter()
    start.set()
    for p in procs:
        p.join()
    db1 = pg_wal.server_cpu_seconds(dsn)
    steps = sum(counts)
    return {
        "runners": n_runners,
        "tasks": per * n_runners,
        "steps": steps,
        "steps_per_s": steps / (max(ends) - t0),
        **pg_wal.cpu_per_step(sum(cpus), pg_wal.cpu_between(db0, db1), steps),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--tasks", type=int, default=40)
    ap.add_argument("--runners", type=int, default=4)
    args = ap.parse_args()
    load_at_start = os.getloadavg()[0]
    name = f"dz_bench_lg_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(ADMIN_DSN, autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{name}"')
        sync = admin.execute("SHOW synchronous_commit").fetchone()[0]
    dsn = ADMIN_DSN.replace("dbname=postgres", f"dbname={name}")
    try:
        with PostgresSaver.from_conn_string(dsn) as saver:
            saver.setup()
        one = one_runner(dsn, args.tasks)
        many = many_runners(dsn, args.runners, args.tasks * 2)
    finally:
        with psycopg.connect(ADMIN_DSN, autocommit=True) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    print(
        json.dumps(
            {
                "benchmark": "langgraph_side_by_side",
                "cycles_per_task": CYCLES,
                "steps_per_task": 2 * CYCLES + 1,
                "synchronous_commit": sync,
                "durability": "sync",
                "cpus": os.cpu_count(),
                "load_avg_1m_at_start": load_at_start,
                "load_avg_1m_at_end": os.getloadavg()[0],
                "one_runner": one,
                "many_runners": many,
            },
            indent=2,
        )
    )


if __name__ == "__main__":
    main()
