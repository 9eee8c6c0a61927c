"""A symbolic executor for scheduler tests: KV slots hold (position, token), a state slot holds
the exact token prefix it summarises, and the "model" picks the next token from that prefix.
Every read is checked, so a wrong block table, a stale slot or a bad checkpoint fails loudly."""

from __future__ import annotations

from inference.engine.scheduler import Scheduler, SchedulerOutput

GARBAGE = ("garbage",)


class SymbolicExecutor:
    """`transfer_delay`: steps a promotion from a tier takes; its targets read as garbage until
    then, so a request scheduled before its blocks arrive fails."""

    def __init__(self, sched: Scheduler, vocab: int = 97, transfer_delay: int = 1) -> None:
        cfg = sched.cache.config
        self.sched = sched
        self.B = cfg.block_size
        self.vocab = vocab
        self.kv = [[None] * cfg.block_size for _ in range(cfg.num_blocks)]
        self.state: list[tuple] = [GARBAGE] * cfg.num_state_slots
        self.tables: dict[str, list[int]] = {}
        self.steps = 0
        self.tier: dict[tuple[int, int, int], object] = {}  # (tier, kind, loc) -> contents
        self.transfer_delay = transfer_delay
        self.in_flight: list[tuple[int, object]] = []  # (step it lands, transfer)
        self.loaded: list[int] = []  # transfer ids landed, reported before the next schedule

    def _tier_ops(self, ops) -> None:
        from inference.cache.tiers import BLOCK, DISK, HOST, Drop, Move, Store

        for op in ops.ops:
            if isinstance(op, Store):
                src = self.kv[op.gpu] if op.kind == BLOCK else self.state[op.gpu]
                assert src is not GARBAGE and (op.kind != BLOCK or None not in src[:1]), (
                    f"stored garbage {op}"
                )
                self.tier[(op.tier, op.kind, op.loc)] = list(src) if op.kind == BLOCK else src
            elif isinstance(op, Move):
                self.tier[(DISK, op.kind, op.dst)] = self.tier[(HOST, op.kind, op.src)]
            elif isinstance(op, Drop):
                del self.tier[(DISK, op.kind, op.loc)]

    def _start(self, ops) -> None:
        from inference.cache.tiers import BLOCK

        for tr in ops.transfers:
            for ld in tr.loads:  # unreadable until it lands
                if ld.kind == BLOCK:
                    self.kv[ld.gpu] = [None] * self.B
                else:
                    self.state[ld.gpu] = GARBAGE
            self.in_flight.append((self.steps + self.transfer_delay, tr))

    def _land(self) -> None:
        from inference.cache.tiers import BLOCK

        left = []
        for when, tr in self.in_flight:
            if when > self.steps:
                left.append((when, tr))
                continue
            for ld in tr.loads:
                data = self.tier[(ld.tier, ld.kind, ld.loc)]
                if ld.kind == BLOCK:
                    self.kv[ld.gpu] = list(data)
                else:
                    self.state[ld.gpu] = data
            self.loaded.append(tr.id)
        self.in_flight = left

    def next_token(self, prefix: tuple[int, ...]) -> int:
        return hash(prefix) % self.vocab

    def execute(self, out: SchedulerOutput) -> dict[str, int]:
        self.steps += 1
        if out.tier_ops is not None:
            self._tier_ops(out.tier_ops)
        for src, dst in out.block_copies:
            self.kv[dst] = list(self.kv[src])
        for src, dst in out.state_copies:
            assert self.state[src] is not GARBAGE
            self.state[dst] = self.state[src]
        if out.tier_ops is not None:
            self._start(out.tier_ops)
        for slot in out.state_zeros:
            self.state[slot] = ()
        for rid in out.preempted:
            self.tables.pop(rid, None)
        sampled = {}
        for s in out.scheduled:
            toks = self.sched.requests[s.req_id].token_ids
            table = list(s.block_ids) if s.is_new else self.tables[s.req_id] + list(s.block_ids)
            self.tables[s.req_id] = table
            assert self.state[s.slot] == tuple(toks[: s.start]), f"{s.req_id}: wrong state at {s.start}"
            for pos in range(s.start):
                assert self.kv[table[pos // self.B]][pos % self.B] == (pos, toks[pos]), (
                    f"{s.req_id}: bad KV {pos}"
                )
            assert tuple(toks[s.start : s.start + len(s.token_ids)]) == s.token_ids
            for pos in range(s.start, s.start + len(s.token_ids)):
                self.kv[table[pos // self.B]][pos % self.B] = (pos, toks[pos])
            self.state[s.slot] = tuple(toks[: s.start + len(s.token_ids)])
            if s.sample:
                sampled[s.req_id] = self.next_token(self.state[s.slot])
        for src, dst in out.snapshots:
            self.state[dst] = self.state[src]
        for src, dst in out.snapshot_block_copies:
            self.kv[dst] = list(self.kv[src])
        return sampled

    def run(self, max_steps: int = 100000) -> list:
        finished = []
        while self.sched.has_unfinished and max_steps:
            self._land()
            self.sched.transfers_done(self.loaded)
            self.loaded = []
            out = self.sched.schedule()
            sampled = self.execute(out)
            finished += self.sched.update(out, sampled)
            self.sched.cache.check_invariants()
            max_steps -= 1
        for r in finished:
            self.tables.pop(r.request_id, None)
        return finished


def reference_output(
    prompt: list[int], max_tokens: int, vocab: int = 97, eos: tuple[int, ...] = ()
) -> list[int]:
    toks = list(prompt)
    out = []
    for _ in range(max_tokens):
        t = hash(tuple(toks)) % vocab
        out.append(t)
        toks.append(t)
        if t in eos:
            break
    return out


def checkpoint_positions(
    prompt_len: int,
    hit: int,
    final_len: int,
    block: int,
    interval: int,
    message_ends: tuple[int, ...] = (),
    *,
    budget: int,
) -> set[int]:
    """The checkpoint rule (coordinator docstring), written independently of the coordinator:
    positions a normally finished request left a state checkpoint at (beyond its own hit).
    `budget`: the scheduler's max_num_batched_tokens (a prompt resumed from a hit whose rest fits
    in one step is computed in one step: no interval or in-prompt checkpoints before its end)."""
    computed = final_len - 1  # the last sampled token is never fed back
    one_step = hit > 0 and prompt_len - hit <= budget
    pos = {
        p for p in range(interval, computed + 1, interval) if p > hit and not (one_step and p < prompt_len)
    }
    pos.add(prompt_len)  # end of the prompt
    pos.add(computed)  # end of the generation
    last_boundary = (prompt_len - 1) // block * block  # the prompt's last full block, for a repeat
    if not one_step:
        pos |= {p for p in (last_boundary, *message_ends) if hit < p < prompt_len}
    return pos


def expected_hit(tokens: list[int], history: list[tuple[list[int], set[int]]]) -> int:
    """Deepest checkpoint position p <= len(tokens) - 1 left by a request sharing tokens[:p]."""
    best = 0
    for prev, positions in history:
        for p in positions:
            if best < p <= len(tokens) - 1 and prev[:p] == tokens[:p]:
                best = p
    return best
