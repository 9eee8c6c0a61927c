"""The system chaos harness: the whole stack as real processes, with things killed under it.

Stack: PostgreSQL, a Kafka-protocol broker (tansu), Redis; `dayzero serve` (REST), N runners,
one Celery tools worker, `dayzero ingest`, `dayzero relay`, and a scripted model over HTTP.
Tasks arrive by REST (Idempotency-Key, retried on 503 and on dropped connections, as a client
should) and by Kafka (keyed records), while runners, the worker, ingest and relay are SIGKILLed
and respawned, the database's connections are cut, and the database refuses connections for a
while. Then everything is left to heal and the outcome is checked:

- lost: a submission with no task, a task that is not SUCCEEDED, an event not published, a
  result missing from `dayzero.results`;
- duplicated: two tasks for one submission, a tool call twice in a transcript, or a side effect
  executed under two attempts of one step (a replay under the same idempotency key is allowed:
  that is what the key is for; such replays are counted);
- stuck: a task or step still in flight when the stack has been healthy for `drain_timeout_s`;
- unexpected exits: a process that died without being killed (ingest and relay used to exit on
  a database outage).

`run_chaos` returns the figures; `tests/orchestrator/test_chaos.py` runs a short round in CI,
`benchmarks/chaos_soak.py` a long one.
"""

from __future__ import annotations

import collections
import contextlib
import json
import os
import random
import signal
import statistics
import subprocess
import sys
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
from sqlalchemy import Engine, func, select

from orchestrator.auth import create_api_key
from orchestrator.db.models import Event, Task
from orchestrator.kafka.relay import unpublished_count
from orchestrator.kafka.topics import ensure_topics
from orchestrator.store import list_messages, list_steps
from testing.db_outage import cut_connections, database_down
from testing.kafka_broker import consume_all, free_port

REPO = Path(__file__).resolve().parents[1]
TENANT = "acme"
ACTIONS = (("runner", 4), ("worker", 1), ("ingest", 1), ("relay", 1), ("cut", 2))
SERVICE_ACTIONS = (("model", 1), ("redis", 1))  # with `ChaosConfig.service_restarts`
BROKER_ACTIONS = (("broker", 1),)  # with a `broker` process given to `run_chaos`


@dataclass(frozen=True, slots=True)
class ChaosConfig:
    rest_tasks: int = 24
    kafka_tasks: int = 24
    cycles: int = 2  # tool calls per task (2 * cycles + 1 steps)
    runners: int = 3
    chaos_s: float = 30.0
    action_gap_s: tuple[float, float] = (0.6, 1.6)
    outages: int = 1  # windows in which the database refuses connections
    outage_s: float = 3.0
    # Healing is waited for as long as it progresses: "stuck" is no progress at all (no task
    # created or finished, no event written or published) for `stall_s`; "slow" is progress that
    # has not finished within `drain_max_s`. A busy machine is slow, never stuck.
    stall_s: float = 120.0
    drain_max_s: float = 900.0
    # Also restart the model server and Redis (their own processes here, Redis with its append-only
    # file, as a real one), each down for `restart_down_s` before it comes back.
    service_restarts: bool = False
    restart_down_s: float = 4.0
    # Freeze the Kafka broker (SIGSTOP, SIGCONT after `restart_down_s`) when `run_chaos` is given
    # its process: every client's requests hang, then resume. Not a restart proper: the test
    # broker keeps its log in memory, so a restarted one has lost every acknowledged record.
    broker_pauses: bool = False
    seed: int = 15


@dataclass
class _Proc:
    kind: str
    cmd: list[str]
    log: Path
    popen: subprocess.Popen | None = None
    kills: int = 0
    unexpected: list[str] = field(default_factory=list)


