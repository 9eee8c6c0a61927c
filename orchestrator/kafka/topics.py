"""Create the topics this service uses (idempotent)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterable


def ensure_topics(bootstrap: str, names: Iterable[str], partitions: int) -> None:
    from kafka import KafkaAdminClient
    from kafka.admin import NewTopic
    from kafka.errors import TopicAlreadyExistsError

    admin = KafkaAdminClient(bootstrap_servers=bootstrap, client_id="dayzero-admin")
    try:
        existing = set(admin.list_topics())
        missing = [n for n in names if n not in existing]
        if missing:
            with contextlib.suppress(TopicAlreadyExistsError):
                admin.create_topics(
                    [NewTopic(n, num_partitions=partitions, replication_factor=1) for n in missing]
                )
    finally:
        admin.close()
