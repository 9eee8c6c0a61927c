"""Big tool results by reference (the history row holds a blob reference, the model the text) and
the per-task context policy (`fail` with a typed `context_exceeded`, or `trim_tool_results`)."""

from __future__ import annotations

import itertools
import json

import pytest
from sqlalchemy import select

from orchestrator.db.tables import events_t
from orchestrator.runner.payloads import (
    ContextExceeded,
    apply_context_policy,
    referenced_sha,
    trimmed_notice,
)
from orchestrator.store import get_task, list_messages
from tests.orchestrator.conftest import submit


def test_big_tool_results_are_stored_by_reference_and_the_model_sees_the_text(
    db, make_runner, model_server, tmp_path
):
    # every tool attempt fails once and is parked: each later turn is driven after a new claim,
    # by a runner that did not write the result (a fresh process's cache reads it from the store)
    task_id = submit(db, {"cycles": 3, "tool": "flaky", "args": {"fail_times": 1}})
    first = make_runner(local_wait_max_s=0.0, payload_ref_bytes=8)
    first.run_until_idle(timeout_s=60)
    with db.connect() as conn:
        assert get_task(conn, task_id).status == "SUCCEEDED"
        rows = conn.execute(
            select(events_t.c.content).where(events_t.c.task_id == task_id, events_t.c.role == "tool")
        ).all()
    assert len(rows) == 3 and all(referenced_sha(r.content) for r in rows)
    # what the model was sent: the results' text, never a reference
    sent = [r for r in model_server.requests if task_id in json.dumps(r.get("prompt_cache_key"))]
    tool_msgs = [m for r in sent for m in r["messages"] if m.get("role") == "tool"]
    assert tool_msgs and all(isinstance(m["content"], str) and "ok_after" in m["content"] for m in tool_msgs)
    # another runner process (its own cache) reads the texts back once each
    second = make_runner(payload_ref_bytes=8)
    with db.connect() as conn:
        view = second._load(task_id)
    assert [m["content"] for m in view.transcript if m["role"] == "tool"] == [
        m["content"] for m in tool_msgs[-3:]
    ]
    # content-addressed: each distinct text is read once
    assert second.payloads.loads == len({m["content"] for m in tool_msgs[-3:]})
    with db.connect() as conn:  # the API's transcript shows the reference
        assert any(referenced_sha(m["content"]) for m in list_messages(conn, task_id))


def test_context_policy_fail_is_a_typed_failure(db, make_runner):
    task_id = submit(db, {"cycles": 30, "tool": "echo", "args": {"pad": "z" * 2000}})
    with db.begin() as conn:
        from sqlalchemy import update

        from orchestrator.db.tables import tasks_t

        conn.execute(
            update(tasks_t)
            .where(tasks_t.c.id == task_id)
            .values(max_context_tokens=8000, context_policy="fail")
        )
    make_runner().run_until_idle(timeout_s=60)
    with db.connect() as conn:
        task = get_task(conn, task_id)
    assert task.status == "FAILED"
    assert task.error["kind"] == "context_exceeded" and task.error["max_context_tokens"] == 8000


def test_a_task_claimed_anew_resumes_its_trim_boundary(db, make_runner, model_server):
    """A trimmed task claimed anew every turn (each tool attempt fails once and parks it) sends
    the model the prompts of the same task driven in one claim: the boundary and the previous
    turn's count come back from the task row, not recomputed (other trims: a prompt-cache miss)."""
    script = {"cycles": 10, "tool": "flaky", "args": {"fail_times": 1, "pad": "p" * 1500}}
    policy = {"max_context_tokens": 9000, "context_policy": "trim_tool_results"}
    one_claim = submit(db, script, **policy)
    make_runner(local_wait_max_s=30.0).run_until_idle(timeout_s=120)
    many_claims = submit(db, script, **policy)
    make_runner(local_wait_max_s=0.0).run_until_idle(timeout_s=120)

    def trims(task_id: str) -> list[list[bool]]:
        """Per model request of the task: which of its tool results went as a notice."""
        sent = [r for r in model_server.requests if task_id in json.dumps(r.get("prompt_cache_key"))]
        return [
            ["trimmed by the task" in m["content"] for m in r["messages"] if m.get("role") == "tool"]
            for r in sent
        ]

    with db.connect() as conn:
        assert get_task(conn, one_claim).status == get_task(conn, many_claims).status == "SUCCEEDED"
        stored = get_task(conn, many_claims).context_state
    expected = trims(one_claim)
    assert len(expected) == 11 and any(any(t) for t in expected)  # it did trim
    assert trims(many_claims) == expected
    assert stored["trimmed"] > 0 and stored["known"] is not None


