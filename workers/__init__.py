"""Celery app, queue routing, and the job functions that wrap `preprocess` and `tools`."""
