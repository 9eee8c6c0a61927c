"""The split rule (`inference/parallel/split_rule.py`) is the one place both the runtime's shard
and `dayzero analyze`'s count read: analyze's parameter inventory names the modules' real
parameters, and a change to the rule moves both figures together."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from inference.analyze import rank_params
from inference.analyze.params import mixer_param_numels
from inference.config import GDN, GQA, KDA, MLA, ModelSpec, load_config, parse_config
from inference.parallel.config import ParallelConfig
from inference.parallel.split_rule import MIXER_SPLITS
from inference.parallel.weights import _meta_model, rank_weight_bytes

CONFIGS = Path("inference/configs")
MIXER_ATTR = {KDA: "self_attn", MLA: "self_attn", GDN: "linear_attn", GQA: "self_attn"}


def _specs() -> list[ModelSpec]:
    cfg = json.loads((CONFIGS / "tiny_deepseek_v32.json").read_text())  # MLA with q_lora_rank, DSA
    dropped = ("q_lora_rank", "index_n_heads", "index_head_dim", "index_topk")
    no_lora = {k: v for k, v in cfg.items() if k not in dropped}  # MLA's q_proj, no indexer
    no_lora |= {"model_type": "deepseek_v3", "architectures": ["DeepseekV3ForCausalLM"]}
    names = ("tiny_hybrid_vl", "tiny_deepseek_v32", "tiny_qwen3_next")
    return [*(load_config(CONFIGS / f"{n}.json") for n in names), parse_config(no_lora)]


def test_analyze_inventory_is_the_mixers_parameters_and_names_every_split() -> None:
    """Per layer kind, analyze's `{path: numel}` equals the built mixer's parameters (the DSA
    indexer as one entry), and every path the rule splits is a real parameter of some model."""
    named: dict[str, set[str]] = {kind: set() for kind in MIXER_SPLITS}
    for spec in _specs():
        model = _meta_model(spec, torch.float32)
        for i, kind in enumerate(spec.layer_kinds):
            mixer = getattr(model.model.layers[i], MIXER_ATTR[kind])
            got: dict[str, int] = {}
            for name, p in mixer.named_parameters():
                key = "indexer" if name.startswith("indexer.") else name
                got[key] = got.get(key, 0) + p.numel()
            want = {k: v for k, v in mixer_param_numels(spec, kind).items() if v or k != "indexer"}
            assert got == want, (kind, spec.model_type)
            named[kind] |= set(got)
    for kind, splits in MIXER_SPLITS.items():
        assert set(splits) <= named[kind], (kind, set(splits) - named[kind])


def test_a_change_to_the_rule_changes_the_runtime_and_analyze_alike(monkeypatch: pytest.MonkeyPatch) -> None:
    """Replicating KDA's `b_proj` instead of splitting it by head (an edit of the rule only)
    grows both the runtime's meta shard and analyze's count by the same half of each b_proj."""
    spec = load_config(CONFIGS / "tiny_hybrid_vl.json")
    config = ParallelConfig(2, 1)
    before = rank_params(spec, 2)
    assert before == rank_weight_bytes(spec, config, torch.float32) // 4
    monkeypatch.delitem(MIXER_SPLITS[KDA], "b_proj.weight")
    after = rank_params(spec, 2)
    half_b = spec.hidden_size * spec.kda.num_heads // 2
    assert after - before == spec.layer_kinds.count(KDA) * half_b > 0
    assert after == rank_weight_bytes(spec, config, torch.float32) // 4


@pytest.mark.parametrize(
    ("name", "tp", "ep"),
    [
        ("tiny_deepseek_v32", 2, 2),
        ("tiny_deepseek_v32", 1, 2),
        ("tiny_qwen3_next", 2, 2),
        ("tiny_hybrid_vl", 1, 4),
    ],
)
def test_rank_params_with_ep_equal_the_meta_shard(name: str, tp: int, ep: int) -> None:
    """On a TP x EP mesh (experts over EP, the shared expert over every rank or the TP group)."""
    spec = load_config(CONFIGS / f"{name}.json")
    assert rank_params(spec, tp, ep) == rank_weight_bytes(spec, ParallelConfig(tp, ep), torch.float32) // 4
