"""Tools used by the orchestrator tests and benchmarks (`DAYZERO_TOOL_MODULES=testing.fixture_tools`).

State that must survive a process (attempt counters, the side-effect ledger) lives in files under
`DAYZERO_TEST_STATE_DIR`, so runner processes killed mid-way leave evidence behind.
"""

from __future__ import annotations

import os
import random
import time
from pathlib import Path
from typing import Any

from tools.base import PermanentToolError, RetryableToolError, RetryPolicy, ToolContext, ToolResult, ToolSpec

OBJ = {"type": "object"}


def _state_dir() -> Path:
    d = Path(os.environ.get("DAYZERO_TEST_STATE_DIR", "/tmp/dayzero-test-state"))
    d.mkdir(parents=True, exist_ok=True)
    return d


class Echo:
    """Returns its arguments plus ~200 bytes of result (the benchmark's 'instant tool')."""

    spec = ToolSpec(name="echo", description="echo the arguments", parameters=OBJ)

    def run(self, arguments: dict[str, Any], context: ToolContext) -> ToolResult:
        return ToolResult(content={"echo": arguments, "note": "x" * 180})


class InlineEcho:
    """Echo declared `inline`: the in-process dispatcher runs it on the caller's thread (the
    benchmark's instant tool without the hand-off); it reports the thread it ran on."""

    spec = ToolSpec(
        name="echo_inline", description="echo on the caller's thread", parameters=OBJ, inline=True
    )

    def run(self, arguments: dict[str, Any], context: ToolContext) -> ToolResult:
        import threading

        return ToolResult(
            content={"echo": arguments, "thread": threading.current_thread().name, "note": "x" * 160}
        )


class SlowEcho:
    """Echo after a short random sleep: gives crash tests windows to kill a runner mid-tool."""

    spec = ToolSpec(name="slow_echo", description="echo after a pause", parameters=OBJ)

    def run(self, arguments: dict[str, Any], context: ToolContext) -> ToolResult:
        time.sleep(random.uniform(0.0, float(arguments.get("max_sleep_s", 0.05))))
        return ToolResult(content={"echo": arguments})


class Ledger:
    """A side effect that dedupes on the idempotency key: every execution is logged to a file."""

    spec = ToolSpec(
        name="ledger",
        description="append to the ledger",
        parameters=OBJ,
        idempotent=False,
        accepts_idempotency_key=True,
    )

    def run(self, arguments: dict[str, Any], context: ToolContext) -> ToolResult:
        pause = float(arguments.get("max_sleep_s", 0.03))
        time.sleep(random.uniform(0.0, pause))
        with open(_state_dir() / "ledger.log", "a") as f:
            f.write(f"{context.idempotency_key}\n")
            f.flush()
            os.fsync(f.fileno())
        time.sleep(random.uniform(0.0, pause))
        return ToolResult(content={"recorded": context.idempotency_key})


class Flaky:
    """Fails with a retryable error `fail_times` times per step, then succeeds; logs attempt times."""

    spec = ToolSpec(
        name="flaky",
        description="fails transiently",
        parameters={
            "type": "object",
            "properties": {"fail_times": {"type": "integer"}, "pad": {"type": "string"}},
        },
        retry=RetryPolicy(max_attempts=5, backoff_base_s=0.2, backoff_max_s=2.0, timeout_s=5.0),
    )

    def run(self, arguments: dict[str, Any], context: ToolContext) -> ToolResult:
        log = _state_dir() / f"flaky-{context.task_id}-{context.step_id}.log"
        with open(log, "a") as f:
            f.write(f"{time.time()}\n")
        tries = len(log.read_text().splitlines())
        if tries <= int(arguments.get("fail_times", 2)):
            raise RetryableToolError(f"transient failure {tries}")
        if "pad" in arguments:  # a result of the size a test needs
            return ToolResult(content={"ok_after": tries, "pad": str(arguments["pad"])})
        return ToolResult(content={"ok_after": tries})


