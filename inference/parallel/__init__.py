"""Multi-process tensor, expert and pipeline parallelism for the engine (torch.distributed: gloo /
NCCL), on one host or several.

`config` (the mesh and errors), `comm` (groups, collectives, stage links, traffic counts), `layers`
(row/vocab-parallel), `moe` (EP dispatch/combine), `sharding` (how each layer splits), `pipeline`
(a stage's part of the model, its micro-batched step, the engine whose steps overlap through the
stages), `weights` (building a rank's shard), `worker` (a rank's process), `runner` (the driver's
supervisor), `cluster` (several hosts: rendezvous, node launcher), `launch` (the engine).
"""

from inference.parallel.config import ParallelConfig, ParallelConfigError, StepFailedError, WorkerFailedError

__all__ = ["ParallelConfig", "ParallelConfigError", "StepFailedError", "WorkerFailedError"]
