"""The training forward computes what the engine computes, and its gradients reach every text parameter."""

from __future__ import annotations

import pytest
import torch

from inference.config import parse_config
from inference.demo_model.spec import demo_config, dsa_variant
from inference.model.cache_tensors import HybridCacheSpec, HybridCacheTensors
from inference.model.factory import build_model
from inference.model.forward_meta import ForwardMeta
from training.demo_model.train_forward import text_model, train_logits


def _small(vocab: int = 300) -> dict:
    return demo_config(vocab, image_token_id=vocab - 1)


def _engine_logits(model, ids: torch.Tensor) -> torch.Tensor:
    """Each row as its own sequence through the serving forward (paged cache, fresh slots)."""
    spec = text_model(model).spec
    b, length = ids.shape
    block = 16
    nblk = -(-length // block)
    cache = HybridCacheTensors.allocate(
        HybridCacheSpec.from_model_spec(spec, torch.float32), b * nblk + 1, block, b, "cpu", torch.float32
    )
    tables = [[1 + r * nblk + j for j in range(nblk)] for r in range(b)]
    meta = ForwardMeta.for_sequences([length] * b, [0] * b, tables, block, list(range(b)))
    return model(ids.reshape(-1), meta, cache).view(b, length, -1)


def test_train_forward_matches_engine_forward():
    model = build_model(parse_config(_small()), seed=3)
    ids = torch.randint(0, 290, (3, 40), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        want = _engine_logits(model, ids)
        got = train_logits(model, ids, kda="ref")
    rel = (got - want).norm() / want.norm()
    assert rel < 1e-4, rel


def test_train_forward_with_a_shared_prefix_matches_engine_forward():
    model = build_model(parse_config(_small()), seed=4)
    gen = torch.Generator().manual_seed(2)
    prefix = torch.randint(0, 290, (37,), generator=gen)
    rows = torch.randint(0, 290, (3, 21), generator=gen)
    with torch.no_grad():
        want = _engine_logits(model, torch.cat([prefix.expand(3, -1), rows], dim=1))[:, 37:]
        got = train_logits(model, rows, prefix=prefix, kda="ref")
    rel = (got - want).norm() / want.norm()
    assert rel < 1e-4, rel


def test_train_forward_gradients_reach_every_text_parameter():
    model = build_model(parse_config(_small()), seed=1)
    model.train()
    ids = torch.randint(0, 290, (2, 24), generator=torch.Generator().manual_seed(1))
    loads: list[torch.Tensor] = []
    logits = train_logits(model, ids, prefix=ids[0, :5], kda="ref", expert_loads=loads)
    torch.nn.functional.cross_entropy(
        logits[:, :-1].reshape(-1, logits.shape[-1]), ids[:, 1:].reshape(-1)
    ).backward()
    lm = text_model(model)
    no_grad = [n for n, p in lm.named_parameters() if p.grad is None or not torch.isfinite(p.grad).all()]
    # experts no token was routed to get no gradient in this tiny batch; everything else must
    no_grad = [n for n in no_grad if ".experts." not in n]
    assert no_grad == []
    assert len(loads) == 5 and all(int(x.sum()) == 2 * 24 * 2 for x in loads)


def test_train_forward_rejects_bad_input():
    model = build_model(parse_config(_small()), seed=0)
    with pytest.raises(ValueError, match=r"\[B, L\]"):
        train_logits(model, torch.zeros(5, dtype=torch.long))
    with pytest.raises(ValueError, match="prefix"):
        train_logits(model, torch.zeros(1, 4, dtype=torch.long), prefix=torch.zeros(0, dtype=torch.long))
    with pytest.raises(ValueError, match="kda must be"):
        train_logits(model, torch.zeros(1, 4, dtype=torch.long), kda="triton")
    dsa = build_model(parse_config(dsa_variant(_small())), seed=0)
    with pytest.raises(ValueError, match="DSA"):
        train_logits(dsa, torch.zeros(1, 4, dtype=torch.long))


def test_zero_image_embeddings_match_the_engine_with_a_zeroed_projector():
    """Training gives image placeholders a zero embedding; the engine feeds the projector's output
    there, which is zero once the projector's last layer is (as the trainer saves it)."""
    cfg = _small()
    model = build_model(parse_config(cfg), seed=6)
    with torch.no_grad():
        model.mm_projector.proj[-1].weight.zero_()
        model.mm_projector.proj[-1].bias.zero_()
    pad = cfg["image_token_id"]
    ids = torch.randint(0, 290, (1, 40), generator=torch.Generator().manual_seed(3))
    ids[0, 10:30] = pad
    spec = text_model(model).spec
    cache = HybridCacheTensors.allocate(
        HybridCacheSpec.from_model_spec(spec, torch.float32), 4, 16, 1, "cpu", torch.float32
    )
    meta = ForwardMeta.for_sequences([40], [0], [[1, 2, 3]], 16, [0])
    merged = torch.rand(20 * 4, model.mm_projector.pre_norm.normalized_shape[0])
    with torch.no_grad():
        image_embeds = model.mm_projector(merged.view(20, 4, -1))
        assert not image_embeds.any()
        want = model(ids.reshape(-1), meta, cache, image_embeds=image_embeds).view(1, 40, -1)
        got = train_logits(model, ids, kda="ref", zero_token_id=pad)
        other = train_logits(model, ids, kda="ref")
    assert (got - want).norm() / want.norm() < 1e-4
    assert (other - want).norm() / want.norm() > 1e-3  # the placeholder's own embedding differs


def test_dense_expert_combine_equals_the_per_expert_reference():
    from inference.kernels.moe_experts import moe_experts_reference
    from inference.model.moe import SparseMoE
    from training.demo_model.train_forward import _experts_dense

    model = build_model(parse_config(_small()), seed=5)
    moe = next(m for m in model.modules() if isinstance(m, SparseMoE))
    x = torch.randn(37, _small()["text_config"]["hidden_size"], generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        weights, ids = moe.gate(x)
        want = moe_experts_reference(
            x, weights, ids, *([getattr(e, w).weight for e in moe.experts] for w in ("w1", "w2", "w3"))
        )
        got = _experts_dense(x, weights, ids, moe)
    assert torch.allclose(got, want, rtol=1e-5, atol=1e-5)
