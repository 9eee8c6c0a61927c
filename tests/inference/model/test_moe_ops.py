"""Routed-expert compute: the grouped-GEMM path against the per-expert reference loop, and the
stacked weights of `SparseMoE` staying the published per-expert parameters."""

from __future__ import annotations

import pytest
import torch

from inference.config import MoESpec
from inference.kernels.moe_experts import moe_experts_grouped, moe_experts_reference
from inference.model.moe import SparseMoE
from testing.kimi_hf_mapping import FP32_REL_TOL, assert_close_rel


def _spec(**kw) -> MoESpec:
    base = dict(
        num_experts=8, top_k=3, intermediate_size=16, num_shared_experts=1, num_groups=1,
        topk_groups=1, renormalize=True, routed_scaling_factor=2.5,
    )  # fmt: skip
    base.update(kw)
    return MoESpec(**base)


def _moe(seed: int = 0) -> SparseMoE:
    torch.manual_seed(seed)
    moe = SparseMoE(32, _spec())
    for p in moe.parameters():
        torch.nn.init.normal_(p, std=0.2)
    moe.gate.e_score_correction_bias.normal_(std=0.1)
    return moe.eval()


@pytest.mark.parametrize("tokens", [1, 5, 40])
def test_grouped_equals_reference(tokens):
    moe = _moe()
    x = torch.randn(tokens, 32)
    with torch.no_grad():
        weights, ids = moe.gate(x)
        w1 = [e.w1.weight for e in moe.experts]
        w2 = [e.w2.weight for e in moe.experts]
        w3 = [e.w3.weight for e in moe.experts]
        ref = moe_experts_reference(x, weights, ids, w1, w2, w3)
        got = moe_experts_grouped(x, weights, ids, *moe._stacked())
    assert_close_rel(got, ref, FP32_REL_TOL, f"grouped vs reference, {tokens} tokens")


def test_stacks_are_the_published_parameters():
    """No second copy: each expert's w1/w2/w3 become views of the stacks, so loading a state dict
    by the published names changes what the grouped path computes; replacing a parameter (a cast)
    triggers a rebuild."""
    moe = _moe()
    sd = {k: v.clone() for k, v in moe.state_dict().items()}
    w13, w2 = moe._stacked()
    assert sorted(moe.state_dict()) == sorted(sd)
    assert moe.experts[3].w3.weight.data_ptr() == w13[3, 16:].data_ptr()
    assert moe.experts[5].w2.weight.data_ptr() == w2[5].data_ptr()
    sd["experts.3.w3.weight"] = torch.full((16, 32), 0.5)
    moe.load_state_dict(sd)
    assert torch.equal(w13[3, 16:], torch.full((16, 32), 0.5))
    assert moe._stacked()[0].data_ptr() == w13.data_ptr()  # still valid: loaded in place
    for p in moe.parameters():
        p.data = p.data.double()
    w13_new, _ = moe._stacked()
    assert w13_new.dtype == torch.float64 and w13_new.data_ptr() != w13.data_ptr()
    assert moe.experts[0].w1.weight.data_ptr() == w13_new.data_ptr()
