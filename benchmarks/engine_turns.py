"""Engine host cost of an agent turn at a long transcript, with no forward: add the request, the
prefix-hit step (hit search, allocation, the new tokens' bookkeeping), the decode steps and the
finishing step (end-of-generation checkpoint, freeing, keeping the turn's block keys).

A conversation is prefilled once to `size` tokens (untimed); then each of `turns` turns appends
the previous reply and `new` tokens (a tool result) to the kept ids, as the server's incremental
chat path does (vouching for the kept ids only: `PrefixLink`), and is
sent to a real `Engine` whose model runner is replaced by one that samples a fixed token (the
scheduler, the cache coordinator and the request intake are the real ones). The turn's prompt
list is built outside the timing (the server's render, measured by `agent_traces --host-only`).
Per turn: `add_ms` (`Engine.add_request`), `hit_step_ms` (the first step), `last_step_ms` (the
step that finishes it), `turn_ms` (their sum: what grows with the transcript) and `decode_ms`
(the other steps), and the prefix hit against what the previous turn left reusable (all of its
tokens but the last sampled one). Medians over the turns after the first. Prints JSON; `--out` merges it into a
file under the label `--label`.

    python -m benchmarks.engine_turns [--sizes 131072 1048576] [--turns 8] [--new 2000]
    python -m benchmarks.engine_turns --no-link   # plain requests: nobody vouches for the prefix
    PYTHONPATH=/other/checkout python benchmarks/engine_turns.py --no-link   # that code's figures
"""

from __future__ import annotations

import argparse
import gc
import inspect
import json
import os
import random
import statistics
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from inference.engine.engine import Engine, EngineConfig
from inference.engine.request import SamplingParams
from inference.tokenizer import ByteTokenizer

TOKEN = ord("a")  # what the stand-in runner samples
GEN_PROMPT = 3  # tokens of the generation prompt after the kept ids (not part of them)


class NoForward:
    """The model runner's place, with no model: every request due a token gets `TOKEN`."""

    graphs = None

    def __init__(self) -> None:
        self.unstarted: list[int] = []
        self.tables: dict[str, Any] = {}

    def execute(self, out, reqs, masks) -> tuple[dict[str, int], dict]:
        return {s.req_id: TOKEN for s in out.scheduled if s.sample}, {}

    def poll_transfers(self, wait: bool = False) -> list[int]:
        return []

    def drop(self, rid: str) -> None:
        self.tables.pop(rid, None)


def make_engine(size: int, turns: int, new: int, block: int) -> Engine:
    longest = size + turns * (new + GEN_PROMPT + 16) + 4096
    config = EngineConfig.of(
        block_size=block,
        num_blocks=longest // block + 4096,
        num_state_slots=64,
        checkpoint_interval=1024,
        max_num_seqs=8,
        max_num_batched_tokens=8192,
        max_model_len=longest,
        enable_cuda_graphs=False,
    )
    spec = SimpleNamespace(kv_bytes_per_token=1, state_bytes_per_slot=1)
    return Engine(None, ByteTokenizer(), config, cache_spec=spec, runner=NoForward())


