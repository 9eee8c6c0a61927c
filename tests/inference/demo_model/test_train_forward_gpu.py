"""On the H200: the training forward's fla path (chunk_kda forward + backward, bf16) against the fp32 reference."""

from __future__ import annotations

import pytest
import torch

from inference.config import parse_config
from inference.demo_model.spec import demo_config
from inference.model.factory import build_model
from training.demo_model.train_forward import text_model, train_logits


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.float() - b.float()).norm() / b.float().norm())


@pytest.mark.gpu
def test_fla_training_forward_and_grads_match_reference():
    model = build_model(parse_config(demo_config(512, 511)), seed=2, device="cuda")
    model.train()
    ids = torch.randint(0, 500, (4, 96), generator=torch.Generator().manual_seed(0)).cuda()
    grads = {}
    logits = {}
    for mode in ("ref", "fla"):
        model.zero_grad(set_to_none=True)
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=mode == "fla"):
            out = train_logits(model, ids, kda=mode)
        out.float().logsumexp(-1).mean().backward()
        logits[mode] = out.detach()
        lm = text_model(model)
        grads[mode] = {n: p.grad.detach().clone() for n, p in lm.named_parameters() if p.grad is not None}
    # bf16 autocast on one side: agreement to bf16 accuracy, not bit-exactness
    assert _rel(logits["fla"], logits["ref"]) < 3e-2
    kda_q = [n for n in grads["ref"] if n.endswith("self_attn.q_proj.weight")]
    assert kda_q
    for n in kda_q + [n for n in grads["ref"] if n.endswith(("A_log", "dt_bias"))]:
        assert _rel(grads["fla"][n], grads["ref"][n]) < 1e-1, n
