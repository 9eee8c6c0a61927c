"""Multi-process tensor and expert parallelism for the engine (torch.distributed: gloo / NCCL).

`config` (the mesh and errors), `comm` (groups, collectives), `layers` (row/vocab-parallel),
`moe` (EP dispatch/combine), `sharding` (how each layer splits), `weights` (building a rank's
shard), `worker` (a rank's process), `runner` (the driver's supervisor), `launch` (the engine).
"""

from inference.parallel.config import ParallelConfig, ParallelConfigError, StepFailedError, WorkerFailedError

__all__ = ["ParallelConfig", "ParallelConfigError", "StepFailedError", "WorkerFailedError"]
