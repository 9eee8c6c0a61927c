"""`TextStops`: the streamed text of a request with stop strings, checked against a plain model of
the rule (the whole text kept, searched from the start every step) over random outputs, and the
one-token detokenizer path against the general one."""

from __future__ import annotations

import random

import pytest

from inference.engine.request import Request, RequestStatus, SamplingParams
from inference.engine.stops import TextStops
from inference.tokenizer import ByteTokenizer
from inference.tokenizer.detok import make_detokenizer


def _model(pieces: list[str], stops: tuple[str, ...]) -> tuple[str, str | None]:
    """What must stream in all: the text up to the earliest stop string, and that string."""
    text = "".join(pieces)
    hits = [(i, s) for s in stops if (i := text.find(s)) >= 0]
    if not hits:
        return text, None
    i, s = min(hits)
    return text[:i], s


def _stream(
    tok: ByteTokenizer, ids: list[int], stops: tuple[str, ...], chunk: int
) -> tuple[list[str], str | None]:
    req = Request("r", [1], SamplingParams(stop=stops, max_tokens=len(ids) + 1))
    ts = TextStops(tok, req)
    out = []
    for i in range(0, len(ids), chunk):
        last = i + chunk >= len(ids)
        text, stop_now = ts.step(req, ids[i : i + chunk], last)
        out.append(text)
        if stop_now or ts.stopped is not None:
            break
    return out, ts.stopped


@pytest.mark.parametrize("chunk", [1, 3])
def test_streamed_text_stops_at_the_earliest_stop_string_over_long_outputs(chunk):
    tok = ByteTokenizer()
    rng = random.Random(chunk)
    for trial in range(300):
        # a small alphabet so stop strings occur, often late (the kept text is trimmed as it goes)
        n = rng.randrange(1, 400)
        ids = [rng.choice(b"abcd ") for _ in range(n)]
        stops = tuple(
            "".join(rng.choice("abcd ") for _ in range(rng.randrange(1, 7)))
            for _ in range(rng.randrange(1, 3))
        )
        pieces, stopped = _stream(tok, ids, stops, chunk)
        want, want_stop = _model([bytes(ids).decode()], stops)
        got = "".join(pieces)
        assert (got, stopped) == (want, want_stop), (trial, ids, stops)
        for s in stops:
            assert s not in got


def test_without_stop_strings_every_piece_streams_at_once():
    tok = ByteTokenizer()
    req = Request("r", [1], SamplingParams(max_tokens=10))
    ts = TextStops(tok, req)
    assert [ts.step(req, [b], False)[0] for b in b"hello"] == list("hello")
    # a split UTF-8 character is held until it completes
    e = "é".encode()
    assert ts.step(req, [e[0]], False)[0] == "" and ts.step(req, [e[1]], False)[0] == "é"


def test_a_stop_token_is_never_text():
    tok = ByteTokenizer()
    req = Request("r", [1], SamplingParams(max_tokens=10))
    ts = TextStops(tok, req)
    req.status = RequestStatus.FINISHED_STOPPED
    assert ts.step(req, [ord("o"), ord("k"), tok.eos_token_ids[0]], True) == ("ok", False)


@pytest.mark.parametrize("skip", [True, False])
def test_one_token_detokenizer_path_equals_the_general_one(skip):
    tok = ByteTokenizer()
    rng = random.Random(7)
    ids = [rng.randrange(tok.vocab_size) for _ in range(500)] + list("✓ done".encode())
    one, many = (
        make_detokenizer(tok, skip_special_tokens=skip),
        make_detokenizer(tok, skip_special_tokens=skip),
    )
    got = "".join(one.push([t]) for t in ids) + one.flush()
    want = "".join(many.push(iter([t])) for t in ids) + many.flush()  # an iterator: the general path
    assert got == want
