"""Our attention kernels: each op a Triton fast path beside its fp32 PyTorch reference.

`use_fast(tensor)` is the one rule for which of the two runs: the Triton path on CUDA tensors
(or anywhere under `TRITON_INTERPRET=1`, which is how the CPU tests exercise the kernels), the
reference otherwise. `DAYZERO_KERNELS=reference` forces the references (A/B measurements).
"""

from __future__ import annotations

import os

from torch import Tensor

__all__ = ["use_fast"]


def use_fast(t: Tensor) -> bool:
    """Whether the op on `t` runs its Triton kernel (see the module docstring)."""
    if os.environ.get("DAYZERO_KERNELS", "fast") == "reference":
        return False
    return t.is_cuda or os.environ.get("TRITON_INTERPRET") == "1"
