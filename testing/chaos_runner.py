"""`python -m testing.chaos_runner`: `dayzero runner` whose Celery app sits on a Redis key
prefix (DZ_TEST_PREFIX), so chaos runs share the test Redis with other tests. Everything else is
the production runner (`orchestrator.app.make_runner`)."""

from __future__ import annotations

import logging
import os
import signal
import threading


def main() -> None:
    from orchestrator.app import make_runner
    from orchestrator.config import Settings
    from orchestrator.dispatch import CeleryDispatcher
    from orchestrator.probes import retry_until_up
    from testing.celery_test_app import build_app

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    settings = Settings()
    broker = settings.celery_broker_url or ""
    app = build_app(broker, settings.celery_result_backend or broker, os.environ["DZ_TEST_PREFIX"])
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    parts = retry_until_up(
        "connecting to the database",
        lambda: make_runner(settings, dispatcher=CeleryDispatcher(broker, broker, app=app)),
        stop,
    )
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: parts.runner.stop())
    try:
        parts.runner.run_forever()
    finally:
        parts.close()


if __name__ == "__main__":
    main()