def _transcript(n: int, size: int) -> list[dict]:
    msgs = [{"role": "system", "content": "s"}, {"role": "user", "content": "u"}]
    for i in range(n):
        msgs += [
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [{"id": f"c{i}", "function": {"name": "t"}}],
            },
            {"role": "tool", "tool_call_id": f"c{i}", "content": "r" * size},
        ]
    return msgs


def test_trim_tool_results_trims_the_oldest_first_and_keeps_the_trimmed_objects():
    msgs = _transcript(10, 1000)
    notices: dict = {}
    sent, trimmed = apply_context_policy(
        msgs, cap=6000, policy="trim_tool_results", known=None, trimmed=0, notices=notices
    )
    tools = [i for i, m in enumerate(sent) if m["role"] == "tool"]
    cut = [i for i in tools if sent[i]["content"] == trimmed_notice(1000)]
    assert cut == tools[: len(cut)] and 0 < len(cut) < len(tools)  # a prefix of them, oldest first
    assert sent[tools[-1]]["content"] == "r" * 1000  # the last turn's result never
    assert msgs[tools[0]]["content"] == "r" * 1000  # the transcript itself is untouched
    # the next turn (two more messages): the same notice objects, the boundary never moves back
    more = [*msgs, *_transcript(1, 1000)[2:]]
    sent2, trimmed2 = apply_context_policy(
        more, cap=6000, policy="trim_tool_results", known=(len(sent), 5000), trimmed=trimmed, notices=notices
    )
    assert trimmed2 >= trimmed and all(sent2[i] is sent[i] for i in cut)
    with pytest.raises(ContextExceeded) as err:
        apply_context_policy(msgs, cap=6000, policy="fail", known=None, trimmed=0, notices={})
    assert err.value.error()["kind"] == "context_exceeded"
    # nothing left to trim: it fails as well
    with pytest.raises(ContextExceeded):
        apply_context_policy(
            _transcript(1, 9000), cap=2000, policy="trim_tool_results", known=None, trimmed=0, notices={}
        )
    assert apply_context_policy(msgs, cap=None, policy=None, known=None, trimmed=0, notices={})[0] == msgs


def test_attachment_text_is_read_once_per_runner_process_and_history_rows_stay_small(
    db, make_runner, model_server, tmp_path
):
    """A big text attachment: the history holds its reference (the goal's attachment part), the
    model its text, and the runner reads it from the store once, however many claims the task
    takes (each tool attempt fails once and parks the task); the wire stays incremental across
    claims."""
    from orchestrator.attachments import add_attachment
    from orchestrator.db.tables import messages_t

    blob_url = str(tmp_path / "blobs")
    text = "clause " * 8000  # 56 KB, over the reference threshold
    with db.begin() as conn:
        att = add_attachment(conn, blob_url, "t1", text.encode(), "text/plain", "contract.txt")
    task_id = submit(db, {"cycles": 3, "tool": "flaky", "args": {"fail_times": 1}}, attachment_ids=[att])
    runner = make_runner(local_wait_max_s=0.0, blob_url=blob_url)
    calls: list[list] = []  # the messages of each model call, as the inference client gets them
    chat = runner.inference.chat
    runner.inference.chat = lambda messages, *a, **k: (calls.append(list(messages)), chat(messages, *a, **k))[
        1
    ]
    runner.run_until_idle(timeout_s=60)
    with db.connect() as conn:
        assert get_task(conn, task_id).status == "SUCCEEDED"
        rows = conn.execute(select(messages_t.c.content).where(messages_t.c.task_id == task_id)).all()
    assert rows and max(len(json.dumps(r.content)) for r in rows) < 2048  # no row holds the text
    assert len(calls) >= 4 and runner.transcripts.stats["hit"] >= 2  # claimed again, from its cache
    assert any(text in json.dumps(m["content"]) for m in calls[0] if m["role"] == "user")
    # each call sends the previous call's very message objects again, across claims too: the
    # incremental wire form sends only what is new (`orchestrator.inference_wire`)
    for prev, cur in itertools.pairwise(calls):
        assert len(cur) > len(prev) and all(a is b for a, b in zip(prev, cur, strict=False))
    assert runner.payloads.loads == 1
