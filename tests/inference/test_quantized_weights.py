"""Quantized checkpoints (DeepSeek block FP8, compressed-tensors INT4) loaded as published.

The test quantizes a tiny random model's weights with its own reference quantizer, writes them as
the published checkpoints lay them out (sharded, companions sometimes in another shard), loads
them through `build_model`, and checks:

* each dequantized weight against an independent tile-by-tile / element-by-element dequant
  written here (and, for FP8, transformers' own `Fp8Dequantize`);
* the loaded model's logits against transformers' DeepSeek model holding those same dequantized
  weights (fp32, 1e-4). transformers cannot load the files itself on this machine: its FP8 loader
  needs `accelerate` and its INT4 loader the `compressed-tensors` package, neither a dependency;
* `dayzero analyze`'s bytes on disk (exactly the tensor bytes written) and in memory.
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import pytest
import torch
from safetensors import safe_open

from inference.analyze.weights import linear_weights, weight_bytes
from inference.config import parse_config
from inference.loader import INDEX_FILE, WeightLoadError, save_sharded
from inference.model import ForwardMeta, HybridCacheSpec, HybridCacheTensors, build_model
from inference.quantized_weights import dequantize_fp8_block, dequantize_int4_packed, unpack_int4
from testing.deepseek_hf_mapping import published_to_hf, tiny_deepseek_v32_config
from testing.kimi_hf_mapping import FP32_REL_TOL, assert_close_rel, rel_err

FP8_MAX = 448.0  # largest finite float8_e4m3fn


# ------------------------------------------------------------ the test's own reference quantizers


def ref_quantize_fp8(w: torch.Tensor, block: tuple[int, int]) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-tile absmax scaling, tile by tile (the last tiles partial), as DeepSeek publishes it."""
    rows, cols = w.shape
    br, bc = block
    q = torch.empty(rows, cols, dtype=torch.float8_e4m3fn)
    s = torch.empty(math.ceil(rows / br), math.ceil(cols / bc), dtype=torch.float32)
    for i in range(s.shape[0]):
        for j in range(s.shape[1]):
            tile = w[i * br : (i + 1) * br, j * bc : (j + 1) * bc].float()
            s[i, j] = tile.abs().max().clamp(min=1e-12) / FP8_MAX
            q[i * br : (i + 1) * br, j * bc : (j + 1) * bc] = (tile / s[i, j]).to(torch.float8_e4m3fn)
    return q, s


def ref_dequant_fp8(q: torch.Tensor, s: torch.Tensor, block: tuple[int, int]) -> torch.Tensor:
    br, bc = block
    out = torch.empty(q.shape, dtype=torch.float32)
    for i in range(s.shape[0]):
        for j in range(s.shape[1]):
            out[i * br : (i + 1) * br, j * bc : (j + 1) * bc] = (
                q[i * br : (i + 1) * br, j * bc : (j + 1) * bc].float() * s[i, j]
            )
    return out