class Broken:
    """Always fails permanently."""

    spec = ToolSpec(name="broken", description="always fails", parameters=OBJ)

    def run(self, arguments: dict[str, Any], context: ToolContext) -> ToolResult:
        log = _state_dir() / f"broken-{context.task_id}.log"
        with open(log, "a") as f:
            f.write("x\n")
        raise PermanentToolError("this tool is broken")


class Hang:
    """Sleeps far longer than its timeout."""

    spec = ToolSpec(
        name="hang",
        description="hangs",
        parameters=OBJ,
        retry=RetryPolicy(max_attempts=2, backoff_base_s=0.05, backoff_max_s=0.1, timeout_s=0.5),
    )

    def run(self, arguments: dict[str, Any], context: ToolContext) -> ToolResult:
        time.sleep(5)
        return ToolResult(content="woke up")


class Charge:
    """A side effect that is not idempotent and takes no idempotency key (a payment, an e-mail)."""

    spec = ToolSpec(
        name="charge",
        description="charge a card",
        parameters=OBJ,
        idempotent=False,
        retry=RetryPolicy(max_attempts=3, backoff_base_s=0.05, backoff_max_s=0.1, timeout_s=0.5),
    )

    def run(self, arguments: dict[str, Any], context: ToolContext) -> ToolResult:
        with open(_state_dir() / "charges.log", "a") as f:
            f.write(f"{context.idempotency_key}\n")
        time.sleep(float(arguments.get("sleep_s", 0)))
        return ToolResult(content={"charged": True})


class FlakyCharge:
    """`charge` whose first `fail_times` calls fail transiently: by default after the charge was
    written (a connection reset once the request was sent: it may have happened), with
    `before_start` before anything was touched (`started=False`: safe to try again)."""

    spec = ToolSpec(
        name="flaky_charge",
        description="charge a card over a flaky connection",
        parameters=OBJ,
        idempotent=False,
        retry=RetryPolicy(max_attempts=3, backoff_base_s=0.05, backoff_max_s=0.1, timeout_s=5.0),
    )

    def run(self, arguments: dict[str, Any], context: ToolContext) -> ToolResult:
        tries_log = _state_dir() / f"flaky-charge-{context.task_id}-{context.step_id}.log"
        with open(tries_log, "a") as f:
            f.write("x\n")
        failing = len(tries_log.read_text().splitlines()) <= int(arguments.get("fail_times", 1))
        if failing and arguments.get("before_start"):
            raise RetryableToolError("connection refused", started=False)
        with open(_state_dir() / "charges.log", "a") as f:
            f.write(f"{context.idempotency_key}\n")
        if failing:
            raise RetryableToolError("connection reset after the request was sent")
        return ToolResult(content={"charged": True})


class SlowCharge:
    """`charge`, then a long pause: a worker killed in the pause has done the side effect but not
    acked the job, which Redis redelivers after the visibility timeout (the late duplicate)."""

    spec = ToolSpec(
        name="slow_charge",
        description="charge a card, slowly",
        parameters=OBJ,
        idempotent=False,
        retry=RetryPolicy(max_attempts=1, timeout_s=6.0),
    )

    def run(self, arguments: dict[str, Any], context: ToolContext) -> ToolResult:
        with open(_state_dir() / "charges.log", "a") as f:
            f.write(f"{context.idempotency_key}\n")
        time.sleep(float(arguments.get("sleep_s", 60)))
        return ToolResult(content={"charged": True})


