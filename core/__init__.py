"""Contracts every package shares (outage classification and its wait-out loop, the backoff
formula). Imports nothing of ours, so `inference`, `tools`, `workers` and `orchestrator` may all
use it."""
