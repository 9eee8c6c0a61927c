"""Our attention kernels: each op a Triton fast path beside its fp32 PyTorch reference.

`use_fast(tensor)` is the one rule for which of the two runs: the Triton path on CUDA tensors,
the reference otherwise (the CPU tests call the fast modules directly, under Triton's
interpreter). `DAYZERO_KERNELS=reference` forces the references (A/B measurements);
`DAYZERO_KERNELS=interpret` (with `TRITON_INTERPRET=1`) runs the Triton paths on CPU tensors too,
in Triton's interpreter: the whole engine with the kernels' logic on, without a GPU (slow).
"""

from __future__ import annotations

import os

from torch import Tensor

__all__ = ["use_fast"]


def use_fast(t: Tensor) -> bool:
    """Whether the op on `t` runs its Triton kernel (see the module docstring)."""
    mode = os.environ.get("DAYZERO_KERNELS", "fast")
    if mode == "reference":
        return False
    return t.is_cuda or mode == "interpret"
