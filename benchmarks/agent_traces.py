"""Agent-trace replay through the whole stack: per-turn host cost and prefix-cache reuse of long
agent tasks whose transcripts grow to a target size.

What runs: a scratch PostgreSQL database, `dayzero serve` (REST), `dayzero worker` (Celery tool
worker, Redis broker), `dayzero runner` processes (one per concurrent task) and `dayzero infer
serve` (our inference server with the engine, on `--device`: `--dummy [CONFIG|bench]`, random
weights and the byte tokenizer, or `--model DIR`, e.g. the bundled demo checkpoint). With
`--services local` there are no services: a SQLite file in the run's folder, and each runner runs
its tools in-process (no Celery worker, no Redis), as on a GPU host. Between the runners and the inference server
sits this module's *scripted proxy*: it forwards each chat request byte for byte to the server,
which renders, tokenizes, looks up its prefix cache and prefills as for any request (the tasks
ask for `max_tokens: 1`, so decoding is one token), and replaces the answer's message with the
trace's scripted one. The trace is therefore deterministic while the render, tokenize,
prefix-cache and prefill path is the real one. The proxy's own time is outside every figure
below (they come from the runner, the client and the server).

A trace: each task (several at once, sharing a system prompt) alternates `workspace_write` of a
document (1-50 KB, in the assistant's tool-call arguments) and `workspace_read` of it (the tool
result, through the Celery worker or in-process), until its transcript reaches the target size,
then answers. After it, in the same stack, the cold-prefill baseline: one task whose prompt no
request sent before, as long as the median prompt of the trace's turns 10+ (1-based);
`ttft_ratio_turn10plus` is their p50 TTFT over its TTFT (`--no-cold`: skipped).

Per model turn (from the task's attempts, `GET /v1/tasks/{id}`): runner time before the call
(`runner_ms`: the step's preparation; `encode_ms`: the client's choice of messages and JSON body),
request bytes and wire form (incremental or full, and why), the server's read+parse, preparation
and render+tokenize times, prompt tokens computed vs cached vs ideal (ideal cached: the previous
turn's whole prompt), and TTFT. `--wire full` makes the proxy hide the server's conversation
acknowledgement, so the client sends every transcript whole (the path before incremental
requests), for comparison.

    python -m benchmarks.agent_traces [--sizes 32768,131072] [--tasks 9] [--max-turns 101]
        [--model DIR | --dummy [CONFIG|bench]] [--services postgres|local] [--device cpu|cuda]
        [--no-cold] [--wire incremental|full] [--out docs/results/agent_traces.json] [--png F]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import signal
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import httpx

from benchmarks.trace_host import host_only
from benchmarks.trace_script import TraceSpec, document

REPO = Path(__file__).resolve().parents[1]
TERMINAL = ("SUCCEEDED", "FAILED", "CANCELLED", "TIMED_OUT")


# -- a run -------------------------------------------------------------------------------------
def trace_body(spec: TraceSpec, system_prompt: str) -> dict[str, Any]:
    """A trace task's submission: its script rides in the goal, for the proxy."""
    return {
        "goal": "trace:" + json.dumps({"docs_kb": list(spec.docs_kb)}),
        "system_prompt": system_prompt,
        "allowed_tools": ["workspace_write", "workspace_read"],
        "budget": {"max_steps": 4 * spec.turns, "deadline_s": 86400},
        "sampling": {"max_tokens": 1, "temperature": 0},
    }


COLD_PART_KB = 31  # a message of the cold prompt: under the API's 32,000 characters per message