class Stack:
    """The processes, each respawned at once after a kill (and after an unexpected exit, which
    is recorded)."""

    def __init__(
        self,
        env: dict[str, str],
        log_dir: Path,
        cfg: ChaosConfig,
        api_port: int,
        prefix: str,
        services: dict[str, list[str]] | None = None,
    ):
        py = sys.executable
        worker = [py, "-m", "celery", "-A", "testing.celery_test_app", "worker", "--queues", "tools",
                  "--pool", "prefork", "--concurrency", "2", "--loglevel", "INFO", "--without-gossip",
                  "--without-mingle", "--without-heartbeat"]  # fmt: skip
        self.env, self.prefix = env, prefix
        self.procs: dict[str, list[_Proc]] = {
            "api": [_Proc("api", [py, "-m", "orchestrator.cli", "serve", "--port", str(api_port)], log_dir / "api.log")],
            "runner": [
                _Proc("runner", [py, "-m", "testing.chaos_runner"], log_dir / f"runner{i}.log")
                for i in range(cfg.runners)
            ],
            "worker": [_Proc("worker", worker, log_dir / "worker.log")],
            "ingest": [_Proc("ingest", [py, "-m", "orchestrator.cli", "ingest", "--no-create-topics"], log_dir / "ingest.log")],
            "relay": [_Proc("relay", [py, "-m", "orchestrator.cli", "relay", "--no-create-topics"], log_dir / "relay.log")],
        }  # fmt: skip
        for kind, cmd in (services or {}).items():  # started first: the others wait for them
            self.procs = {kind: [_Proc(kind, cmd, log_dir / f"{kind}.log")], **self.procs}
        self._spawned = 0

    def _spawn(self, p: _Proc) -> None:
        cmd = list(p.cmd)
        if p.kind == "worker":
            self._spawned += 1
            cmd += ["--hostname", f"w{self._spawned}-{self.prefix}@%h"]
        with p.log.open("ab") as log:
            p.popen = subprocess.Popen(
                cmd, cwd=REPO, env=self.env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
            )

    def start(self) -> None:
        for group in self.procs.values():
            for p in group:
                self._spawn(p)

    def restart(self, kind: str, down_s: float) -> None:
        """SIGKILL a service, and start it again on the same port after `down_s`."""
        (p,) = self.procs[kind]
        self.check()
        assert p.popen is not None
        _killpg(p.popen)
        p.kills += 1
        time.sleep(down_s)
        self._spawn(p)

    def kill(self, kind: str, rng: random.Random) -> None:
        p = rng.choice(self.procs[kind])
        self.check()
        assert p.popen is not None
        _killpg(p.popen)
        p.kills += 1
        self._spawn(p)

    def check(self) -> None:
        """Record and respawn any process that exited without being killed."""
        for group in self.procs.values():
            for p in group:
                if p.popen is not None and p.popen.poll() is not None:
                    tail = p.log.read_text(errors="replace")[-1500:]
                    p.unexpected.append(f"{p.kind} exited with {p.popen.returncode}: …{tail}")
                    self._spawn(p)

    def stop(self) -> None:
        for group in self.procs.values():
            for p in group:
                if p.popen is not None:
                    _killpg(p.popen, signal.SIGTERM)
        for group in self.procs.values():
            for p in group:
                if p.popen is not None:
                    try:
                        p.popen.wait(timeout=15)
                    except subprocess.TimeoutExpired:
                        _killpg(p.popen)

    def kills(self) -> dict[str, int]:
        return {k: sum(p.kills for p in g) for k, g in self.procs.items() if k != "api"}

    def unexpected_exits(self) -> list[str]:
        return [u for g in self.procs.values() for p in g for u in p.unexpected]


def _killpg(proc: subprocess.Popen, sig: int = signal.SIGKILL) -> None:
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, sig)
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)


def _goal(cycles: int) -> str:
    return "script:" + json.dumps(
        {"cycles": cycles, "tool": "ledger", "args": {"i": "{i}", "max_sleep_s": 0.05}}
    )


class RestSubmitter(threading.Thread):
    """Submits tasks as a careful client: same Idempotency-Key on every retry, honours Retry-After."""

    def __init__(self, url: str, key: str, n: int, cycles: int, gap_s: float, rng: random.Random):
        super().__init__(daemon=True)
        self.url, self.key, self.n, self.cycles, self.gap_s, self.rng = url, key, n, cycles, gap_s, rng
        self.keys = [f"rest-{i}" for i in range(n)]
        self.statuses: collections.Counter[str] = collections.Counter()
        self.errors: list[str] = []

    def run(self) -> None:
        headers = {"Authorization": f"Bearer {self.key}"}
        with httpx.Client(base_url=self.url, timeout=15) as client:
            for k in self.keys:
                end = time.monotonic() + 120
                while True:
                    try:
                        r = client.post(
                            "/v1/tasks",
                            json={"goal": _goal(self.cycles)},
                            headers={**headers, "Idempotency-Key": k},
                        )
                        self.statuses[str(r.status_code)] += 1
                        if r.status_code in (200, 201):
                            break
                        if r.status_code not in (503, 429):
                            self.errors.append(f"{k}: {r.status_code} {r.text[:300]}")
                            break
                        wait = float(r.headers.get("Retry-After", "0.5"))
                    except httpx.TransportError as exc:  # the API or its connection went away
                        self.statuses[type(exc).__name__] += 1
                        wait = 0.3
                    if time.monotonic() > end:
                        self.errors.append(f"{k}: gave up")
                        break
                    time.sleep(wait)
                time.sleep(self.rng.uniform(0, 2 * self.gap_s))


