"""Every stop rule of a request, decided here and nowhere else.

Token rules (`token_stop`, called by the scheduler right after a token is sampled, so a stopped
request frees its blocks before the next step): end-of-sequence and `stop_token_ids` (both only
after `min_tokens`), then `max_tokens` and the context length. Text rules (`TextStops`, called by
the engine as it detokenises): the earliest `stop` string ends the output just before it; text that
could still become a stop string is held back from the stream until it cannot.
"""

from __future__ import annotations

from collections.abc import Sequence

from inference.engine.request import Request, RequestStatus
from inference.tokenizer import Tokenizer, make_detokenizer


def token_stop(req: Request, tok: int, max_model_len: int) -> RequestStatus | None:
    """The status `req` ends with after sampling `tok` (already appended), or None to go on.
    Sets `req.stop_reason` for a stop token id."""
    sp = req.sampling
    num_output = len(req.output_token_ids)  # read once: this runs per running request per step
    if num_output >= sp.min_tokens:
        if not sp.ignore_eos and tok in req.eos_token_ids:
            return RequestStatus.FINISHED_STOPPED
        if tok in sp.stop_token_ids:
            req.stop_reason = tok
            return RequestStatus.FINISHED_STOPPED
    if num_output >= sp.max_tokens or len(req.token_ids) >= max_model_len:
        return RequestStatus.FINISHED_LENGTH
    return None


class TextStops:
    """Detokenises one request's output and applies its stop strings (held back while partial)."""

    def __init__(self, tokenizer: Tokenizer, req: Request) -> None:
        self.detok = make_detokenizer(tokenizer, skip_special_tokens=req.sampling.skip_special_tokens)
        self.stops = req.sampling.stop
        self.hold = max((len(s) for s in self.stops), default=1) - 1
        self.text = ""
        self.sent = 0
        self.stopped: str | None = None  # the stop string that ended the output

    def push(self, ids: Sequence[int], final: bool) -> str:
        """Text to stream for these new token ids (`final`: the request ended by a token rule)."""
        piece = self.detok.push(ids) if ids else ""
        if final:
            piece += self.detok.flush()
        if not self.stops:  # nothing is held back: the text streams as it comes
            return piece
        self.text += piece
        if self.stopped is None:
            start = max(0, self.sent - self.hold)
            hits = [(i, s) for s in self.stops if (i := self.text.find(s, start)) >= 0]
            if hits:
                i, s = min(hits)
                self.text, self.stopped = self.text[:i], s
                final = True
        end = len(self.text) if final else max(self.sent, len(self.text) - self.hold)
        out, self.sent = self.text[self.sent : end], end
        # keep only what a stop string can still start in (the last `hold` sent characters and
        # what is held back): a long output must not cost a copy of all its text every step
        if (drop := self.sent - self.hold) > 0:
            self.text, self.sent = self.text[drop:], self.hold
        return out

    def step(self, req: Request, new_ids: Sequence[int], finished: bool) -> tuple[str, bool]:
        """This step's text, and whether a stop string ends the request now (it did not already
        end by a token rule). The stop/eos token itself is never text; a stop string overrides a
        length finish in the same step (the output did stop there)."""
        ids = (
            new_ids[:-1] if finished and req.status == RequestStatus.FINISHED_STOPPED and new_ids else new_ids
        )
        text = self.push(ids, final=finished)
        if self.stopped is not None and finished:
            req.status, req.stop_reason = RequestStatus.FINISHED_STOPPED, self.stopped
        return text, self.stopped is not None and not finished
