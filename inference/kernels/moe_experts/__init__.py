"""Routed-expert compute: the weighted sum of the chosen experts' SwiGLU outputs `[T, hidden]`.

Both paths take the router's choice (`weights [T, k]`, `ids [T, k]`): `moe_experts_grouped` (two
grouped GEMMs over stacked weights, no host sync, fixed shapes: CUDA-graph capturable) and
`moe_experts_reference` (the per-expert loop over per-expert weights). The two take the weights in
different layouts, so the caller (`SparseMoE`) holds both and asks `use_grouped_moe` (the
registry's rule, family `moe_experts`) which one runs.
"""

from __future__ import annotations

from inference.kernels.moe_experts.fast import moe_experts_grouped
from inference.kernels.moe_experts.reference import moe_experts_reference
from inference.kernels.registry import use_grouped_moe

__all__ = ["moe_experts_grouped", "moe_experts_reference", "use_grouped_moe"]
