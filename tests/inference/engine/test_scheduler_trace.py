"""Every SchedulerOutput of a mixed workload equals a recorded reference (the scheduler's fast paths
must not change a single decision).

The workload: prompts sharing prefixes, chunked prefills cut at checkpoints, decodes, eos / stop
token / max_tokens / context-length finishes, an abort, agent turns re-sending their transcript
(prefix hits at block boundaries and inside a block), under memory pressure (preemption) and with
few state slots. The digests were recorded with the scheduler before its host-cost fast paths
(main at 32cac66); a change of any scheduled token, position, block id, slot, copy, snapshot or
preemption changes them. If a deliberate change of a scheduling rule moves them, check the new
outputs with the symbolic tests, then record the new digests (`python -m` this file prints them).
"""

from __future__ import annotations

import hashlib
import random

import pytest

from inference.cache.coordinator import CacheConfig
from inference.engine.request import SamplingParams, make_request
from inference.engine.scheduler import Scheduler, SchedulerConfig, SchedulerOutput

EOS = 1

CONFIGS = {
    "default": dict(),
    "preemption": dict(num_blocks=40),
    "few-slots": dict(slots=6, max_seqs=5),
    "no-prefix-cache": dict(prefix=False),
    "no-chunking": dict(chunked=False, budget=96),
    "tiny-budget": dict(budget=5),
}

# (steps, sha256 of every output) recorded with main at 32cac66
RECORDED = {
    "default": (57, "9510e38b13972f992cbb15011fbb4578a66e00cca9d8788c1f182fdeb31230f0"),
    "preemption": (167, "e4c4d7664d9b40dd2ae3716a3510509f785590b900edb1d661e73846aa9fade0"),
    "few-slots": (123, "719337520d2f5f6845a0f896f8386f2f55cad039723d27513ff8646d85d19759"),
    "no-prefix-cache": (70, "566136101097e31eae9796d43bb4fbce0df5251a6fe7655529a29dd890200ee4"),
    "no-chunking": (59, "37ab16cfef9c14fb6ef57f961f1d3bf45f8466757b29ab35f888d1780a628395"),
    "tiny-budget": (159, "ac316b00fdbd52c47a3ce6d5cd6c6838024aec6db4bac29f40e4f384b9b83fa7"),
}


def _make(num_blocks=512, slots=64, prefix=True, chunked=True, budget=48, max_seqs=12) -> Scheduler:
    return Scheduler(
        SchedulerConfig(
            max_num_seqs=max_seqs,
            max_num_batched_tokens=budget,
            enable_chunked_prefill=chunked,
            max_model_len=120,
        ),
        CacheConfig(
            block_size=4,
            num_blocks=num_blocks,
            num_state_slots=slots,
            enable_prefix_caching=prefix,
            checkpoint_interval=16,
        ),
    )


def _canon(out: SchedulerOutput) -> str:
    s = [(r.req_id, r.token_ids, r.start, r.block_ids, r.slot, r.is_new, r.sample) for r in out.scheduled]
    copies = (out.block_copies, out.state_copies, out.state_zeros, out.snapshots, out.snapshot_block_copies)
    return repr((s, copies, out.preempted, out.tier_ops))


def _sample(req_id: str, token_ids: list[int]) -> int:
    """A deterministic 'model': the next token from the request's last tokens."""
    return (sum(token_ids[-3:]) * 31 + len(token_ids) + len(req_id)) % 97


def run_trace(name: str) -> tuple[int, str]:
    """Drive the workload; returns (number of steps, sha256 over every output)."""
    sched = _make(**CONFIGS[name])
    rng = random.Random(12)
    shared = [rng.randrange(2, 97) for _ in range(41)]
    pending = []
    for i in range(14):
        prompt = shared[: rng.randrange(5, 41)] + [rng.randrange(2, 97) for _ in range(rng.randrange(1, 30))]
        sp = SamplingParams(
            temperature=0,
            max_tokens=rng.randrange(1, 40),
            min_tokens=rng.choice([0, 0, 3]),
            stop_token_ids=tuple(rng.sample(range(2, 97), 6)) if i % 3 == 0 else (),
            ignore_eos=i % 5 == 0,
        )
        pending.append((rng.randrange(0, 30), make_request(f"q{i}", prompt, sp, eos_token_ids=(EOS,))))
    h = hashlib.sha256()
    turns: dict[str, int] = {}
    step = 0
    while pending or sched.has_unfinished:
        for item in [x for x in pending if x[0] <= step]:
            pending.remove(item)
            sched.add(item[1])
        if step == 17 and "q4" in sched.requests:
            sched.abort(["q4"])
        out = sched.schedule()
        h.update(_canon(out).encode())
        sampled = {
            s.req_id: _sample(s.req_id, sched.requests[s.req_id].token_ids) for s in out.scheduled if s.sample
        }
        for req in sched.update(out, sampled):
            h.update(f"{req.request_id}:{req.status.value}:{req.stop_reason}".encode())
            base = req.request_id.split("/")[0]
            turns[base] = turns.get(base, 0) + 1
            if turns[base] < 3 and req.num_tokens < 90:  # the next agent turn re-sends the transcript
                nxt = req.token_ids + [rng.randrange(2, 97) for _ in range(rng.randrange(1, 9))]
                sp = SamplingParams(temperature=0, max_tokens=rng.randrange(1, 12))
                pending.append(
                    (step + 1, make_request(f"{base}/{turns[base]}", nxt, sp, eos_token_ids=(EOS,)))
                )
        step += 1
        if step > 5000:
            raise AssertionError("the workload did not finish")
    sched.cache.check_invariants()
    h.update(
        repr((sched.num_preemptions, sched.cached_tokens_admitted, sched.prompt_tokens_admitted)).encode()
    )
    return step, h.hexdigest()


@pytest.mark.parametrize("name", list(CONFIGS))
def test_outputs_equal_recorded_reference(name):
    assert run_trace(name) == RECORDED[name]


if __name__ == "__main__":
    for n in CONFIGS:
        print(f'    "{n}": {run_trace(n)},')