class KafkaSubmitter:
    """Sends keyed task records as a careful producer: every send's ack is checked, and a send
    the broker did not acknowledge is sent again (same key: ingest creates the task once)."""

    def __init__(self, bootstrap: str, topic: str, cycles: int):
        from kafka import KafkaProducer

        self.topic, self.cycles = topic, cycles
        self.producer = KafkaProducer(bootstrap_servers=bootstrap, acks="all", linger_ms=5)
        self.pending: list[tuple[str, Any]] = []
        self.resent: list[str] = []

    def send(self, key: str) -> None:
        value = json.dumps({"tenant": TENANT, "goal": _goal(self.cycles)}).encode()
        self.pending.append((key, self.producer.send(self.topic, key=key.encode(), value=value)))

    def settle(self) -> None:
        """Wait for the acks of what was sent; send again what failed."""
        self.producer.flush()
        failed = []
        for key, fut in self.pending:
            try:
                fut.get(timeout=60)
            except Exception as exc:  # the broker did not take it: it is not on the topic
                self.resent.append(f"{key}: {type(exc).__name__}")
                failed.append(key)
        self.pending = []
        for key in failed:
            self.send(key)
        if failed:
            self.settle()

    def close(self) -> None:
        self.producer.close()


def _pct(xs: list[float], q: float) -> float | None:
    if not xs:
        return None
    xs = sorted(xs)
    return round(xs[min(len(xs) - 1, int(q * len(xs)))], 3)


def _pause(proc: subprocess.Popen, seconds: float) -> None:
    """Freeze a process for `seconds` (its sockets stay open; nothing answers meanwhile)."""
    proc.send_signal(signal.SIGSTOP)
    try:
        time.sleep(seconds)
    finally:
        proc.send_signal(signal.SIGCONT)


