"""Compute seams of the model: one function per op, a pure-PyTorch reference beside each fast path.

Our own Triton kernels (paged MLA decode, DSA top-k sparse attention) plug in here behind the same
signatures; the layers never call a backend directly.
"""

from inference.model.ops.kda import causal_conv_varlen, kda_gate, kda_varlen, l2norm
from inference.model.ops.mla import dsa_topk_indices, dsa_topk_paged, mla_decode_paged, mla_prefill_varlen

__all__ = [
    "causal_conv_varlen",
    "dsa_topk_indices",
    "dsa_topk_paged",
    "kda_gate",
    "kda_varlen",
    "l2norm",
    "mla_decode_paged",
    "mla_prefill_varlen",
]