def ref_quantize_int4(w: torch.Tensor, group: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Symmetric group INT4: bf16 scale = absmax / 7 per `group` columns, q in [-8, 7]."""
    rows, cols = w.shape
    s = torch.empty(rows, math.ceil(cols / group), dtype=torch.bfloat16)
    q = torch.empty(rows, cols, dtype=torch.int8)
    for g in range(s.shape[1]):
        part = w[:, g * group : (g + 1) * group].float()
        s[:, g] = (part.abs().amax(dim=1).clamp(min=1e-8) / 7).to(torch.bfloat16)
        q[:, g * group : (g + 1) * group] = (
            (part / s[:, g : g + 1].float()).round().clamp(-8, 7).to(torch.int8)
        )
    return q, s


def ref_pack_int4(q: torch.Tensor) -> torch.Tensor:
    """compressed-tensors pack-quantized, element by element: value j of each eight in bits 4j.."""
    rows, cols = q.shape
    words = math.ceil(cols / 8)
    out = torch.zeros(rows, words, dtype=torch.int32)
    for r in range(rows):
        for c in range(words):
            word = 0
            for j in range(8):
                k = c * 8 + j
                nibble = int(q[r, k]) + 8 if k < cols else 0
                word |= nibble << (4 * j)
            out[r, c] = word - (1 << 32) if word >= 1 << 31 else word  # two's complement int32
    return out


def ref_dequant_int4(q: torch.Tensor, s: torch.Tensor, group: int) -> torch.Tensor:
    out = torch.empty(q.shape, dtype=torch.float32)
    for c in range(q.shape[1]):
        out[:, c] = q[:, c].float() * s[:, c // group].float()
    return out


# ------------------------------------------------------------ the dequantizers against them


def test_fp8_partial_tiles_match_the_tile_by_tile_reference():
    w = torch.randn(300, 200, generator=torch.Generator().manual_seed(0))
    q, s = ref_quantize_fp8(w, (128, 128))
    assert s.shape == (3, 2)  # 300 rows -> 2 full tiles + 44; 200 cols -> 128 + 72
    got = dequantize_fp8_block(q, s, (128, 128))
    assert torch.equal(got, ref_dequant_fp8(q, s, (128, 128)))
    assert rel_err(got, w) < 0.04  # e4m3 keeps 3 mantissa bits
    with pytest.raises(ValueError, match="scale grid"):
        dequantize_fp8_block(q, s[:, :1], (128, 128))


def test_fp8_matches_transformers_dequant():
    from transformers.integrations.finegrained_fp8 import Fp8Dequantize

    w = torch.randn(256, 384, generator=torch.Generator().manual_seed(1))
    q, s = ref_quantize_fp8(w, (128, 128))
    want = Fp8Dequantize(None)._dequantize_one(q, s, output_dtype=torch.float32)
    assert torch.equal(dequantize_fp8_block(q, s, (128, 128)), want)


def test_int4_bit_layout_is_compressed_tensors():
    # value j of eight in bits 4j..4j+3, stored as q + 8
    assert ref_pack_int4(torch.arange(-8, 0, dtype=torch.int8)[None]).item() == 0x76543210
    assert ref_pack_int4(torch.full((1, 8), 7, dtype=torch.int8)).item() == -1  # 0xFFFFFFFF
    q = torch.randint(-8, 8, (40, 70), generator=torch.Generator().manual_seed(2), dtype=torch.int8)
    packed = ref_pack_int4(q)
    assert packed.shape == (40, 9)  # 70 columns -> 9 words, the last one padded
    assert torch.equal(unpack_int4(packed, 70), q)


def test_int4_partial_groups_match_the_reference():
    w = torch.randn(40, 70, generator=torch.Generator().manual_seed(3))
    q, s = ref_quantize_int4(w, 32)
    assert s.shape == (40, 3)  # 32 + 32 + 6 columns
    got = dequantize_int4_packed(ref_pack_int4(q), s, (40, 70), 32)
    assert torch.equal(got, ref_dequant_int4(q, s, 32))
    assert rel_err(got, w) < 0.2  # 4 bits
    with pytest.raises(ValueError, match="weight_scale"):
        dequantize_int4_packed(ref_pack_int4(q), s[:, :2], (40, 70), 32)


# ------------------------------------------------------------ whole checkpoints

FP8_CONFIG = {
    "quant_method": "fp8",
    "fmt": "e4m3",
    "activation_scheme": "dynamic",
    "weight_block_size": [8, 8],
}
INT4_CONFIG = {
    "quant_method": "compressed-tensors", "format": "pack-quantized", "quantization_status": "compressed",
    "config_groups": {"group_0": {"targets": ["Linear"], "input_activations": None, "weights": {
        "num_bits": 4, "type": "int", "symmetric": True, "strategy": "group", "group_size": 32, "dynamic": False,
        "actorder": None}}},
    "ignore": ["lm_head", "re:.*self_attn.*", "re:.*shared_experts.*", "re:.*mlp\\.(gate|up|gate_up|down)_proj.*"],
}  # fmt: skip
# the published conventions, written here independently of the analysis' rules
FP8_STORED_PLAIN = re.compile(
    r"(embed_tokens|lm_head|norm|\.mlp\.gate\.|weights_proj|e_score_correction_bias)"
)
INT4_QUANTIZED = re.compile(r"\.mlp\.experts\.\d+\.(gate|up|down)_proj\.weight$")  # Kimi-K2: routed experts


def _config(kind: str) -> dict:
    cfg = tiny_deepseek_v32_config(torch_dtype="bfloat16")
    if kind == "fp8":
        return dict(cfg, quantization_config=FP8_CONFIG)
    cfg = {k: v for k, v in cfg.items() if not k.startswith("index_")}  # Kimi-K2 has no indexer
    return dict(cfg, model_type="kimi_k2", quantization_config=INT4_CONFIG)


def _quantized_checkpoint(kind: str, state: dict[str, torch.Tensor]) -> tuple[dict, dict]:
    """(tensors as the published checkpoint stores them, the dequantized weights they stand for)."""
    stored, companions, dequant = {}, {}, {}
    for name, t in state.items():
        if kind == "fp8" and t.dim() == 2 and not FP8_STORED_PLAIN.search(name):
            q, s = ref_quantize_fp8(t, (8, 8))
            stored[name], companions[name + "_scale_inv"] = q, s
            dequant[name] = ref_dequant_fp8(q, s, (8, 8))
        elif kind == "int4" and INT4_QUANTIZED.search(name):
            q, s = ref_quantize_int4(t, 32)
            base = name.removesuffix("weight")
            stored[base + "weight_packed"], companions[base + "weight_scale"] = ref_pack_int4(q), s
            companions[base + "weight_shape"] = torch.tensor(t.shape)
            dequant[name] = ref_dequant_int4(q, s, 32)
        else:
            stored[name] = t.to(torch.bfloat16)
            dequant[name] = stored[name].float()
    # companions written last, so the small shards put many of them apart from their weights
    return stored | companions, dequant


def _tensors(folder: Path) -> dict[str, torch.Tensor]:
    """Every tensor of the checkpoint's files, as stored."""
    out = {}
    for f in folder.glob("*.safetensors"):
        with safe_open(str(f), framework="pt") as sf:
            names = sf.keys()
            out.update({n: sf.get_tensor(n) for n in names})
    return out


def _write(kind: str, folder: Path) -> tuple[dict, object, dict]:
    """(config, spec, dequantized reference state) of a tiny model written quantized to `folder`."""
    cfg = _config(kind)
    spec = parse_config(cfg)
    stored, dequant = _quantized_checkpoint(kind, dict(build_model(spec, seed=0).state_dict()))
    save_sharded(stored, folder, max_shard_bytes=40_000)  # small shards: some scales land apart
    (folder / "config.json").write_text(json.dumps(cfg))
    return cfg, spec, dequant


@pytest.fixture(scope="module", params=["fp8", "int4"])
def loaded(request, tmp_path_factory):
    kind = request.param
    folder = tmp_path_factory.mktemp(kind)
    cfg, spec, dequant = _write(kind, folder)
    model = build_model(spec, load_format="safetensors", path=folder)
    return kind, cfg, spec, folder, model, dequant


def test_companions_split_across_shards_are_found(loaded):
    kind, _, _, folder, _, _ = loaded
    weight_map = json.loads((folder / INDEX_FILE).read_text())["weight_map"]
    if kind == "fp8":
        pairs = [(n, n.removesuffix("_scale_inv")) for n in weight_map if n.endswith(".weight_scale_inv")]
    else:
        pairs = [(n, n.removesuffix("scale") + "packed") for n in weight_map if n.endswith(".weight_scale")]
    assert pairs and all(w in weight_map for _, w in pairs)
    apart = [c for c, w in pairs if weight_map[c] != weight_map[w]]
    assert apart, "the shard size should split at least one weight from its companion"


def test_dequantized_weights_are_the_reference(loaded):
    _, _, _, _, model, dequant = loaded
    got = model.state_dict()
    assert set(got) == set(dequant)
    for name, t in got.items():
        assert torch.equal(t, dequant[name]), name


@torch.no_grad()
def test_logits_match_transformers_on_the_dequantized_weights(loaded):
    import transformers

    kind, cfg, spec, _, model, dequant = loaded
    hc_cls = transformers.DeepseekV32Config if kind == "fp8" else transformers.DeepseekV3Config
    lm_cls = transformers.DeepseekV32ForCausalLM if kind == "fp8" else transformers.DeepseekV3ForCausalLM
    skip = ("architectures", "torch_dtype", "quantization_config", "model_type")
    hc = hc_cls(**{k: v for k, v in cfg.items() if k not in skip})
    hc._attn_implementation = "eager"
    ref = lm_cls(hc).eval()
    ref.load_state_dict(published_to_hf(dequant), strict=True)
    ids = torch.randint(0, spec.vocab_size, (24,), generator=torch.Generator().manual_seed(4))
    cache = HybridCacheTensors.allocate(
        HybridCacheSpec.from_model_spec(spec, torch.float32), 8, 8, 1, "cpu", torch.float32
    )
    got = model(ids, ForwardMeta.for_sequences([24], [0], [[3, 0, 5]], 8, [0]), cache)
    assert_close_rel(got, ref(ids[None]).logits[0], FP32_REL_TOL, f"{kind} logits")


def test_analyze_bytes_on_disk_and_in_memory(loaded):
    kind, _, spec, folder, _, _ = loaded
    on_disk = sum(t.numel() * t.element_size() for t in _tensors(folder).values())
    b = weight_bytes(spec)
    assert b.disk == on_disk, (kind, b, on_disk)
    bf16 = build_model(spec, load_format="safetensors", path=folder, dtype=torch.bfloat16)
    params = sum(p.numel() * p.element_size() for p in bf16.parameters())
    fp32_buffers = sum(x.numel() for x in bf16.buffers())  # the router correction bias stays fp32
    assert b.memory == params + 2 * fp32_buffers
    assert b.disk < b.memory if kind == "int4" else b.disk < 0.8 * b.memory


def test_linear_inventory_is_the_built_models(loaded):
    """`linear_weights` (what the analysis quantizes) names every 2-D weight of the served model."""
    _, _, spec, _, model, _ = loaded
    built = {n.removesuffix(".weight"): tuple(t.shape) for n, t in model.state_dict().items() if t.dim() == 2}
    built.pop("model.embed_tokens")
    assert {w.name: (w.rows, w.cols) for w in linear_weights(spec)} == built


def test_refusals(tmp_path):
    """A quantized checkpoint under a config without quantization_config, a weight without its
    scale, a scale grid of the wrong shape: each refused, naming what is wrong."""
    cfg, spec, _ = _write("fp8", tmp_path / "good")
    plain = parse_config({k: v for k, v in cfg.items() if k != "quantization_config"})
    with pytest.raises(WeightLoadError, match="no quantization_config"):
        build_model(plain, load_format="safetensors", path=tmp_path / "good")
    state = _tensors(tmp_path / "good")
    name = "model.layers.0.self_attn.o_proj.weight_scale_inv"
    for i, (broken, match) in enumerate(
        [
            ({k: v for k, v in state.items() if k != name}, "float8_e4m3fn but has no weight_scale_inv"),
            ({**state, name: state[name][:1]}, "scale grid"),
        ]
    ):
        save_sharded(broken, tmp_path / str(i), manifest=False)
        with pytest.raises(WeightLoadError, match=match):
            build_model(spec, load_format="safetensors", path=tmp_path / str(i))


@pytest.mark.parametrize("name", ["kimi_linear", "tiny_qwen3_next.json", "tiny_hybrid_vl.json"])
def test_linear_inventory_of_the_other_families(name):
    from testing.kimi_hf_mapping import tiny_kimi_linear_config

    configs = Path(__file__).resolve().parents[2] / "inference" / "configs"
    cfg = tiny_kimi_linear_config() if name == "kimi_linear" else json.loads((configs / name).read_text())
    spec = parse_config(cfg)
    model = build_model(spec)
    root = "language_model." if spec.wrapper_type else ""
    built = {
        n.removesuffix(".weight"): tuple(t.shape)
        for n, t in model.state_dict().items()
        if t.dim() == 2 and n.startswith(root) and not n.endswith(("embed_tokens.weight", "A_log"))
    }
    assert {w.name: (w.rows, w.cols) for w in linear_weights(spec)} == built


@pytest.mark.gpu
def test_dequantized_on_the_gpu_equals_the_reference(tmp_path):
    """Loading onto CUDA dequantizes there (the pieces move first): the same fp32 values."""
    for kind in ("fp8", "int4"):
        _, spec, dequant = _write(kind, tmp_path / kind)
        model = build_model(spec, load_format="safetensors", path=tmp_path / kind, device="cuda")
        for name, t in model.state_dict().items():
            assert t.is_cuda and torch.equal(t.cpu(), dequant[name]), (kind, name)
