"""The context policy is chosen in the task's budget, validated, and shown by task GET."""

from __future__ import annotations

from tests.orchestrator.api.conftest import Api


def test_context_policy_in_the_budget(api: Api):
    body = {
        "goal": "read the contract",
        "budget": {"max_context_tokens": 4096, "context_policy": "trim_tool_results"},
    }
    r = api.client.post("/v1/tasks", json=body, headers=api.h())
    assert r.status_code == 201, r.text
    t = api.client.get(f"/v1/tasks/{r.json()['id']}", headers=api.h()).json()
    assert t["limits"]["max_context_tokens"] == 4096 and t["limits"]["context_policy"] == "trim_tool_results"
    # a cap alone: the policy is `fail`
    r = api.client.post(
        "/v1/tasks", json={"goal": "g", "budget": {"max_context_tokens": 4096}}, headers=api.h()
    )
    t = api.client.get(f"/v1/tasks/{r.json()['id']}", headers=api.h()).json()
    assert t["limits"]["context_policy"] == "fail"
    # no cap: none shown
    r = api.client.post("/v1/tasks", json={"goal": "g"}, headers=api.h())
    t = api.client.get(f"/v1/tasks/{r.json()['id']}", headers=api.h()).json()
    assert t["limits"]["max_context_tokens"] is None and t["limits"]["context_policy"] is None
    for bad in (
        {"context_policy": "fail"},  # a policy needs a cap
        {"max_context_tokens": 4096, "context_policy": "drop_everything"},
        {"max_context_tokens": 10},
    ):
        r = api.client.post("/v1/tasks", json={"goal": "g", "budget": bad}, headers=api.h())
        assert r.status_code == 422, (bad, r.text)
