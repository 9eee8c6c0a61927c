"""The inference server continues the caller's trace: a server span with the engine's phases
(queue wait, prefill chunks with the prefix-cache hit, decode) as children; and its latency
histograms count every finished request."""

from __future__ import annotations

import re

import httpx
import pytest
import torch

from inference.embedded import EMBEDDED_ENGINE_CONFIG
from inference.engine.factory import build_engine
from inference.server.serve import BackgroundServer
from testing.otel import span_exporter

TRACE_ID = "5b8aa5a2d2c872e8321cf37308d69df2"
PARENT = "051581bf3cb55c13"


@pytest.fixture(scope="module")
def server():
    spans = span_exporter()
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    # Small blocks and checkpoints so a repeated prompt hits the prefix cache.
    cfg = EMBEDDED_ENGINE_CONFIG.evolve(
        max_model_len=512, num_blocks=256, block_size=16, checkpoint_interval=16
    )
    srv = BackgroundServer(build_engine(engine_config=cfg), model_name="tiny")
    with srv, httpx.Client(base_url=srv.url, timeout=30) as client:
        yield client, spans
    torch.set_num_threads(n)


def _metric(text: str, name: str) -> float:
    m = re.search(rf"^{re.escape(name)} ([0-9.e+-]+)$", text, re.M)
    assert m, f"{name} missing"
    return float(m.group(1))


def test_request_spans_continue_the_callers_trace(server):
    client, spans = server
    spans.clear()
    headers = {"traceparent": f"00-{TRACE_ID}-{PARENT}-01"}
    body = {
        "model": "tiny",
        "messages": [{"role": "user", "content": "a prompt long enough to fill a few cache blocks " * 3}],
        "max_tokens": 6,
        "temperature": 0,
        "ignore_eos": True,
    }
    for _ in range(2):  # the second time, the prompt's full blocks come from the prefix cache
        r = client.post("/v1/chat/completions", json=body, headers=headers)
        assert r.status_code == 200, r.text
    got = [s for s in spans.get_finished_spans() if f"{s.context.trace_id:032x}" == TRACE_ID]
    by_id = {s.context.span_id: s for s in got}
    servers = [s for s in got if s.name == "inference.request"]
    assert len(servers) == 2

    def root(s):
        while s.parent is not None and s.parent.span_id in by_id:
            s = by_id[s.parent.span_id]
        return s

    # below the HTTP server span (FastAPI's, when it makes one), in the caller's trace
    assert all(f"{root(s).parent.span_id:016x}" == PARENT for s in servers)
    first, second = servers
    for srv in servers:
        kids = [s for s in got if s.parent is not None and s.parent.span_id == srv.context.span_id]
        names = [s.name for s in kids]
        assert names[:2] == ["inference.prepare", "inference.queue_wait"]
        assert "inference.prefill" in names and names[-1] == "inference.decode"
        assert all(srv.start_time <= k.start_time <= k.end_time <= srv.end_time for k in kids)
        prefill = [k for k in kids if k.name == "inference.prefill"]
        assert (
            sum(k.attributes["dayzero.prefill.tokens"] for k in prefill)
            + srv.attributes["dayzero.prefix_cache.hit_tokens"]
            == srv.attributes["gen_ai.usage.input_tokens"]
        )
        assert srv.attributes["gen_ai.usage.output_tokens"] == 6
        assert srv.attributes["gen_ai.request.model"] == "tiny"
    assert first.attributes["dayzero.prefix_cache.hit"] is False
    assert second.attributes["dayzero.prefix_cache.hit"] is True
    assert second.attributes["gen_ai.usage.cache_read.input_tokens"] > 0

    text = client.get("/metrics").text
    assert _metric(text, "dayzero_inference_time_to_first_token_seconds_count") >= 2
    assert _metric(text, "dayzero_inference_inter_token_latency_seconds_count") >= 10  # 5 gaps each
    assert _metric(text, "dayzero_inference_queue_wait_seconds_count") >= 2
    assert _metric(text, "dayzero_inference_cached_prompt_tokens_total") > 0
    assert _metric(text, 'dayzero_inference_requests_total{outcome="ok"}') >= 2


def test_a_rejected_request_is_an_error_span(server):
    client, spans = server
    spans.clear()
    r = client.post(
        "/v1/chat/completions",
        json={"model": "tiny", "messages": []},
        headers={"traceparent": f"00-{TRACE_ID}-{PARENT}-01"},
    )
    assert r.status_code == 400
    (span,) = [s for s in spans.get_finished_spans() if s.name == "inference.request"]
    assert span.status.status_code.name == "ERROR" and span.attributes["error.type"] == "OpenAIError"
