"""Where the outbox relay stands: pure bookkeeping of event ids (no database, no broker).

Event ids come from a sequence (CACHE 1: drawn in time order across sessions), so they are
handed out in order but become visible in commit order: a reader can see id 12 while id 11 belongs to a transaction still running (it will
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
restarted relay would send those events again. Holes are kept as ranges (a rolled-back bulk
insert of any size is one), so their bookkeeping and look-ups stay small.

`low_water` is what the relay persists: every id below it is published or never committed.
A restarted relay starts there and republishes what lay between it and the old frontier
(delivery is at-least-once; `(task_id, seq)` is the consumer's dedupe key).
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field


@dataclass(frozen=True, slots=True)
class Hole:
    """Ids `lo..hi` (inclusive) missing from the snapshot whose `xmax` is recorded."""

    lo: int
    hi: int
    xmax: int


@dataclass
class OutboxCursor:
    frontier: int  # the highest id published (or skipped as a hole) so far
    holes: list[Hole] = field(default_factory=list)  # ascending, disjoint

    @classmethod
    def starting_at(cls, low_water: int) -> OutboxCursor:
        return cls(frontier=low_water - 1)

    @property
    def low_water(self) -> int:
        """Every id below this is published or will never be committed."""
        return self.holes[0].lo if self.holes else self.frontier + 1

    def advance(self, new_ids: list[int], late_ids: list[int], xmin: int, xmax: int) -> None:
        """Record one read, made in one snapshot (`xmin`, `xmax`): `new_ids` (ascending) are the
        ids above the frontier it returned, `late_ids` the ids it found filled in the holes. Call
        it once what it returned is published. A database whose readers never see a later
        commit's id below an earlier one (SQLite: one writer at a time, ids drawn inside its
        write lock) passes `xmin == xmax`: nothing is running that could fill a hole."""
        filled = sorted(late_ids)
        kept: list[Hole] = []
        for h in self.holes:
            # Given up when no transaction running at its snapshot is left: what they committed
            # is among `late_ids`, read in this very snapshot.
            if h.xmax <= xmin:
                continue
            lo = h.lo
            for i in filled[bisect.bisect_left(filled, h.lo) : bisect.bisect_right(filled, h.hi)]:
                if i > lo:
                    kept.append(Hole(lo, i - 1, h.xmax))
                lo = i + 1
            if lo <= h.hi:
                kept.append(Hole(lo, h.hi, h.xmax))
        expect = self.frontier + 1
        for i in new_ids:
            if i < expect:
                raise ValueError(f"event ids must ascend past the frontier {self.frontier}: got {i}")
            if i > expect and xmin < xmax:  # some transaction was running: it may still commit these
                kept.append(Hole(expect, i - 1, xmax))
            expect = i + 1
        self.holes = kept
        self.frontier = expect - 1