def cold_body(prompt_tokens: int, bytes_per_token: float, nonce: str) -> dict[str, Any]:
    """The cold-prefill baseline: a one-turn task whose prompt (about `prompt_tokens`) no request
    has sent before. Its system prompt starts with `nonce`, so not even the first cache block is
    shared with the trace's; the fresh document goes in prior user messages, since a goal or a
    message holds at most 32,000 characters. Its script has no documents: the proxy answers its
    one turn with a final message."""
    text_bytes = max(1024, int(prompt_tokens * bytes_per_token) - 128)  # the template's own tokens
    parts, i = [], 0
    while text_bytes > 0:
        kb = min(COLD_PART_KB, text_bytes / 1024)
        parts.append({"role": "user", "content": document(f"cold-{nonce}", i, kb)})
        text_bytes -= int(kb * 1024)
        i += 1
    return {
        "goal": "trace:" + json.dumps({"docs_kb": []}),
        "system_prompt": f"cold-{nonce}: a prompt no request has sent before.",
        "messages": parts,
        "allowed_tools": [],
        "budget": {"max_steps": 4, "deadline_s": 86400},
        "sampling": {"max_tokens": 1, "temperature": 0},
    }


def turn_rows(task: dict[str, Any]) -> list[dict[str, Any]]:
    """The model turns of a finished task, with the figures of their successful attempts."""
    rows: list[dict[str, Any]] = []
    prev_prompt = 0
    for step in task.get("steps") or []:
        if step.get("kind") != "model":
            continue
        ok = [a for a in step.get("attempts") or [] if a.get("status") == "SUCCEEDED"]
        u = (ok[-1].get("usage") if ok else None) or {}
        prompt, cached = int(u.get("prompt_tokens") or 0), int(u.get("cached_tokens") or 0)
        server = u.get("server_ms") or {}
        host = sum(
            float(v or 0)
            for v in (
                u.get("runner_ms"),
                u.get("encode_ms"),
                server.get("parse_ms"),
                server.get("prepare_ms"),
            )
        )
        rows.append({
            "turn": len(rows), "prompt_tokens": prompt, "cached_tokens": cached, "computed_tokens": prompt - cached,
            "ideal_cached_tokens": prev_prompt, "request_bytes": u.get("request_bytes"), "wire": u.get("wire"),
            "runner_ms": u.get("runner_ms"), "encode_ms": u.get("encode_ms"), "server_parse_ms": server.get("parse_ms"),
            "server_prepare_ms": server.get("prepare_ms"), "server_render_ms": server.get("render_ms"),
            "host_ms": round(host, 3), "ttft_ms": u.get("ttft_ms"),
        })  # fmt: skip
        prev_prompt = prompt
    return rows


def turns_completed(task: dict[str, Any]) -> int:
    """The model turns of a task that have a successful attempt."""
    return sum(
        1
        for step in task.get("steps") or []
        if step.get("kind") == "model"
        and any(a.get("status") == "SUCCEEDED" for a in step.get("attempts") or [])
    )


def run_tasks(
    api: str, key: str, bodies: list[dict[str, Any]], turns: list[int], timeout_s: float
) -> list[dict[str, Any]]:
    """Submit every task at once (`turns`: each one's model turns, for the progress bar), wait
    for all (progress on stderr); their rows."""
    with httpx.Client(base_url=api, headers={"Authorization": f"Bearer {key}"}, timeout=120) as client:
        ids = []
        for body in bodies:
            r = client.post("/v1/tasks", json=body)
            if r.status_code >= 400:
                raise SystemExit(f"POST /v1/tasks answered {r.status_code}: {r.text[:2000]}")
            ids.append(r.json()["id"])
        total = sum(turns)
        end = time.monotonic() + timeout_s
        tasks: dict[str, dict[str, Any]] = {}
        while time.monotonic() < end:
            done_turns = 0
            for tid, n in zip(ids, turns, strict=True):
                if tid in tasks:
                    done_turns += n
                    continue
                t = client.get(f"/v1/tasks/{tid}").json()
                if t["status"] in TERMINAL:
                    tasks[tid] = t
                    done_turns += n
                else:
                    done_turns += (((t.get("usage") or {}).get("steps") or 0) + 1) // 2
            bar = "#" * int(30 * done_turns / total)
            print(f"\r[{bar:<30}] {done_turns}/{total} model turns", end="", file=sys.stderr, flush=True)
            if len(tasks) == len(ids):
                break
            time.sleep(1.0)
        print(file=sys.stderr)
        out = []
        for tid, n in zip(ids, turns, strict=True):
            t = tasks.get(tid) or client.get(f"/v1/tasks/{tid}").json()
            out.append({
                "task": tid, "status": t["status"], "error": t.get("error"),
                "turns_planned": n, "turns_completed": turns_completed(t), "turns": turn_rows(t),
            })  # fmt: skip
        return out


