"""A REST submission continues the caller's trace, and the task's stored context is the API's
`task.submit` span (so every later span of the task hangs below the request)."""

from __future__ import annotations

from orchestrator.store import get_task
from testing.otel import span_exporter

TRACE = "5b8aa5a2d2c872e8321cf37308d69df2"
CALLER = "051581bf3cb55c13"


def test_rest_submit_is_a_span_of_the_callers_trace(api):
    spans = span_exporter()
    spans.clear()
    r = api.client.post("/v1/tasks", json={"goal": "g"}, headers=api.h(traceparent=f"00-{TRACE}-{CALLER}-01"))
    assert r.status_code == 201, r.text
    task_id = r.json()["id"]
    got = [s for s in spans.get_finished_spans() if f"{s.context.trace_id:032x}" == TRACE]
    by_id = {s.context.span_id: s for s in got}
    (submit,) = [s for s in got if s.name == "task.submit"]
    assert submit.attributes["dayzero.task_id"] == task_id
    # up the chain (FastAPI's HTTP server span, when it makes one) to the caller's span
    top = submit
    while top.parent is not None and top.parent.span_id in by_id:
        top = by_id[top.parent.span_id]
    assert f"{top.parent.span_id:016x}" == CALLER
    with api.engine.connect() as conn:
        stored = get_task(conn, task_id).traceparent
    assert stored.startswith(f"00-{TRACE}-{submit.context.span_id:016x}-")
    (moved,) = [s for s in got if s.name == "task.transition"]
    assert moved.parent.span_id == submit.context.span_id
    assert (moved.attributes["dayzero.from"], moved.attributes["dayzero.to"]) == ("PENDING", "READY")

    # without a caller's context the submission starts the task's own trace
    spans.clear()
    r = api.client.post("/v1/tasks", json={"goal": "h"}, headers=api.h())
    with api.engine.connect() as conn:
        own = get_task(conn, r.json()["id"]).traceparent
    assert own.split("-")[1] != TRACE
    (submit,) = [s for s in spans.get_finished_spans() if s.name == "task.submit"]
    assert own.startswith(f"00-{submit.context.trace_id:032x}-{submit.context.span_id:016x}-")
