"""Shared helpers of the equivalence tests: tiny configs and the published <-> transformers-5 name map.

The published Kimi-Linear safetensors keep `q_conv1d/k_conv1d/v_conv1d`, `A_log`/`dt_bias`/`f_*_proj`
on the attention module, and `block_sparse_moe.experts.N.w1/w2/w3`; transformers 5 fuses and renames
them at load time (`conversion_mapping.py`, entry `kimi_linear`). Our model loads the published
layout natively, so the tests translate our state dict into transformers' names.
"""

from __future__ import annotations

import copy
import re
from typing import Any

import torch
from torch import Tensor

from inference.engine.factory import small_model_config

# fp32 tolerance of every CPU equivalence check: max |ours - ref| / max |ref|.
FP32_REL_TOL = 1e-4


def tiny_kimi_linear_config(**overrides: Any) -> dict[str, Any]:
    """A published-layout `kimi_linear` config small enough for a 2-core CI machine: the bundled
    small model's shape, with a 256-token vocabulary, special-token ids and a narrower dense MLP."""
    cfg: dict[str, Any] = {
        **small_model_config(),
        "vocab_size": 256,
        "intermediate_size": 96,
        "bos_token_id": 1,
        "eos_token_id": 2,
        "pad_token_id": 0,
    }
    cfg.update(overrides)
    return copy.deepcopy(cfg)


def published_to_hf(state: dict[str, Tensor]) -> dict[str, Tensor]:
    """Published `kimi_linear` names -> transformers 5 `KimiLinearForCausalLM` names."""
    out: dict[str, Tensor] = {}
    experts: dict[str, dict[int, dict[str, Tensor]]] = {}
    convs: dict[str, dict[str, Tensor]] = {}
    for name, t in state.items():
        m = re.match(r"(.*)\.block_sparse_moe\.experts\.(\d+)\.(w[123])\.weight$", name)
        if m:
            experts.setdefault(m.group(1), {}).setdefault(int(m.group(2)), {})[m.group(3)] = t
            continue
        m = re.match(r"(.*\.self_attn)\.([qkv])_conv1d\.weight$", name)
        if m:
            convs.setdefault(m.group(1), {})[m.group(2)] = t
            continue
        name = re.sub(r"\.self_attn\.(f_a_proj|f_b_proj|dt_bias|A_log)", r".self_attn.forget_gate.\1", name)
        out[name.replace(".block_sparse_moe.", ".mlp.")] = t
    for prefix, per in experts.items():
        ids = sorted(per)
        out[f"{prefix}.mlp.experts.gate_up_proj"] = torch.stack(
            [torch.cat([per[e]["w1"], per[e]["w3"]]) for e in ids]
        )
        out[f"{prefix}.mlp.experts.down_proj"] = torch.stack([per[e]["w2"] for e in ids])
    for prefix, qkv in convs.items():
        out[f"{prefix}.conv1d.weight"] = torch.cat([qkv["q"], qkv["k"], qkv["v"]])
    return out


def rel_err(ours: Tensor, ref: Tensor) -> float:
    """max |ours - ref| / max |ref| in fp64."""
    ours, ref = ours.double(), ref.double()
    return float((ours - ref).abs().max() / ref.abs().max().clamp_min(1e-30))


def assert_close_rel(ours: Tensor, ref: Tensor, tol: float = FP32_REL_TOL, what: str = "") -> None:
    """The named equivalence check of these tests; the tolerance is fixed, never relaxed in CI."""
    assert ours.shape == ref.shape, f"{what}: shape {tuple(ours.shape)} != {tuple(ref.shape)}"
    err = rel_err(ours, ref)
    assert err <= tol, f"{what}: relative error {err:.3e} > {tol:.0e}"
