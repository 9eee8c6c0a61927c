"""The runner: claims tasks under a lease and executes one step per transaction."""

from orchestrator.runner.loop import Runner, RunnerConfig

__all__ = ["Runner", "RunnerConfig"]
