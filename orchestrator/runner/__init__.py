"""The runner: claims tasks under a lease and executes one step per transaction."""

from orchestrator.runner.context import RunnerConfig, StepContext
from orchestrator.runner.loop import Runner

__all__ = ["Runner", "RunnerConfig", "StepContext"]
