"""PostgreSQL under a long task's history: a task whose transcript grows to about 1M tokens
(~4 MB of text), driven by the real runner, tool steps through the in-process dispatcher and the
workspace tools, the model side scripted in process (each turn writes a document of 10-50 KB,
the next reads it back; prompt tokens counted as UTF-8 bytes / 4).

Measured, with tool results inline in the history rows and by reference (`payload_ref_bytes`):
- WAL bytes per model turn + tool step (`pg_current_wal_lsn()` before each model call);
- loading the whole transcript (a claim with nothing kept, on a fresh connection) vs a claim that
  keeps it (`runner.transcripts`: the rows since its position);
- the task's SSE feed read from the start (`api/routes/events._read`, 500 rows a read);
- a crash mid-task: the runner dies at turn `--crash-at`, another claims the task when the lease
  expires, reads the history once, and finishes it.

    python -m benchmarks.long_history [--tokens 1048576] [--crash-at 60] [--out docs/results/long_history.json]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from collections.abc import Mapping, Sequence
from itertools import pairwise
from pathlib import Path
from typing import Any

from benchmarks.trace_script import document


class Crash(BaseException):
    """Stands for the runner process dying: nothing of it runs on (no cleanup, no commit)."""


class ScriptedChat:
    """The model side: turn k (the count of assistant messages so far) writes document k // 2 or
    reads it back, until the transcript holds the target tokens; then it answers."""

    images_by_reference = False

    def __init__(self, engine: Any, target_tokens: int, crash_at: int | None = None) -> None:
        self.engine, self.target, self.crash_at = engine, target_tokens, crash_at
        self.lsn: list[tuple[int, int, int]] = []  # (turn, WAL position, prompt tokens)
        self.calls = 0

    def chat(
        self, messages: Sequence[Mapping[str, Any]], tools: Sequence[Mapping[str, Any]], sampling: Any
    ) -> Any:
        from orchestrator.inference_client import AssistantTurn, ToolCall, Usage

        turn = sum(1 for m in messages if m.get("role") == "assistant")
        tokens = sum(len(json.dumps(m, ensure_ascii=False).encode()) for m in messages) // 4
        with self.engine.connect() as conn:
            lsn = conn.exec_driver_sql("SELECT pg_current_wal_lsn() - '0/0'").scalar()
        self.lsn.append((turn, int(lsn), tokens))
        self.calls += 1
        if self.crash_at is not None and self.calls > self.crash_at:
            raise Crash()
        usage = Usage(prompt_tokens=tokens, completion_tokens=1)
        if tokens >= self.target:
            return AssistantTurn(content="done", usage=usage, finish_reason="stop")
        i = turn // 2
        if turn % 2 == 0:
            kb = 10 + (i * 7) % 41
            name, args = "workspace_write", {"path": f"doc{i}.txt", "content": document("long", i, kb)}
        else:
            name, args = "workspace_read", {"path": f"doc{i}.txt"}
        call = ToolCall(id=f"c{turn}", name=name, arguments=json.dumps(args))
        return AssistantTurn(content=None, tool_calls=(call,), usage=usage, finish_reason="tool_calls")

    def close(self) -> None:
        pass


def run(db_url: str, work: Path, target: int, ref_bytes: int | None, crash_at: int | None) -> dict[str, Any]:
    from orchestrator.api.routes.events import _read
    from orchestrator.config import Budgets
    from orchestrator.db.engine import make_engine
    from orchestrator.dispatch import InProcessDispatcher
    from orchestrator.runner import Runner, RunnerConfig
    from orchestrator.runner.lease import claim_with_state
    from orchestrator.store import NewTask, create_task, get_task
    from orchestrator.tasks.queries import task_state
    from tools.config import ToolsConfig
    from workers.tool_jobs import build_registry

    engine = make_engine(db_url)
    registry = build_registry(ToolsConfig(skip_unavailable=True))
    with engine.begin() as conn:
        task_id, _ = create_task(
            conn,
            NewTask(
                tenant="bench",
                goal="Write and read back the documents.",
                max_steps=100_000,
                max_tokens=2_000_000_000,
            ),
            Budgets(max_steps=100_000, max_tokens=2_000_000_000, deadline_s=86400),
        )

    def runner(chat: ScriptedChat, lease_s: float) -> Runner:
        cfg = RunnerConfig(
            lease_s=lease_s, poll_interval_s=0.05, workspace_dir=str(work / "ws"), blob_url=str(work / "blobs"),
            payload_ref_bytes=ref_bytes,
        )  # fmt: skip
        return Runner(engine, chat, InProcessDispatcher(registry), registry, cfg)

    out: dict[str, Any] = {"payload_ref_bytes": ref_bytes}
    first = ScriptedChat(engine, target, crash_at)
    a = runner(first, lease_s=3.0)
    t0 = time.perf_counter()
    try:
        a.run_until_idle(timeout_s=3600)
    except Crash:
        a._release_connection()  # the process is gone: its connection closes, its lease stays
        out["crashed_at_turn"] = first.lsn[-1][0]
        print(f"runner crashed at turn {first.lsn[-1][0]}", file=sys.stderr, flush=True)
        time.sleep(3.5)  # its lease expires
        second = ScriptedChat(engine, target)
        b = runner(second, lease_s=30.0)
        reads: list[tuple[int, float]] = []
        from orchestrator.runner import lease as lease_mod

        real = lease_mod._with_cache

        def counted(conn, task, rows, attachments, cache, known):
            t = time.perf_counter()
            state = real(conn, task, rows, attachments, cache, known)
            reads.append((len(rows), (time.perf_counter() - t) * 1000))
            return state

        lease_mod._with_cache = counted
        try:
            t1 = time.perf_counter()
            b.run_until_idle(timeout_s=3600)
            out["resume"] = {
                "claims": len(reads),
                "rows_read_per_claim": [n for n, _ in reads],
                "join_ms_per_claim": [round(ms, 2) for _, ms in reads],
                "whole_transcript_reads": b.transcripts.stats["miss"] + b.transcripts.stats["mismatch"],
                "resume_to_finish_s": round(time.perf_counter() - t1, 2),
            }
        finally:
            lease_mod._with_cache = real
        first.lsn += second.lsn
        b.stop()
    a.stop()
    out["drive_s"] = round(time.perf_counter() - t0, 2)
    lsn = sorted(first.lsn)
    per_turn = [b[1] - a_[1] for a_, b in pairwise(lsn) if b[0] == a_[0] + 1]
    with engine.connect() as conn:
        task = get_task(conn, task_id)
        sizes = conn.exec_driver_sql(
            "SELECT count(*), coalesce(sum(pg_column_size(e.*)), 0) FROM events e WHERE task_id = %s",
            (task_id,),
        ).one()
    out.update(
        status=task.status, model_turns=len(lsn), final_tokens=lsn[-1][2], history_rows=sizes[0],
        history_bytes=int(sizes[1]),
        wal_bytes_per_turn_p50=sorted(per_turn)[len(per_turn) // 2] if per_turn else None,
        wal_bytes_per_turn_max=max(per_turn) if per_turn else None,
        wal_bytes_total=lsn[-1][1] - lsn[0][1],
    )  # fmt: skip
    # loading: a claim with nothing kept (fresh connection, the whole transcript) vs one that keeps it
    loads = []
    for _ in range(5):
        engine.dispose()
        t = time.perf_counter()
        with engine.connect() as conn:
            state = task_state(conn, task_id)
        loads.append((time.perf_counter() - t) * 1000)
    out["load_whole_transcript_ms"] = round(sorted(loads)[2], 2)
    out["transcript_messages"] = len(state.messages)
    with engine.begin() as conn:  # make it claimable again to time a claim that keeps it
        conn.exec_driver_sql(
            "UPDATE tasks SET status = 'RUNNING', lease_owner = NULL, lease_until = NULL, next_run_at = now() WHERE id = %s",
            (task_id,),
        )
    from orchestrator.runner.transcripts import CachedTranscript, TranscriptCache

    cache = TranscriptCache()
    with engine.connect() as conn:
        row = get_task(conn, task_id)
    claims = []
    for _ in range(5):
        cache.put(
            task_id,
            CachedTranscript(
                row.created_at, row.event_seq, 1, list(state.messages), list(state.message_steps)
            ),
        )
        with engine.begin() as conn:
            conn.exec_driver_sql(
                "UPDATE tasks SET lease_owner = NULL, lease_until = NULL WHERE id = %s", (task_id,)
            )
        with engine.connect() as conn:
            t = time.perf_counter()
            got = claim_with_state(conn, "bench", 30.0, cache)
            claims.append((time.perf_counter() - t) * 1000)
        assert got is not None and len(got.messages) == len(state.messages)
    out["claim_keeping_transcript_ms"] = round(sorted(claims)[2], 2)
    # the SSE feed from the start
    t = time.perf_counter()
    after, frames = 0, 0
    while True:
        _, rows = _read(engine, task_id, after)
        if not rows:
            break
        frames += len(rows)
        after = rows[-1].seq
    out["sse_feed_read_all_ms"] = round((time.perf_counter() - t) * 1000, 1)
    out["sse_events"] = frames
    engine.dispose()
    return out


def main(argv: list[str] | None = None) -> int:
    import uuid

    from benchmarks.ingest_kafka import scratch_database
    from orchestrator.db import migrate
    from orchestrator.db.engine import make_engine

    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--tokens", type=int, default=1_048_576)
    p.add_argument("--crash-at", type=int, default=60, help="model turns before the first runner dies")
    p.add_argument("--out", type=Path, default=None)
    args = p.parse_args(argv)
    results = []
    for ref in (None, 16384):
        with scratch_database() as db_url:
            engine = make_engine(db_url)
            migrate.upgrade(engine)
            engine.dispose()
            work = Path(f"/tmp/dz-history-{uuid.uuid4().hex[:6]}")
            work.mkdir(parents=True)
            print(f"payload_ref_bytes={ref}: driving a {args.tokens}-token task", file=sys.stderr, flush=True)
            res = run(db_url, work, args.tokens, ref, args.crash_at)
            print(json.dumps(res), file=sys.stderr, flush=True)
            results.append(res)
    out = {
        "benchmark": "long_history",
        "machine": {"cpu_count": os.cpu_count(), "platform": platform.platform()},
        "target_tokens": args.tokens,
        "results": results,
    }
    if args.out:
        args.out.write_text(json.dumps(out, indent=1) + "\n")
    print(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