def run_chaos(
    *,
    engine: Engine,
    db_url: str,
    bootstrap: str,
    redis_url: str,
    model_url: str,
    work_dir: Path,
    cfg: ChaosConfig,
    broker: subprocess.Popen | None = None,
) -> dict[str, Any]:
    rng = random.Random(cfg.seed)
    prefix = f"dzchaos-{uuid.uuid4().hex[:8]}-"
    s = uuid.uuid4().hex[:8]
    topics = {"tasks": f"tasks-{s}", "dlq": f"dlq-{s}", "events": f"events-{s}", "results": f"results-{s}"}
    ensure_topics(bootstrap, list(topics.values()), 3)
    state_dir = work_dir / "state"
    state_dir.mkdir(parents=True, exist_ok=True)
    with engine.begin() as conn:
        api_key = create_api_key(conn, TENANT).key
    api_port = free_port()
    services: dict[str, list[str]] = {}
    if cfg.service_restarts:
        model_port, redis_port = free_port(), free_port()
        (work_dir / "redis").mkdir(exist_ok=True)
        services = {
            "model": [sys.executable, "-m", "testing.scripted_model", str(model_port)],
            "redis": ["redis-server", "--port", str(redis_port), "--bind", "127.0.0.1", "--save", "",
                      "--appendonly", "yes", "--appendfsync", "always", "--dir", str(work_dir / "redis")],
        }  # fmt: skip
        model_url = f"http://127.0.0.1:{model_port}"
        redis_url = f"redis://127.0.0.1:{redis_port}/0"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DAYZERO_", "CELERY_", "KAFKA_"))}
    env.update(
        PYTHONPATH=str(REPO),
        DATABASE_URL=db_url,
        DZ_TEST_PREFIX=prefix,
        CELERY_BROKER_URL=redis_url,
        CELERY_RESULT_BACKEND=redis_url,
        KAFKA_BOOTSTRAP_SERVERS=bootstrap,
        DAYZERO_KAFKA_TASKS_TOPIC=topics["tasks"],
        DAYZERO_KAFKA_DLQ_TOPIC=topics["dlq"],
        DAYZERO_KAFKA_EVENTS_TOPIC=topics["events"],
        DAYZERO_KAFKA_RESULTS_TOPIC=topics["results"],
        DAYZERO_KAFKA_GROUP_ID=f"ingest-{s}",
        DAYZERO_KAFKA_TENANTS=TENANT,
        DAYZERO_KAFKA_SESSION_TIMEOUT_MS="4000",
        DAYZERO_KAFKA_HEARTBEAT_INTERVAL_MS="1000",
        DAYZERO_INFERENCE_URL=model_url,
        DAYZERO_INFERENCE_TIMEOUT_S="30",
        DAYZERO_TOOL_MODULES="testing.fixture_tools",
        DAYZERO_TEST_STATE_DIR=str(state_dir),
        DAYZERO_WORKSPACE_DIR=str(work_dir / "ws"),
        DAYZERO_BLOB_DIR=str(work_dir / "blobs"),
        DAYZERO_LEASE_S="2.0",
        DAYZERO_POLL_INTERVAL_S="0.05",
        DAYZERO_INGRESS_GC_FREEZE="false",
    )
    stack = Stack(env, work_dir, cfg, api_port, prefix, services)
    actions_table = ACTIONS + (SERVICE_ACTIONS if cfg.service_restarts else ())
    if cfg.broker_pauses and broker is not None:
        actions_table += BROKER_ACTIONS
    stack.start()
    api = f"http://127.0.0.1:{api_port}"
    _wait(lambda: _healthy(api), 60, "the API to start")
    figures: dict[str, Any] = {"config": {k: getattr(cfg, k) for k in cfg.__slots__}}
    rest = RestSubmitter(api, api_key, cfg.rest_tasks, cfg.cycles, cfg.chaos_s / max(cfg.rest_tasks, 1), rng)
    kafka_keys = [f"kafka-{i}" for i in range(cfg.kafka_tasks)]
    kafka_submitter = KafkaSubmitter(bootstrap, topics["tasks"], cfg.cycles)
    send_at = sorted(rng.uniform(0, cfg.chaos_s * 0.8) for _ in kafka_keys)
    outage_at = sorted(rng.uniform(0.2 * cfg.chaos_s, 0.8 * cfg.chaos_s) for _ in range(cfg.outages))
    dbname = db_url.rsplit("/", 1)[1]
    actions: collections.Counter[str] = collections.Counter()
    t0 = time.monotonic()
    rest.start()
    sent = 0
    next_action = t0 + rng.uniform(*cfg.action_gap_s)
    try:
        while time.monotonic() - t0 < cfg.chaos_s or sent < len(kafka_keys):
            now = time.monotonic() - t0
            while sent < len(kafka_keys) and send_at[sent] <= now:
                kafka_submitter.send(kafka_keys[sent])
                sent += 1
            kafka_submitter.settle()
            if outage_at and now >= outage_at[0]:
                outage_at.pop(0)
                with database_down(dbname):
                    actions["outage"] += 1
                    time.sleep(cfg.outage_s)
            elif time.monotonic() >= next_action and now < cfg.chaos_s:
                kind = rng.choices([a for a, _ in actions_table], weights=[w for _, w in actions_table])[0]
                if kind == "cut":
                    cut_connections(dbname)
                elif kind == "broker":
                    assert broker is not None
                    _pause(broker, cfg.restart_down_s)
                elif kind in services:
                    stack.restart(kind, cfg.restart_down_s)
                else:
                    stack.kill(kind, rng)
                actions[kind] += 1
                next_action = time.monotonic() + rng.uniform(*cfg.action_gap_s)
            stack.check()
            time.sleep(0.05)
        rest.join(180)
        chaos_end = time.monotonic()
        # Heal: everything runs; wait for every task to end and every event to be published,
        # for as long as that progresses.
        n_expected = cfg.rest_tasks + cfg.kafka_tasks
        figures["drain"] = _drain(engine, stack, n_expected, cfg.stall_s, cfg.drain_max_s)
        figures["drain_s"] = round(time.monotonic() - chaos_end, 2)
        if figures["drain"] != "drained":
            figures["diagnosis"] = diagnose(engine, rest.keys + kafka_keys, bootstrap, topics, env, work_dir)
        results = consume_all(bootstrap, topics["results"], n_expected, timeout_s=30)
        stack.check()
    finally:
        kafka_submitter.close()
        stack.stop()
    figures["kafka_resent"] = kafka_submitter.resent
    figures["wall_s"] = round(time.monotonic() - t0, 1)
    figures["actions"] = dict(actions)
    figures["kills"] = stack.kills()
    figures["rest_responses"] = dict(rest.statuses)
    figures["rest_errors"] = rest.errors
    figures["unexpected_exits"] = stack.unexpected_exits()
    figures.update(verify(engine, rest.keys + kafka_keys, state_dir, cfg.cycles, results))
    return figures


