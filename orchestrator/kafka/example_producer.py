"""A minimal producer of dayzero tasks (kafka-python). Run:

    KAFKA_BOOTSTRAP_SERVERS=127.0.0.1:9092 python -m orchestrator.kafka.example_producer acme "Plan a trip"

The record's value is the REST body of `POST /v1/tasks` plus `tenant`; its key is the
idempotency key (sending the same key again never creates a second task). Results arrive on
`dayzero.results` keyed by task id; rejected records on `dayzero.tasks.dlq` with the reason in
the `dlq-reason` / `dlq-error` headers.
"""

from __future__ import annotations

import json
import os
import sys
import uuid

from kafka import KafkaProducer


def main(tenant: str, goal: str) -> None:
    producer = KafkaProducer(
        bootstrap_servers=os.environ.get("KAFKA_BOOTSTRAP_SERVERS", "127.0.0.1:9092"),
        acks="all",  # the task is durable on the broker once send().get() returns
    )
    key = f"example-{uuid.uuid4()}"  # your business id makes retries safe
    value = {
        "tenant": tenant,
        "goal": goal,
        "allowed_tools": ["calculator", "search_documents"],  # built-ins every deployment has
        "budget": {"max_steps": 20, "deadline_s": 600},
        "metadata": {"source": "example"},
    }
    meta = producer.send("dayzero.tasks", key=key.encode(), value=json.dumps(value).encode()).get(timeout=30)
    print(f"sent key={key} partition={meta.partition} offset={meta.offset}")
    producer.close()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
