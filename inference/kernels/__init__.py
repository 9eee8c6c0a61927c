"""Our op families: each a fast path (Triton, or fla / `torch._grouped_mm`) beside its fp32 PyTorch
reference, under `kernels/<op>/`.

Which of the two runs is decided in one place, `registry.py` (`DAYZERO_KERNELS` included); the
families' dispatchers ask it through `use_fast`, re-exported here for them.
"""

from __future__ import annotations

from inference.kernels.registry import use_fast

__all__ = ["use_fast"]