def run_trace(
    api: str, key: str, specs: list[TraceSpec], system_prompt: str, timeout_s: float
) -> list[dict[str, Any]]:
    """The trace's tasks, all at once; their rows."""
    bodies = [trace_body(s, system_prompt) for s in specs]
    return run_tasks(api, key, bodies, [s.turns for s in specs], timeout_s)


LATE_TURN = 10  # "turn 10+": the 10th model turn (1-based) and later


def late_turns(tasks: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [r for t in tasks for r in t["turns"] if r["turn"] + 1 >= LATE_TURN]


def run_cold(
    api: str, key: str, tasks: list[dict[str, Any]], bytes_per_token: float, timeout_s: float
) -> dict[str, Any]:
    """The cold-prefill baseline in the trace's stack, after it: one task whose first prompt is
    new and as long as the median prompt of the trace's turns 10+; its TTFT beside theirs."""
    late = late_turns(tasks)
    if not late:
        return {"cold": None, "cold_skipped": f"no trace turn reached turn {LATE_TURN}: raise --max-turns"}
    target = int(_median([r["prompt_tokens"] for r in late]))
    task = run_tasks(api, key, [cold_body(target, bytes_per_token, uuid.uuid4().hex)], [1], timeout_s)[0]
    row = task["turns"][0] if task["turns"] else {}
    ttft = row.get("ttft_ms")
    cold = {
        "status": task["status"], "error": task["error"], "target_prompt_tokens": target,
        **{k: row.get(k) for k in ("prompt_tokens", "cached_tokens", "request_bytes")},
        "ttft_ms": round(ttft, 3) if ttft is not None else None,
    }  # fmt: skip
    late_ttft = [r["ttft_ms"] for r in late if r["ttft_ms"] is not None]
    p50 = round(_median(late_ttft), 3) if late_ttft else None
    ratio = round(p50 / ttft, 4) if p50 is not None and ttft else None
    return {
        "cold": cold,
        "cold_ttft_ms": cold["ttft_ms"],
        "ttft_ms_p50_turn10plus": p50,
        "turn10plus_turns": len(late),
        "ttft_ratio_turn10plus": ratio,
    }


def summarise(tasks: list[dict[str, Any]], size: int) -> dict[str, Any]:
    turns = [r for t in tasks for r in t["turns"]]
    later = [r for r in turns if r["turn"] > 0]
    ideal = sum(r["ideal_cached_tokens"] for r in later)
    cached = sum(min(r["cached_tokens"], r["ideal_cached_tokens"]) for r in later)

    def pct(vals: list[float], q: float) -> float | None:
        vals = sorted(v for v in vals if v is not None)
        return round(vals[min(len(vals) - 1, int(q * len(vals)))], 3) if vals else None

    big = [r for r in later if r["prompt_tokens"] >= 0.75 * size]
    return {
        "target_tokens": size,
        "tasks": len(tasks),
        "statuses": sorted({t["status"] for t in tasks}),
        "turns_completed": [t["turns_completed"] for t in tasks],
        "model_turns": len(turns),
        "max_prompt_tokens": max((r["prompt_tokens"] for r in turns), default=0),
        "cached_share_of_ideal": round(cached / ideal, 4) if ideal else None,
        "wire_forms": {
            w: sum(1 for r in turns if r["wire"] == w) for w in sorted({str(r["wire"]) for r in turns})
        },
        "host_ms_p50": pct([r["host_ms"] for r in later], 0.5),
        "host_ms_p90": pct([r["host_ms"] for r in later], 0.9),
        "host_ms_p50_last_quarter": pct([r["host_ms"] for r in big], 0.5),
        "host_ms_per_new_kb_p50_last_quarter": pct([per_new_kb(r) for r in big], 0.5),
        "request_bytes_p50_last_quarter": pct([r["request_bytes"] for r in big], 0.5),
        "server_render_ms_p50_last_quarter": pct([r["server_render_ms"] for r in big], 0.5),
        "ttft_ms_p50_last_quarter": pct([r["ttft_ms"] for r in big], 0.5),
    }


def per_new_kb(row: dict[str, Any]) -> float:
    """A turn's host ms per KB of request (what is new on the wire): flat across transcript sizes
    where the host path is O(new messages), whatever the new text's own tokenizing costs."""
    return round(row["host_ms"] / max(1.0, (row["request_bytes"] or 0) / 1024), 4)


def _bytes_per_token(model: str | None) -> float:
    """How many bytes of trace text a token holds: 1 for the byte tokenizer (`--dummy`), measured
    on a document for a checkpoint's."""
    if model is None:
        return 1.0
    from inference.tokenizer import load_tokenizer

    text = document("calibrate", 0, 16)
    return len(text.encode()) / max(1, len(load_tokenizer(model).encode(text)))


def _gpu_name() -> str:
    import torch

    return torch.cuda.get_device_name()


def _median(vals: list[float]) -> float:
    vals = sorted(vals)
    return vals[len(vals) // 2] if vals else 0.0


def plot(results: list[dict[str, Any]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 5, figsize=(26, 4.5))
    for res in results:
        label = f"{res['target_tokens'] // 1024}K {res['wire']}{' host-only' if res.get('mode') else ''}"
        rows = [r for t in res["tasks"] for r in t["turns"] if r["turn"] > 0]
        rows.sort(key=lambda r: r["prompt_tokens"])
        x = [r["prompt_tokens"] for r in rows]
        axes[0].plot(x, [r["host_ms"] for r in rows], ".", ms=3, label=label)
        axes[1].plot(x, [r["request_bytes"] or 0 for r in rows], ".", ms=3, label=label)
        axes[2].plot(x, [per_new_kb(r) for r in rows], ".", ms=3, label=label)
        if res.get("mode") != "host_only":
            axes[3].plot(
                x,
                [r["cached_tokens"] / max(1, r["ideal_cached_tokens"]) for r in rows],
                ".",
                ms=3,
                label=label,
            )
            axes[4].plot(x, [r["ttft_ms"] for r in rows], ".", ms=3, label=label)
            if res.get("cold_ttft_ms"):  # the same stack prefilling a turn-10+ prompt cold
                cold = res["cold"]
                axes[4].plot([cold["prompt_tokens"]], [res["cold_ttft_ms"]], "x", ms=8, label=f"{label} cold")
    axes[0].set(
        xlabel="prompt tokens",
        ylabel="host ms per turn (runner + client + server parse/prepare)",
        yscale="log",
    )
    axes[1].set(xlabel="prompt tokens", ylabel="request bytes", yscale="log")
    axes[2].set(xlabel="prompt tokens", ylabel="host ms per KB of request (what is new)", yscale="log")
    axes[3].set(xlabel="prompt tokens", ylabel="cached / ideal cached tokens", ylim=(0, 1.1))
    axes[4].set(xlabel="prompt tokens", ylabel="TTFT ms (turns > 0; x: cold prefill)", yscale="log")
    for ax in axes:
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def trace_sets(
    args: argparse.Namespace, sizes: list[int], system_prompt: str, bytes_per_token: float
) -> list[tuple[int, list[TraceSpec]]]:
    """(target tokens, the tasks' scripts) per run: per size, tasks growing to it; with `--mixed`,
    one run of a long task (the first) beside shorter ones, its size what its documents make."""
    base_tokens = round(len(system_prompt.encode()) / bytes_per_token) + 64  # + the goal
    if args.mixed:
        long_turns, other_turns, doc_kb = args.mixed.split(",")
        specs = [TraceSpec.of_turns(int(long_turns), float(doc_kb))]
        specs += [TraceSpec.of_turns(int(other_turns), float(doc_kb)) for _ in range(args.tasks - 1)]
        # each document twice (write, read) and the turns' own bytes
        size = base_tokens + round(2 * sum(specs[0].docs_kb) * 1024 / bytes_per_token) + 160 * specs[0].turns
        return [(size, specs)]
    return [
        (
            size,
            [
                TraceSpec.growing_to(size, s, bytes_per_token, args.max_turns, base_tokens)
                for s in range(args.tasks)
            ],
        )
        for size in sizes
    ]


def dummy_config(value: str | None, work: Path) -> str:
    """`--dummy [CONFIG]` as `dayzero infer serve --dummy` takes it: "" the small test model,
    `bench` the engine benchmarks' config (`benchmarks.engine_setup.bench_config`, written to
    `work`), else a config.json path."""
    if value != "bench":
        return value or ""
    from benchmarks.engine_setup import bench_config

    path = work / "bench_config.json"
    path.write_text(json.dumps(bench_config(), indent=1))
    return str(path)


def main(argv: list[str] | None = None) -> int:
    from benchmarks.trace_stack import StackOptions, database, stack

    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--sizes", default="32768,131072", help="target transcript tokens, comma-separated")
    p.add_argument("--tasks", type=int, default=9, help="tasks at once (each with its runner)")
    p.add_argument("--max-turns", type=int, default=101)
    p.add_argument(
        "--mixed",
        default=None,
        metavar="LONG,OTHERS,DOC_KB",
        help="instead of --sizes: one task of LONG model turns beside --tasks - 1 of OTHERS turns, "
        "documents of DOC_KB (e.g. 101,41,0.25: a 100-turn trace with 8 others on a CPU)",
    )
    src = p.add_mutually_exclusive_group()
    src.add_argument("--model", default=None, help="checkpoint folder (default: --dummy)")
    src.add_argument(
        "--dummy",
        nargs="?",
        const="",
        default=None,
        metavar="CONFIG",
        help="random weights and the byte tokenizer (the default): of the small test model, of a "
        "config.json, or `bench`: the engine benchmarks' ~2.7B config",
    )
    p.add_argument(
        "--services",
        choices=["postgres", "local"],
        default="postgres",
        help="postgres: scratch PostgreSQL database + Celery tool worker on Redis; local: a SQLite file "
        "and tools in-process in each runner (no services: a GPU host)",
    )
    p.add_argument("--device", default="cpu", help="`dayzero infer serve --device` (cpu, cuda)")
    p.add_argument(
        "--no-cold",
        action="store_true",
        help="skip the cold-prefill baseline (one fresh-prompt task after each size's trace)",
    )
    p.add_argument("--wire", choices=["incremental", "full"], default="incremental")
    p.add_argument("--system-kb", type=int, default=8, help="the shared system prompt's size")
    p.add_argument("--infer-args", default="", help="more `dayzero infer serve` arguments")
    p.add_argument("--timeout", type=float, default=3600)
    p.add_argument("--host-only", action="store_true", help="the host path alone, in process (see host_only)")
    p.add_argument("--out", type=Path, default=None)
    p.add_argument("--png", type=Path, default=None)
    args = p.parse_args(argv)
    sizes = [int(s) for s in args.sizes.split(",") if s]
    bytes_per_token = _bytes_per_token(args.model)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # stop the stack's processes on the way out
    system_prompt = "You are a careful agent. Reference material follows.\n" + document(
        "system", 0, args.system_kb
    )
    results = []
    for size, specs in trace_sets(args, sizes, system_prompt, bytes_per_token):
        if args.host_only:
            t0 = time.perf_counter()
            tasks = host_only(specs, system_prompt, args.model, args.wire)
            rows = [r for t in tasks for r in t["turns"] if r["turn"] > 0]
            big = [r for r in rows if r["prompt_tokens"] >= 0.75 * max(r["prompt_tokens"] for r in rows)]
            res = {
                "mode": "host_only", "wire": args.wire, "target_tokens": size, "tasks_run": len(tasks),
                "max_prompt_tokens": max(r["prompt_tokens"] for r in rows),
                "host_ms_p50_last_quarter": _median([r["host_ms"] for r in big]),
                "host_ms_per_new_kb_p50_last_quarter": _median([per_new_kb(r) for r in big]),
                "host_ms_max_last_quarter": max(r["host_ms"] for r in big),
                "server_render_ms_p50_last_quarter": _median([r["server_render_ms"] for r in big]),
                "request_bytes_p50_last_quarter": _median([r["request_bytes"] for r in big]),
                "wall_s": round(time.perf_counter() - t0, 1), "tasks": tasks,
            }  # fmt: skip
            results.append(res)
            write(args, results)
            print(json.dumps({k: v for k, v in res.items() if k != "tasks"}), file=sys.stderr, flush=True)
            continue
        work = Path(f"/tmp/dz-traces-{uuid.uuid4().hex[:6]}")
        (work / "ws").mkdir(parents=True)
        opts = StackOptions(
            model=args.model,
            max_model_len=int(size * 1.5) + 65536,
            runners=args.tasks,
            services=args.services,
            device=args.device,
            dummy_config=dummy_config(args.dummy, work),
            wire=args.wire,
            infer_args=tuple(args.infer_args.split()),
        )
        t0 = time.perf_counter()
        with database(work, opts) as (db_url, key), stack(db_url, work, opts) as (api, _proxy):
            tasks = run_trace(api, key, specs, system_prompt, args.timeout)
            res = {
                "wire": args.wire,
                **({"mixed": args.mixed, "long_task": summarise(tasks[:1], size)} if args.mixed else {}),
                **summarise(tasks, size),
                "wall_s": round(time.perf_counter() - t0, 1),
                "tasks": tasks,
            }
            results.append(res)
            write(args, results)  # the trace is kept should a time limit cut the cold baseline
            if not args.no_cold:
                res.update(run_cold(api, key, tasks, bytes_per_token, args.timeout))
                res["wall_s"] = round(time.perf_counter() - t0, 1)
        write(args, results)
        print(json.dumps({k: v for k, v in res.items() if k != "tasks"}), file=sys.stderr, flush=True)
    if args.png:
        try:
            plot(results, args.png)
        except ImportError:
            print("no matplotlib here: no PNG (pip install matplotlib)", file=sys.stderr)
    print(json.dumps([{k: v for k, v in r.items() if k != "tasks"} for r in results], indent=1))
    return 0


def write(args: argparse.Namespace, results: list[dict[str, Any]]) -> None:
    """The results so far, as `--out`'s JSON (nothing without `--out`)."""
    if not args.out:
        return
    out = {
        "benchmark": "agent_traces",
        "machine": {
            "cpu_count": os.cpu_count(),
            "platform": platform.platform(),
            "python": platform.python_version(),
            **({"gpu": _gpu_name()} if args.device.startswith("cuda") else {}),
        },
        "model": args.model
        or " ".join(["--dummy", *([args.dummy] if args.dummy else []), "(random weights, byte tokenizer)"]),
        "services": args.services,
        "device": args.device,
        "model_side": "scripted proxy: real render/tokenize/prefix cache/prefill (max_tokens 1), scripted message",
        "results": results,
    }
    args.out.write_text(json.dumps(out, indent=1) + "\n")


if __name__ == "__main__":
    raise SystemExit(main())