class Sleepy:
    """Idempotent; its first attempt sleeps far into its long timeout (`sleepy.log` says when it
    started): a worker killed then must be noticed long before that timeout."""

    spec = ToolSpec(
        name="sleepy",
        description="sleep on the first attempt",
        parameters=OBJ,
        idempotent=True,
        retry=RetryPolicy(max_attempts=2, backoff_base_s=0.05, backoff_max_s=0.1, timeout_s=600.0),
    )

    def run(self, arguments: dict[str, Any], context: ToolContext) -> ToolResult:
        with open(_state_dir() / "sleepy.log", "a") as f:
            f.write(f"{context.task_id}:{context.step_id}:{context.attempt}\n")
        if context.attempt == 1:
            time.sleep(float(arguments.get("sleep_s", 600)))
        return ToolResult(content={"attempt": context.attempt})


class KeyedCharge:
    """A charge that dedups on its idempotency key (as a payment API does): a key seen before
    returns the first result without charging again. Every execution is logged with its key
    (`keyed-runs.log`); the first execution of a step is slow (past the 0.5 s timeout) after it
    charged, so its attempt times out with the charge done: outcome unknown to the runner."""

    spec = ToolSpec(
        name="keyed_charge",
        description="charge a card under an idempotency key",
        parameters=OBJ,
        idempotent=False,
        accepts_idempotency_key=True,
        retry=RetryPolicy(max_attempts=3, backoff_base_s=0.05, backoff_max_s=0.1, timeout_s=0.5),
    )

    def run(self, arguments: dict[str, Any], context: ToolContext) -> ToolResult:
        runs = _state_dir() / "keyed-runs.log"
        first = not runs.exists() or f"{context.task_id}:{context.step_id}:" not in runs.read_text()
        with open(runs, "a") as f:
            f.write(f"{context.idempotency_key}\n")
        charges = _state_dir() / "charges.log"
        if not charges.exists() or context.idempotency_key not in charges.read_text().split():
            with open(charges, "a") as f:
                f.write(f"{context.idempotency_key}\n")
        if first:
            time.sleep(float(arguments.get("sleep_s", 1.5)))
        return ToolResult(content={"charged": context.idempotency_key})


class Gate:
    """Waits until the file `gate-open` exists in the state dir: a test holds a task mid-step, and
    lets it go when it has seen what it wanted (no sleeps, no timing assumptions)."""

    spec = ToolSpec(
        name="gate",
        description="wait for the test to open the gate",
        parameters=OBJ,
        retry=RetryPolicy(max_attempts=1, timeout_s=120.0),
    )

    def run(self, arguments: dict[str, Any], context: ToolContext) -> ToolResult:
        gate = _state_dir() / "gate-open"
        end = time.monotonic() + 120
        while not gate.exists():
            if time.monotonic() > end:
                raise PermanentToolError("the gate was never opened")
            time.sleep(0.05)
        return ToolResult(content={"passed": True})


class Remit:
    """A side effect that is not idempotent and takes no key, tried once, with a long timeout:
    whatever happens to the queue, it must run once or be known not to have run."""

    spec = ToolSpec(
        name="remit",
        description="send money",
        parameters=OBJ,
        idempotent=False,
        retry=RetryPolicy(max_attempts=1, timeout_s=90.0),
    )

    def run(self, arguments: dict[str, Any], context: ToolContext) -> ToolResult:
        with open(_state_dir() / "remits.log", "a") as f:
            f.write(f"{context.idempotency_key}\n")
        return ToolResult(content={"sent": True})


class WhoAmI:
    """Returns the id of the process that ran it (tells a Celery worker from the runner)."""

    spec = ToolSpec(name="whoami", description="process id", parameters=OBJ)

    def run(self, arguments: dict[str, Any], context: ToolContext) -> ToolResult:
        return ToolResult(content={"pid": os.getpid(), "attachments": [a.id for a in context.attachments]})


def dayzero_tools() -> list[Any]:
    return [
        Echo(),
        InlineEcho(),
        SlowEcho(),
        Ledger(),
        Flaky(),
        Broken(),
        Hang(),
        Charge(),
        FlakyCharge(),
        SlowCharge(),
        Sleepy(),
        KeyedCharge(),
        Gate(),
        Remit(),
        WhoAmI(),
    ]
