"""Where the outbox relay stands: pure bookkeeping of event ids (no database, no broker).

Event ids come from a sequence, so they are handed out in order but become visible in commit
order: a reader can see id 12 while id 11 belongs to a transaction still running (it will
appear later) or to one that rolled back (it never will). The cursor publishes in id order and
remembers each id it skipped over as a *hole*, with the snapshot it was first missing from.
A hole is given up once no transaction that was running then is still running (the snapshot's
`xmax` is at or below a later snapshot's `xmin`): whoever held that id has finished, and had
it committed, the later snapshot, which looked for it, would have seen the row.

That rule needs the transaction holding an id to have its transaction id (xid) before it draws
the event id, i.e. to have written something first: every writer of `events` updates or inserts
the task row earlier in the same transaction (`tasks.writer`, `tasks.create`).

A transaction left open elsewhere (any session holding back the snapshot's `xmin`) keeps the
holes drawn since it began, and with them the mark, where they are: publishing goes on, but a
restarted relay would send those events again. Each missing id is one entry until then.

`low_water` is what the relay persists: every id below it is published or never committed.
A restarted relay starts there and republishes what lay between it and the old frontier
(delivery is at-least-once; `(task_id, seq)` is the consumer's dedupe key).
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class OutboxCursor:
    frontier: int  # the highest id published (or skipped as a hole) so far
    holes: dict[int, int] = field(default_factory=dict)  # id -> xmax of the snapshot that missed it

    @classmethod
    def starting_at(cls, low_water: int) -> OutboxCursor:
        return cls(frontier=low_water - 1)

    @property
    def low_water(self) -> int:
        """Every id below this is published or will never be committed."""
        return min(self.holes) if self.holes else self.frontier + 1

    def advance(self, new_ids: list[int], late_ids: list[int], xmin: int, xmax: int) -> None:
        """Record one read, made in one snapshot (`xmin`, `xmax`): `new_ids` (ascending) are the
        ids above the frontier it returned, `late_ids` the holes it found filled. Call it once
        what it returned is published. A database whose readers never see a later commit's id
        below an earlier one (SQLite: one writer at a time, ids drawn inside its write lock)
        passes `xmin == xmax`: nothing is running that could fill a hole."""
        for i in late_ids:
            self.holes.pop(i, None)
        # Holes the earlier reads left that no running transaction can fill any more. (Before
        # the new holes are added: those are missing from this very snapshot.)
        self.holes = {i: x for i, x in self.holes.items() if x > xmin}
        expect = self.frontier + 1
        for i in new_ids:
            if i < expect:
                raise ValueError(f"event ids must ascend past the frontier {self.frontier}: got {i}")
            for missing in range(expect, i):
                if xmin < xmax:  # some transaction was running: it may still commit this id
                    self.holes[missing] = xmax
            expect = i + 1
        self.frontier = expect - 1
