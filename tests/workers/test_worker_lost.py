"""A tool job whose whole worker is SIGKILLed fails its attempt as `worker_lost` within seconds
and is retried by the orchestrator's policy (issue 39): before, the runner waited out the tool's
whole timeout (600 s here; the test's own limit is far below it)."""

from __future__ import annotations

import threading

import pytest

from orchestrator.store import get_task, list_attempts
from testing.celery_test_app import VISIBILITY_ENV
from tests.orchestrator.conftest import model_server, submit  # noqa: F401 - model_server is a fixture
from tests.workers.conftest import kill_group, wait_for
from tests.workers.test_late_duplicate import _start_tools_worker, runner_over_celery


@pytest.mark.timeout(150)
def test_a_sigkilled_worker_is_noticed_and_the_step_retried(
    worker_env,
    pg_url,
    model_server,  # noqa: F811
    tmp_path,
    monkeypatch,
):
    state = tmp_path / "state"
    state.mkdir()
    monkeypatch.setenv("DAYZERO_TEST_STATE_DIR", str(state))
    # Redis would redeliver the dead worker's message only after this (as in production, where it
    # is over an hour): the retry here comes from the runner noticing the loss.
    monkeypatch.setenv(VISIBILITY_ENV, "900")
    runs = state / "sleepy.log"
    second = None
    with runner_over_celery(pg_url, model_server.url, worker_env.prefix) as (db, runner):
        first, _ = _start_tools_worker(worker_env, "first", pg_url, state)
        try:
            tid = submit(db, {"cycles": 1, "tool": "sleepy", "args": {"sleep_s": 600}})
            driver = threading.Thread(target=runner.run_until_idle, kwargs={"timeout_s": 140}, daemon=True)
            driver.start()
            wait_for(runs.exists, 60, "the first attempt to start")
            kill_group(first)  # the main process and its pool child at once, mid-tool
            second, _ = _start_tools_worker(worker_env, "second", pg_url, state)
            driver.join(140)
            assert not driver.is_alive(), "the runner still waits for the dead worker's job"
            with db.connect() as conn:
                assert get_task(conn, tid).status == "SUCCEEDED"
                tool_attempts = [a for a in list_attempts(conn, tid) if a.step_index == 1]
            assert [(a.attempt, a.status) for a in tool_attempts] == [(1, "FAILED"), (2, "SUCCEEDED")]
            assert tool_attempts[0].error["code"] == "worker_lost"
            assert runs.read_text().splitlines() == [f"{tid}:1:1", f"{tid}:1:2"]
        finally:
            kill_group(first)
            if second is not None:
                kill_group(second)
