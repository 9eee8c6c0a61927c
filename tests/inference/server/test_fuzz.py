"""schemathesis against the inference server's OpenAPI (issue 15): valid and invalid bodies for
every route, with a tiny model behind the real server, while greedy streaming requests run
beside the fuzzing. No 5xx; every answer is a documented status and content type; and every
stream beside it finishes with exactly the tokens it produces alone.

Bounded: a few dozen examples per operation, no shrinking, contexts of at most 128 tokens."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator

import httpx
import pytest
import schemathesis
import torch
from hypothesis import HealthCheck, Phase, settings
from schemathesis import GenerationMode
from schemathesis.specs.openapi.checks import positive_data_acceptance

from inference.embedded import EMBEDDED_ENGINE_CONFIG
from inference.engine.factory import build_engine
from inference.server.guard import ServerLimits
from inference.server.serve import BackgroundServer

KEY = "sk-fuzz"
AUTH = {"Authorization": f"Bearer {KEY}"}
LONG = {
    "model": "tiny",
    "messages": [{"role": "user", "content": "tell me a long story"}],
    "max_tokens": 100,
    "temperature": 0,
    "ignore_eos": True,
    "stream": True,
}


def _stream(client: httpx.Client) -> list[str]:
    deltas = []
    with client.stream("POST", "/v1/chat/completions", json=LONG) as s:
        assert s.status_code == 200, s.read()
        for ln in s.iter_lines():
            if ln.startswith("data: {"):
                for ch in json.loads(ln[6:])["choices"]:
                    deltas.append(ch["delta"].get("content") or "")
            elif ln == "data: [DONE]":
                deltas.append("[DONE]")
    return deltas


class Beside(threading.Thread):
    """Streams LONG again and again while the fuzzing runs; compares each to the lone run."""

    def __init__(self, url: str, want: list[str]) -> None:
        super().__init__(daemon=True)
        self.url, self.want = url, want
        self.stop = threading.Event()
        self.intact = 0
        self.broken: list[object] = []

    def run(self) -> None:
        with httpx.Client(base_url=self.url, timeout=120, headers=AUTH) as client:
            while not self.stop.is_set():
                try:
                    got = _stream(client)
                except Exception as exc:  # any failure of a stream beside the fuzzing is a finding
                    self.broken.append(exc)
                    continue
                if got == self.want:
                    self.intact += 1
                else:
                    self.broken.append(got)


STATE: dict[str, Beside] = {}


@pytest.fixture(scope="module")
def server_schema() -> Iterator[schemathesis.BaseSchema]:
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    cfg = EMBEDDED_ENGINE_CONFIG.evolve(max_model_len=128, num_blocks=128, checkpoint_interval=64)
    srv = BackgroundServer(
        build_engine(engine_config=cfg),
        model_name="tiny",
        limits=ServerLimits(
            api_key=KEY, max_body_bytes=4 * 1024 * 1024
        ),  # above any generated body: limits are test_hostile's
    )
    with srv:
        with httpx.Client(base_url=srv.url, timeout=120, headers=AUTH) as client:
            want = _stream(client)  # alone
        beside = Beside(srv.url, want)
        beside.start()
        STATE["beside"] = beside
        loaded = schemathesis.openapi.from_url(f"{srv.url}/openapi.json")
        loaded.config.generation.update(modes=[GenerationMode.POSITIVE, GenerationMode.NEGATIVE])
        try:
            yield loaded
        finally:
            beside.stop.set()
            beside.join(120)
    torch.set_num_threads(n)


schema = schemathesis.pytest.from_fixture("server_schema")


@schema.auth()
class KeyAuth:
    def get(self, case, ctx):
        return AUTH["Authorization"]

    def set(self, case, data, ctx):
        case.headers = {**(case.headers or {}), "Authorization": data}


@schema.parametrize()
@settings(
    max_examples=40,
    deadline=None,
    derandomize=True,
    phases=[Phase.explicit, Phase.generate],
    suppress_health_check=list(HealthCheck),
)
def test_server_conforms_to_its_openapi(case):
    # Every check but "a schema-valid request is accepted": JSON Schema cannot say the semantic
    # limits (the context length, the vocabulary, min_tokens <= max_tokens, a tool_choice naming
    # an offered tool, a user message with content), and the server answers those with a 400
    # that names the parameter, as it should.
    case.call_and_validate(timeout=120, excluded_checks=[positive_data_acceptance])


def test_streams_beside_the_fuzzing_finished_intact():
    beside = STATE["beside"]
    beside.stop.set()
    beside.join(120)
    assert beside.broken == []
    assert beside.intact >= 1
