"""Celery app configuration, task registration, trace hooks and the worker command (no broker)."""

from __future__ import annotations

import argparse
import subprocess
import sys
from types import SimpleNamespace

import pytest
from opentelemetry import context, trace
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from workers import celery_app as ca
from workers import commands, jobs
from workers.telemetry import current_traceparent

TRACEPARENT = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"


@pytest.fixture
def app():
    app = ca.make_celery_app("memory://", "cache+memory://")
    yield app
    app.close()


def test_delivery_and_serialisation_settings(app):
    conf = app.conf
    assert conf.task_acks_late is True and conf.task_reject_on_worker_lost is True
    assert conf.worker_prefetch_multiplier == 1
    assert conf.task_serializer == "json" and conf.result_serializer == "json"
    assert list(conf.accept_content) == ["json"] and list(conf.result_accept_content) == ["json"]
    assert conf.task_publish_retry is False
    assert conf.broker_connection_max_retries is None  # a broker outage is waited out
    assert {q.name for q in conf.task_queues} == {"preprocess", "tools"}
    assert conf.broker_transport_options["visibility_timeout"] >= ca.LONGEST_JOB_S
    assert ca.DEFAULT_VISIBILITY_TIMEOUT_S > ca.TOOLS_HARD_LIMIT_S > ca.PREPROCESS_HARD_LIMIT_S


def test_routing(app):
    router = app.amqp.router
    assert router.route({}, ca.PREPROCESS_TASK)["queue"].name == "preprocess"
    assert router.route({}, ca.RUN_TOOL_TASK)["queue"].name == "tools"


def test_tasks_registered_without_autoretry(app):
    for name in (ca.PREPROCESS_TASK, ca.RUN_TOOL_TASK):
        task = app.tasks[name]
        assert not getattr(task, "autoretry_for", ()), name
        assert task.max_retries == 0
    assert app.tasks[ca.PREPROCESS_TASK].time_limit == ca.PREPROCESS_HARD_LIMIT_S


def test_run_tool_task_calls_jobs_run_tool_lazily_unless_the_attempt_is_stale(app, monkeypatch):
    from workers import fence

    task = app.tasks[ca.RUN_TOOL_TASK]
    monkeypatch.setattr(jobs, "run_tool", lambda payload: {"ok": True, "echo": payload}, raising=False)
    monkeypatch.setattr(fence, "_fence", None)
    monkeypatch.setattr(fence, "_fence_loaded", True)
    assert task({"tool": "x"}) == {"ok": True, "echo": {"tool": "x"}}
    late = task({"tool": "x", "not_after": 1.0})  # the sender stopped waiting long ago
    assert late["ok"] is False and late["error"]["code"] == "stale_attempt"
    monkeypatch.setattr(fence, "_fence", lambda payload: fence.Refusal("superseded"))
    assert task({"tool": "x"})["error"]["error"] == "superseded"


def test_module_level_app_from_env(monkeypatch):
    built = ca.app_from_env(
        {"CELERY_BROKER_URL": "redis://127.0.0.1:1/3", "DAYZERO_CELERY_VISIBILITY_TIMEOUT_S": "42"}
    )
    assert built.conf.broker_url == "redis://127.0.0.1:1/3"
    assert built.conf.result_backend == "redis://127.0.0.1:1/3"
    assert built.conf.broker_transport_options["visibility_timeout"] == 42
    assert ca.app.main == "dayzero"


def test_publish_hook_injects_current_trace():
    headers: dict = {}
    ca.inject_trace_headers(headers=headers)
    assert "traceparent" not in headers  # no current span: nothing invented
    token = context.attach(TraceContextTextMapPropagator().extract({"traceparent": TRACEPARENT}))
    try:
        ca.inject_trace_headers(headers=headers)
        explicit = {"traceparent": "00-11111111111111111111111111111111-2222222222222222-01"}
        ca.inject_trace_headers(headers=explicit)
    finally:
        context.detach(token)
    assert headers["traceparent"] == TRACEPARENT
    assert explicit["traceparent"].startswith("00-1111")  # a caller's own header wins


def test_prerun_hook_attaches_and_postrun_detaches():
    task = SimpleNamespace(request=SimpleNamespace(traceparent=TRACEPARENT, headers=None))
    ca.attach_trace_context(task_id="t1", task=task)
    try:
        # the job runs in a consumer span of the publisher's trace (a child of its span)
        span = trace.get_current_span()
        span_ctx = span.get_span_context()
        assert format(span_ctx.trace_id, "032x") == TRACEPARENT.split("-")[1]
        assert format(span.parent.span_id, "016x") == TRACEPARENT.split("-")[2]
        assert current_traceparent().split("-")[1] == TRACEPARENT.split("-")[1]
    finally:
        ca.detach_trace_context(task_id="t1")
    assert current_traceparent() is None


def _parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    commands.register(parser.add_subparsers(dest="command"))
    return parser.parse_args(argv)


def test_worker_command_arguments():
    args = _parse(["worker", "--queues", "preprocess", "--concurrency", "3"])
    assert args.func is commands.run_worker
    argv = commands.worker_argv(args)
    assert argv[:3] == ["worker", "--queues", "preprocess"]
    assert argv[argv.index("--concurrency") + 1] == "3" and argv[argv.index("--pool") + 1] == "prefork"
    assert commands.worker_argv(_parse(["worker", "-Q", "preprocess,tools"]))[2] == "preprocess,tools"
    with pytest.raises(SystemExit):
        commands.worker_argv(_parse(["worker", "--queues", "gpu"]))


def test_worker_command_needs_a_broker(monkeypatch, capsys):
    monkeypatch.delenv("CELERY_BROKER_URL", raising=False)
    assert commands.run_worker(_parse(["worker"])) == 2
    assert "CELERY_BROKER_URL" in capsys.readouterr().err


def test_command_module_imports_light():
    code = "import sys, workers.commands, preprocess; print(sorted(m for m in ('torch', 'celery', 'cv2') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_pool_children_use_one_thread_each():
    code = (
        "import torch, cv2; from workers.celery_app import one_thread_per_process; "
        "one_thread_per_process(); import os; "
        "print(torch.get_num_threads(), cv2.getNumThreads(), os.environ['OMP_NUM_THREADS'])"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["1", "1", "1"]
