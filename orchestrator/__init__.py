"""Durable orchestration of agent tasks: config, DB, state machine, runner, ingress, CLI. Never imports torch."""
