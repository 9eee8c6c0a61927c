"""Load shedding at the inference server's front door (issue 39, item 8): past the slots and
the bounded queue a request is answered 429 + Retry-After before it is read or tokenized; the
requests already admitted finish as they would have; probes are never shed."""

from __future__ import annotations

import json
import threading
import time

import httpx
import pytest
import torch

from inference.embedded import EMBEDDED_ENGINE_CONFIG
from inference.engine.factory import build_engine
from inference.server.guard import Guard, ServerLimits
from inference.server.serve import BackgroundServer

MODEL = "tiny"


@pytest.fixture(scope="module")
def server():
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    cfg = EMBEDDED_ENGINE_CONFIG.evolve(max_model_len=512, num_blocks=256, checkpoint_interval=64)
    limits = ServerLimits(max_in_flight=1, max_queue=1, max_queue_wait_s=60)
    srv = BackgroundServer(build_engine(engine_config=cfg), model_name=MODEL, limits=limits)
    with srv, httpx.Client(base_url=srv.url, timeout=60) as client:
        yield srv, client
    torch.set_num_threads(n)


def _body(max_tokens: int, stream: bool) -> dict:
    return {
        "model": MODEL,
        "messages": [{"role": "user", "content": "hello"}],
        "max_tokens": max_tokens,
        "temperature": 0,
        "ignore_eos": True,
        "stream": stream,
    }


def _door(srv: BackgroundServer):
    node = srv.app.middleware_stack
    while not isinstance(node, Guard):
        node = node.app
    return node.door


def _wait_until(cond, what: str, timeout_s: float = 60.0) -> None:
    end = time.monotonic() + timeout_s
    while not cond():
        assert time.monotonic() < end, f"timed out waiting for {what}"
        time.sleep(0.01)


def test_over_capacity_is_429_with_retry_after_while_admitted_requests_finish(server):
    srv, client = server
    alone = client.post("/v1/chat/completions", json=_body(24, False)).json()["choices"][0]["message"]
    door = _door(srv)
    queued: list[httpx.Response] = []
    with client.stream("POST", "/v1/chat/completions", json=_body(24, True)) as held:
        assert held.status_code == 200
        lines = held.iter_lines()
        assert next(lines).startswith("data: ")  # admitted and streaming: the one slot is held
        waiter = threading.Thread(
            target=lambda: queued.append(client.post("/v1/chat/completions", json=_body(4, False)))
        )
        waiter.start()
        _wait_until(lambda: door.admission.queued == 1, "the second request to queue")
        shed = client.post("/v1/chat/completions", json=_body(4, False))
        assert shed.status_code == 429, shed.text
        assert shed.headers["Retry-After"].isdigit() and int(shed.headers["Retry-After"]) >= 1
        assert shed.json()["error"]["code"] == "server_overloaded"
        assert client.get("/health").status_code == 200  # probes are never shed
        assert client.get("/metrics").status_code == 200
        text = ""
        for ln in lines:
            if ln.startswith("data: {"):
                ch = json.loads(ln[6:])["choices"]
                text += (ch[0]["delta"].get("content") or "") if ch else ""
    waiter.join(60)
    assert text == alone["content"]  # the admitted stream is untouched by the shedding
    assert [r.status_code for r in queued] == [200]  # the queued one got the slot when it freed
    # Every slot comes back (the server lets go of it just after the response's last byte).
    _wait_until(lambda: (door.admission.in_flight, door.admission.queued) == (0, 0), "the slots to free")


def test_a_dead_engine_is_503_with_retry_after_at_the_door_and_probes_still_answer():
    cfg = EMBEDDED_ENGINE_CONFIG.evolve(max_model_len=512, num_blocks=64, checkpoint_interval=64)
    limits = ServerLimits(max_in_flight=2, max_queue=2)
    srv = BackgroundServer(build_engine(engine_config=cfg), model_name=MODEL, limits=limits)
    with srv, httpx.Client(base_url=srv.url, timeout=60) as client:
        assert client.post("/v1/chat/completions", json=_body(2, False)).status_code == 200
        srv.engine.shutdown()  # the engine thread stops: the server is not ready any more
        _wait_until(lambda: not srv.engine.alive, "the engine to stop")
        r = client.post("/v1/chat/completions", json=_body(2, False))
        assert r.status_code == 503 and r.headers["Retry-After"].isdigit(), r.text
        assert r.json()["error"]["code"] == "engine_unavailable"
        assert client.get("/health").status_code == 503  # the probe answers (and says so)