def _healthy(url: str) -> bool:
    try:
        return httpx.get(url + "/healthz", timeout=2).status_code == 200
    except httpx.TransportError:
        return False


def _wait(cond: Any, timeout_s: float, what: str | None) -> bool:
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        try:
            if cond():
                return True
        except Exception:  # the DB may still be healing: ask again
            pass
        time.sleep(0.25)
    if what is not None:
        raise TimeoutError(f"timed out waiting for {what}")
    return False


def _progress(engine: Engine) -> tuple[int, ...]:
    """What changes while the stack makes progress: tasks, finished tasks, events, published events."""
    with engine.connect() as conn:
        n = conn.execute(select(func.count()).select_from(Task).where(Task.tenant == TENANT)).scalar_one()
        open_ = conn.execute(
            select(func.count())
            .select_from(Task)
            .where(Task.status.not_in(["SUCCEEDED", "FAILED", "CANCELLED", "TIMED_OUT"]))
        ).scalar_one()
        last_event = conn.execute(select(func.coalesce(func.max(Event.id), 0))).scalar_one()
        unpublished = unpublished_count(conn)
    return n, open_, last_event, unpublished


def _drain(engine: Engine, stack: Stack, n_expected: int, stall_s: float, max_s: float) -> str:
    """ "drained", "stuck" (nothing progressed for `stall_s`) or "slow" (still progressing after `max_s`)."""
    start = last_change = time.monotonic()
    last: tuple[int, ...] | None = None
    while True:
        stack.check()
        try:
            now_state = _progress(engine)
        except Exception:  # the database may still be healing: ask again
            now_state = last
        now = time.monotonic()
        if now_state is not None:
            n, open_, _, unpublished = now_state
            if n >= n_expected and open_ == 0 and unpublished == 0:
                return "drained"
            if now_state != last:
                last, last_change = now_state, now
        if now - last_change > stall_s:
            return "stuck"
        if now - start > max_s:
            return "slow"
        time.sleep(0.5)


def diagnose(
    engine: Engine,
    keys: list[str],
    bootstrap: str,
    topics: dict[str, str],
    env: dict[str, str],
    log_dir: Path,
) -> dict[str, Any]:
    """Where a drain that did not finish stands: submissions without a task, unfinished tasks
    and their open step and lease, the outbox not yet published, ingest's consumer lag per
    partition, and the tails of the ingest and relay logs."""
    out: dict[str, Any] = {}
    with engine.connect() as conn:
        have = set(conn.execute(select(Task.idempotency_key).where(Task.tenant == TENANT)).scalars())
        out["no_task"] = [k for k in keys if k not in have]
        out["unfinished"] = [
            {k: str(v) for k, v in r._mapping.items()}
            for r in conn.execute(
                select(
                    Task.id, Task.idempotency_key, Task.status, Task.open_step, Task.open_status,
                    Task.open_attempt, Task.lease_owner, Task.lease_until, Task.next_run_at, Task.updated_at,
                ).where(Task.status.not_in(["SUCCEEDED", "FAILED", "CANCELLED", "TIMED_OUT"]))
            )
        ]  # fmt: skip
        out["unpublished_events"] = unpublished_count(conn)
    try:
        out["ingest_lag"] = _consumer_lag(bootstrap, topics["tasks"], env["DAYZERO_KAFKA_GROUP_ID"])
    except Exception as exc:  # the report must not hide the failure it explains
        out["ingest_lag"] = f"unknown: {exc!r}"
    for name in ("ingest", "relay"):
        path = log_dir / f"{name}.log"
        if path.exists():
            out[f"{name}_log_tail"] = path.read_text(errors="replace").splitlines()[-25:]
    return out


def _consumer_lag(bootstrap: str, topic: str, group: str) -> dict[str, Any]:
    from kafka import KafkaAdminClient, KafkaConsumer, TopicPartition

    admin = KafkaAdminClient(bootstrap_servers=bootstrap)
    consumer = KafkaConsumer(bootstrap_servers=bootstrap)
    try:
        committed = admin.list_consumer_group_offsets(group)
        parts = consumer.partitions_for_topic(topic) or set()
        tps = [TopicPartition(topic, p) for p in sorted(parts)]
        ends = consumer.end_offsets(tps)
        return {
            str(tp.partition): {"committed": getattr(committed.get(tp), "offset", None), "end": ends[tp]}
            for tp in tps
        }
    finally:
        consumer.close()
        admin.close()


