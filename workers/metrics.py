"""Prometheus metrics of the Celery workers (docs/observability.md lists them).

Prefork children each count their own jobs; `dayzero worker --metrics-port` serves them all
through prometheus_client's multiprocess mode (one file per child in PROMETHEUS_MULTIPROC_DIR).
"""

from __future__ import annotations

from prometheus_client import Counter, Histogram

JOBS = Counter("dayzero_worker_jobs_total", "jobs run by a worker, by job and outcome", ["job", "outcome"])
JOB_SECONDS = Histogram(
    "dayzero_worker_job_duration_seconds",
    "time a worker spent on one job",
    ["job"],
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300),
)
PREPROCESS_BYTES = Counter("dayzero_preprocess_input_bytes_total", "attachment bytes preprocessed")
PREPROCESS_PIXELS = Counter("dayzero_preprocess_pixels_total", "source pixels preprocessed (h x w)")
PREPROCESS_IMAGES = Counter(
    "dayzero_preprocess_images_total", "images preprocessed, by whether the cache had them", ["cache"]
)
PREPROCESS_REDACTIONS = Counter(
    "dayzero_preprocess_redactions_total", "regions redacted (faces, documents)", ["kind"]
)