def run_size(size: int, turns: int, new: int, block: int, linked: bool, seed: int = 0) -> dict[str, Any]:
    rng = random.Random(seed)
    eng = make_engine(size, turns, new, block)
    link_kw = linked and "prefix_link" in inspect.signature(Engine.add_request).parameters
    if link_kw:
        from inference.cache.records import PrefixLink
    sp = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)
    kept = [rng.randrange(256) for _ in range(size)]  # the conversation's kept ids (append-only)
    prev: str | None = None
    rows = []
    for turn in range(turns + 1):
        shared = len(kept)  # what the previous turn's prompt started with (the server vouches)
        if turn:  # the previous turn's generation prompt and reply, as rendered, and a tool result
            kept += [1] * GEN_PROMPT + [TOKEN] * sp.max_tokens + [rng.randrange(256) for _ in range(new)]
        prompt = kept[:]  # the server's copy, handed to the engine, built as `chat/render.py` does:
        prompt += [1] * GEN_PROMPT  # (`+=` leaves room for the output the request appends to it)
        name = f"t{turn}"
        kw: dict[str, Any] = {}
        if link_kw:
            kw = {"prefix_link": PrefixLink(name, prev, shared if prev else 0), "handover": True}
        gc.collect()
        t0 = time.perf_counter()
        rid = eng.add_request(prompt, sp, request_id=name, **kw)
        t1 = time.perf_counter()
        steps, cached = [], 0
        while eng.has_unfinished:
            s0 = time.perf_counter()
            outs = eng.step()
            steps.append(time.perf_counter() - s0)
            cached = max([cached, *(o.num_cached_tokens for o in outs)])
        prev = name
        if turn == 0:  # the prefill of the whole transcript: setup
            continue
        rows.append({
            "turn": turn, "prompt_tokens": len(kept) + GEN_PROMPT, "steps": len(steps),
            "add_ms": (t1 - t0) * 1e3, "hit_step_ms": steps[0] * 1e3, "last_step_ms": steps[-1] * 1e3,
            "decode_ms": sum(steps[1:-1]) * 1e3,
            "turn_ms": (t1 - t0 + steps[0] + steps[-1]) * 1e3, "rid": rid,
            "cached_tokens": cached, "reusable_tokens": shared + GEN_PROMPT + sp.max_tokens - 1,
        })  # fmt: skip
    timed = rows[1:] if len(rows) > 1 else rows
    med = {k: round(statistics.median(r[k] for r in timed), 3) for k in ("add_ms", "hit_step_ms", "last_step_ms", "decode_ms", "turn_ms")}  # fmt: skip
    stats = eng.scheduler.stats()
    return {
        "size": size,
        "median": med,
        "max_turn_ms": round(max(r["turn_ms"] for r in timed), 3),
        "turns": [{k: (round(v, 3) if isinstance(v, float) else v) for k, v in r.items()} for r in rows],
        "cached_share_of_reusable": round(
            sum(r["cached_tokens"] for r in timed) / sum(r["reusable_tokens"] for r in timed), 4
        ),
        "linked": bool(link_kw),
        "keys_reused": getattr(eng.scheduler.cache, "kept", SimpleNamespace(reused=0)).reused,
        "scheduler_stats": {k: v for k, v in stats.items() if isinstance(v, int | float)},
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", type=int, nargs="+", default=[131072, 1048576])
    ap.add_argument("--turns", type=int, default=8)
    ap.add_argument("--new", type=int, default=2000, help="tokens each turn adds")
    ap.add_argument("--block", type=int, default=16)
    ap.add_argument("--no-link", action="store_true", help="plain requests (no PrefixLink, copied prompt)")
    ap.add_argument("--label", default=None, help="the run's name in --out (default: linked / plain)")
    ap.add_argument("--out", type=Path, default=None, help="JSON file to merge this run into")
    args = ap.parse_args()
    runs = {}
    for size in args.sizes:
        res = run_size(size, args.turns, args.new, args.block, linked=not args.no_link)
        runs[str(size)] = res
        print(f"{size} tokens: turn {res['median']['turn_ms']} ms (median), {res['median']}", flush=True)
    label = args.label or ("linked" if not args.no_link else "plain")
    result = {
        "label": label,
        "sizes": runs,
        "new_tokens_per_turn": args.new,
        "block_size": args.block,
        "cpu_count": os.cpu_count(),
        "load_avg_1m": round(os.getloadavg()[0], 2),
    }
    if args.out is not None:
        merged = json.loads(args.out.read_text()) if args.out.exists() else {}
        merged[label] = result
        args.out.write_text(json.dumps(merged, indent=1) + "\n")
    print(json.dumps({label: {s: r["median"] for s, r in runs.items()}}))


if __name__ == "__main__":
    main()