def verify(
    engine: Engine, keys: list[str], state_dir: Path, cycles: int, results: list[Any]
) -> dict[str, Any]:
    """The outcome: lost, duplicated and stuck work, with the evidence."""
    ledger_file = state_dir / "ledger.log"
    ledger = (
        collections.Counter(ledger_file.read_text().split())
        if ledger_file.exists()
        else collections.Counter()
    )
    by_step: dict[tuple[str, int], set[int]] = collections.defaultdict(set)
    for k in ledger:
        task_id, step, attempt = k.rsplit(":", 2)
        by_step[(task_id, int(step))].add(int(attempt))
    lost: list[str] = []
    duplicated: list[str] = []
    stuck: list[str] = []
    latencies: list[float] = []
    with engine.connect() as conn:
        tasks = list(conn.execute(select(Task.__table__).where(Task.tenant == TENANT)))
        by_key = collections.defaultdict(list)
        for t in tasks:
            by_key[t.idempotency_key].append(t)
        for k in keys:
            if not by_key.get(k):
                lost.append(f"submission {k}: no task")
            elif len(by_key[k]) > 1:
                duplicated.append(f"submission {k}: {len(by_key[k])} tasks")
        duplicated += [
            f"task {t.id} for unknown key {t.idempotency_key}" for t in tasks if t.idempotency_key not in keys
        ]
        steps = {t.id: list_steps(conn, t.id) for t in tasks}
        for t in tasks:
            if t.status not in ("SUCCEEDED", "FAILED", "CANCELLED", "TIMED_OUT"):
                stuck.append(f"task {t.id} {t.status}")
                continue
            if t.status != "SUCCEEDED" or t.result != f"done after {cycles} tool calls":
                lost.append(f"task {t.id} ended {t.status}: {t.error}")
                continue
            latencies.append((t.finished_at - t.created_at).total_seconds())
            ss = sorted(steps[t.id], key=lambda s: s.step_index)
            if [s.step_index for s in ss] != list(range(2 * cycles + 1)) or any(
                s.status != "SUCCEEDED" for s in ss
            ):
                lost.append(f"task {t.id} steps {[(s.step_index, s.status) for s in ss]}")
            calls = [m["tool_call_id"] for m in list_messages(conn, t.id) if m["role"] == "tool"]
            if calls != [f"call_{i}" for i in range(cycles)]:
                duplicated.append(f"task {t.id} tool results {calls}")
            for s in ss:
                if s.kind != "tool":
                    continue
                attempts = by_step.get((t.id, s.step_index), set())
                if not attempts:
                    lost.append(f"task {t.id} step {s.step_index}: the tool never ran")
                elif len(attempts) != 1:  # a retry after an unknown outcome reuses the first key
                    duplicated.append(
                        f"task {t.id} step {s.step_index}: side effect under attempts {sorted(attempts)}"
                    )
        in_flight_steps = conn.execute(  # the open steps, on their task rows
            select(func.coalesce(func.sum(Task.next_step - Task.open_step), 0)).where(
                Task.open_status.in_(["RUNNING", "PENDING", "RETRY_WAIT"])
            )
        ).scalar_one()
        unpublished = unpublished_count(conn)
        n_events = conn.execute(select(func.count()).select_from(Event)).scalar_one()
    if in_flight_steps:
        stuck.append(f"{in_flight_steps} steps in flight")
    if unpublished:
        lost.append(f"{unpublished} events never published")
    published = {json.loads(r.value)["task_id"] for r in results}
    missing_results = [t.id for t in tasks if t.id not in published]
    lost += [f"task {t}: no result on dayzero.results" for t in missing_results]
    replays = sum(n - 1 for n in ledger.values() if n > 1)
    return {
        "tasks": len(tasks),
        "submitted": len(keys),
        "events": n_events,
        "tool_executions": sum(ledger.values()),
        "same_key_replays": replays,
        "lost": lost,
        "duplicated": duplicated,
        "stuck": stuck,
        "task_latency_s": {
            "p50": _pct(latencies, 0.5),
            "p95": _pct(latencies, 0.95),
            "max": _pct(latencies, 1.0),
            "mean": round(statistics.fmean(latencies), 3) if latencies else None,
        },
    }
