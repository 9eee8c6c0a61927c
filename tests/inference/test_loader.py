"""Checkpoint round trip: sharded safetensors + SHA-256 manifest, corruption refused by file name."""

from __future__ import annotations

import json

import pytest
import torch

from inference.config import parse_config
from inference.loader import (
    INDEX_FILE,
    MANIFEST_FILE,
    ChecksumError,
    WeightLoadError,
    load_weights,
    save_sharded,
)
from inference.model import ForwardMeta, HybridCacheSpec, HybridCacheTensors, build_model
from testing.kimi_hf_mapping import tiny_kimi_linear_config


@pytest.fixture(scope="module")
def spec():
    return parse_config(tiny_kimi_linear_config())


@pytest.fixture
def checkpoint(tmp_path, spec):
    model = build_model(spec, seed=7)
    files = save_sharded(model.state_dict(), tmp_path, max_shard_bytes=200_000)
    return model, files, tmp_path


def _logits(model, spec):
    cache = HybridCacheTensors.allocate(
        HybridCacheSpec.from_model_spec(spec, torch.float32), 4, 16, 1, "cpu", torch.float32
    )
    meta = ForwardMeta.for_sequences([12], [0], [[0]], 16, [0])
    with torch.no_grad():
        return model(torch.arange(12), meta, cache)


def test_round_trip_is_exact(checkpoint, spec):
    model, files, folder = checkpoint
    assert len(files) > 1, "the test wants several shards"
    index = json.loads((folder / INDEX_FILE).read_text())
    assert set(index["weight_map"]) == set(model.state_dict())
    loaded = build_model(spec, load_format="safetensors", path=folder)
    for name, t in model.state_dict().items():
        assert torch.equal(loaded.state_dict()[name], t), name
    assert torch.equal(_logits(loaded, spec), _logits(model, spec))


def test_one_corrupted_byte_is_refused_naming_the_file(checkpoint, spec):
    _, files, folder = checkpoint
    victim = folder / files[1]
    data = bytearray(victim.read_bytes())
    data[len(data) // 2] ^= 0x01
    victim.write_bytes(bytes(data))
    target = build_model(spec, seed=99)
    before = {k: v.clone() for k, v in target.state_dict().items()}
    with pytest.raises(ChecksumError, match=files[1]) as info:
        load_weights(target, folder)
    assert info.value.file == files[1]
    assert "SHA-256 mismatch" in str(info.value)
    # verified before any tensor was used: the target is untouched
    assert all(torch.equal(target.state_dict()[k], v) for k, v in before.items())


def test_missing_shard_is_refused(checkpoint, spec):
    _, files, folder = checkpoint
    (folder / files[0]).unlink()
    with pytest.raises(ChecksumError, match="missing"):
        build_model(spec, load_format="safetensors", path=folder)


def test_without_manifest_loads_and_casts_dtype(checkpoint, spec):
    model, _, folder = checkpoint
    (folder / MANIFEST_FILE).unlink()
    loaded = build_model(spec, load_format="safetensors", path=folder, dtype=torch.bfloat16)
    w = loaded.state_dict()["model.layers.0.self_attn.q_proj.weight"]
    assert w.dtype == torch.bfloat16
    assert torch.equal(w, model.state_dict()["model.layers.0.self_attn.q_proj.weight"].bfloat16())
    assert loaded.state_dict()["model.layers.0.self_attn.A_log"].dtype == torch.float32  # decay stays fp32


def test_shape_mismatch_and_missing_tensor_are_named(tmp_path, spec):
    model = build_model(spec, seed=1)
    state = dict(model.state_dict())
    state["model.layers.0.self_attn.A_log"] = state[
        "model.layers.0.self_attn.A_log"
    ].flatten()  # [H]: allowed
    del state["model.norm.weight"]
    save_sharded(state, tmp_path, manifest=False)
    with pytest.raises(WeightLoadError, match=r"missing.*model\.norm\.weight"):
        load_weights(build_model(spec), tmp_path)
    state["model.norm.weight"] = torch.ones(3)
    save_sharded(state, tmp_path, manifest=False)
    with pytest.raises(WeightLoadError, match=r"model\.norm\.weight.*shape"):
        load_weights(build_model(spec), tmp_path)


def test_dummy_weights_are_seeded(spec):
    a, b, c = build_model(spec, seed=3), build_model(spec, seed=3), build_model(spec, seed=4)
    w = "model.layers.1.block_sparse_moe.experts.0.w1.weight"
    assert torch.equal(a.state_dict()[w], b.state_dict()[w])
    assert not torch.equal(a.state_dict()[w], c.state_dict()[w])
    with pytest.raises(ValueError, match="load_format"):
        build_model(spec, load_format="pt")


def test_tied_embeddings_round_trip(tmp_path):
    spec = parse_config(tiny_kimi_linear_config(tie_word_embeddings=True))
    model = build_model(spec, seed=2)
    assert model.lm_head.weight is model.model.embed_tokens.weight
    save_sharded(model.state_dict(), tmp_path)
    index = json.loads((tmp_path / INDEX_FILE).read_text())
    assert "lm_head.weight" not in index["weight_map"]  # stored once
    loaded = build_model(spec, load_format="safetensors", path=tmp_path)
    assert loaded.lm_head.weight is loaded.model.embed_tokens.weight
    assert torch.equal(loaded.lm_head.weight, model.lm_head.weight)


def test_saving_after_a_forward_writes_the_fused_weights_as_separate_tensors(tmp_path, spec):
    """A forward re-points q/k/v (and other) parameters into fused buffers; saving must still
    write one independent tensor per published name, and loading must reproduce the logits."""
    model = build_model(spec, seed=3)
    before = _logits(model, spec)
    save_sharded(model.state_dict(), tmp_path, max_shard_bytes=200_000)
    loaded = build_model(spec, load_format="safetensors", path=tmp_path)
    assert torch.equal(_logits(loaded, spec), before)
