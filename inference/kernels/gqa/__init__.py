"""Grouped-query softmax attention over a paged K|V cache (Qwen3-Next's full-attention layers).

Reference only so far (family `gqa` in the registry, which reports it): a paged flash kernel plugs
in behind `gqa_paged_attention`'s signature as `fast.py`.
"""

from __future__ import annotations

from inference.kernels.gqa.reference import gqa_paged_attention, gqa_write_kv

__all__ = ["gqa_paged_attention", "gqa_write_kv"]
