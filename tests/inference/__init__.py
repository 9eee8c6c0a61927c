"""Inference tests.

Where no CUDA device is, Triton's interpreter is switched on here, before any test module imports
triton (Triton reads `TRITON_INTERPRET` when a kernel, its own `tl.sum` and `tl.cdiv` included, is
decorated): the kernel tests under `kernels/` then run our Triton kernels on the CPU. The model's
dispatch (`inference.kernels.use_fast`) ignores the variable, so every other test keeps the
PyTorch references on the CPU.
"""

import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
