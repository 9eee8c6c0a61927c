"""The producer side and key management from the command line: `dayzero apikey create`,
`dayzero submit --kafka` (picked up by ingest), `dayzero submit` over REST."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

from sqlalchemy import select

from orchestrator.api import create_app
from orchestrator.config import IngressSettings, Settings
from orchestrator.store import tasks_t
from tests.orchestrator.api.live_server import live_server


def _cli(*args: str, env: dict[str, str], stdin: str | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "orchestrator.cli", *args],
        env={**os.environ, **env},
        input=stdin,
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_apikey_create_then_submit_via_kafka_and_rest(
    db, kafka_broker, kafka_settings, make_ingestor, tmp_path
):
    env = {
        "DATABASE_URL": db.url.render_as_string(hide_password=False),
        "KAFKA_BOOTSTRAP_SERVERS": kafka_broker.bootstrap,
        "DAYZERO_KAFKA_TASKS_TOPIC": kafka_settings.tasks_topic,
        "DAYZERO_KAFKA_TENANTS": "acme",
    }
    created = _cli("apikey", "create", "--tenant", "acme", "--name", "ci", env=env)
    assert created.returncode == 0, created.stderr
    key = created.stdout.strip()
    assert key.startswith("dz_") and "not shown again" in created.stderr
    listed = _cli("apikey", "list", env=env)
    assert "acme" in listed.stdout and key not in listed.stdout  # ids only, never secrets

    sent = _cli(
        "submit",
        "--kafka",
        "--tenant",
        "acme",
        "--idempotency-key",
        "cli-1",
        "--metadata",
        "via=cli",
        "--tools",
        "echo",
        "from the command line",
        env=env,
    )
    assert sent.returncode == 0, sent.stderr
    assert json.loads(sent.stdout)["topic"] == kafka_settings.tasks_topic
    ing = make_ingestor()
    end = time.monotonic() + 30
    while ing.stats["created"] < 1 and time.monotonic() < end:
        ing.run_once()
    with db.connect() as conn:
        row = conn.execute(select(tasks_t).where(tasks_t.c.idempotency_key == "cli-1")).one()
    assert row.tenant == "acme" and row.metadata == {"via": "cli"} and row.allowed_tools == ["echo"]

    app = create_app(
        Settings(
            DATABASE_URL=env["DATABASE_URL"],
            DAYZERO_BLOB_DIR=str(tmp_path),
            DAYZERO_TOOL_MODULES="testing.fixture_tools",
        ),
        engine=db,
        ingress=IngressSettings(gc_freeze=False),
    )
    with live_server(app) as url:
        rest = _cli(
            "submit",
            "--url",
            url,
            "--idempotency-key",
            "cli-2",
            "over REST",
            env={**env, "DAYZERO_API_KEY": key},
        )
        assert rest.returncode == 0, rest.stderr
        assert json.loads(rest.stdout)["status"] == "READY"
        revoked = _cli("apikey", "revoke", key.split("_")[1], env=env)
        assert revoked.returncode == 0 and revoked.stdout.strip() == "revoked"


def test_example_producer_record_is_a_valid_task_message(kafka_broker):
    from orchestrator.kafka.topics import ensure_topics
    from orchestrator.tasks.schemas import KafkaTaskMessage, unknown_tools_problem
    from testing.kafka_broker import consume_all
    from tools.builtin import tool_names
    from tools.config import ToolsConfig

    ensure_topics(kafka_broker.bootstrap, ["dayzero.tasks"], 1)
    out = subprocess.run(
        [sys.executable, "-m", "orchestrator.kafka.example_producer", "acme", "plan a trip"],
        env={**os.environ, "KAFKA_BOOTSTRAP_SERVERS": kafka_broker.bootstrap},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    key = out.stdout.split("key=", 1)[1].split()[0]
    records = [
        r
        for r in consume_all(kafka_broker.bootstrap, "dayzero.tasks", 100, timeout_s=3)
        if r.key.decode() == key
    ]
    assert len(records) == 1
    msg = KafkaTaskMessage.model_validate_json(records[0].value)
    assert msg.tenant == "acme" and msg.goal == "plan a trip"
    # its tools are ones a default deployment knows (else ingest dead-letters it `invalid_task`)
    assert unknown_tools_problem(msg.allowed_tools, tool_names(ToolsConfig(skip_unavailable=True))) is None
