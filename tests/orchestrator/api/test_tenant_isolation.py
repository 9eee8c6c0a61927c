"""A tenant never sees another tenant's task or attachment: 404 on every endpoint, never 403."""

from __future__ import annotations

from tests.orchestrator.api.conftest import Api


def test_every_endpoint_hides_other_tenants(api: Api):
    mine = api.client.post(
        "/v1/tasks", json={"goal": "secret", "metadata": {"k": "v"}}, headers=api.h("acme")
    ).json()
    att = api.client.post(
        "/v1/attachments",
        content=b"\x89PNG\r\n\x1a\n....",
        headers=api.h("acme", **{"content-type": "image/png"}),
    ).json()
    tid, spy = mine["id"], api.h("globex")

    assert api.client.get(f"/v1/tasks/{tid}", headers=spy).status_code == 404
    assert api.client.post(f"/v1/tasks/{tid}/cancel", headers=spy).status_code == 404
    assert api.client.get(f"/v1/tasks/{tid}/events", headers=spy).status_code == 404
    assert api.client.get(f"/v1/attachments/{att['id']}", headers=spy).status_code == 404
    assert api.client.get("/v1/tasks", headers=spy).json()["items"] == []
    assert api.client.get("/v1/tasks", params={"metadata": "k=v"}, headers=spy).json()["items"] == []
    # someone else's upload cannot be attached to my task
    r = api.client.post(
        "/v1/tasks", json={"goal": "x", "attachments": [{"upload_id": att["id"]}]}, headers=spy
    )
    assert r.status_code == 404
    # 404 bodies are identical for "missing" and "someone else's": ids do not leak
    missing = api.client.get("/v1/tasks/00000000-0000-0000-0000-000000000000", headers=spy).json()
    theirs = api.client.get(f"/v1/tasks/{tid}", headers=spy).json()
    assert {k: v for k, v in missing.items() if k != "instance"} == {
        k: v for k, v in theirs.items() if k != "instance"
    }

    # the owner still sees everything, and the spy's cancel did nothing
    got = api.client.get(f"/v1/tasks/{tid}", headers=api.h("acme")).json()
    assert got["status"] == "READY" and not got["cancel_requested"]
    assert [t["id"] for t in api.client.get("/v1/tasks", headers=api.h("acme")).json()["items"]] == [tid]
    assert api.client.get(f"/v1/attachments/{att['id']}", headers=api.h("acme")).status_code == 200


def test_same_idempotency_key_in_two_tenants_never_collides(api: Api):
    a = api.client.post(
        "/v1/tasks", json={"goal": "a"}, headers=api.h("acme", **{"Idempotency-Key": "k"})
    ).json()
    b = api.client.post("/v1/tasks", json={"goal": "b"}, headers=api.h("globex", **{"Idempotency-Key": "k"}))
    assert b.status_code == 201 and b.json()["id"] != a["id"]


def test_revoked_key_is_rejected(api: Api):
    from orchestrator.auth import create_api_key, revoke_api_key

    with api.engine.begin() as conn:
        k = create_api_key(conn, "initech")
    h = {"Authorization": f"Bearer {k.key}"}
    with api.engine.begin() as conn:
        assert revoke_api_key(conn, k.id)
    assert api.client.get("/v1/tasks", headers=h).status_code == 401
    tampered = {"Authorization": f"Bearer {api.keys['acme'][:-2]}xx"}
    assert api.client.get("/v1/tasks", headers=tampered).status_code == 401
