"""MoonViT tower + projector (published layout) vs transformers' `kimi_k25` (fp32, CPU)."""

from __future__ import annotations

import importlib
import re

import pytest
import torch

from inference.config import parse_config
from inference.model import ForwardMeta, HybridCacheSpec, HybridCacheTensors, build_model
from testing.kimi_hf_mapping import FP32_REL_TOL, assert_close_rel, tiny_kimi_linear_config

mod = importlib.import_module("transformers.models.kimi_k25.modeling_kimi_k25")
from transformers import Kimi_K25Config  # noqa: E402

IMAGE_TOKEN = 200
VISION = {
    "patch_size": 14,
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_attention_heads": 4,
    "num_hidden_layers": 2,
    "pos_emb_height": 8,
    "pos_emb_width": 8,
    "pos_emb_time": 4,
    "merge_kernel_size": [2, 2],
    "hidden_act": "gelu_pytorch_tanh",
    "rope_parameters": {"rope_type": "axial", "rope_theta": 10000.0},
}


def _permute_rope_rows(t: torch.Tensor, heads: int) -> torch.Tensor:
    """Interleaved-pair rows (published wqkv) -> rotate-half rows (transformers' q/k_proj)."""
    half = t.shape[0] // heads // 2
    return t.reshape(heads, half, 2, *t.shape[1:]).transpose(1, 2).reshape(t.shape)


def published_vision_to_hf(state: dict[str, torch.Tensor], heads: int) -> tuple[dict, dict]:
    tower, proj = {}, {}
    renames = {
        "norm0": "norm1",
        "norm1": "norm2",
        "mlp.fc0": "mlp.fc1",
        "mlp.fc1": "mlp.fc2",
        "wo": "attn.proj",
    }
    for name, t in state.items():
        if name.startswith("mm_projector."):
            key = (
                name.removeprefix("mm_projector.").replace("proj.0", "in_proj").replace("proj.2", "out_proj")
            )
            proj[key] = t
        elif name.startswith("vision_tower."):
            key = name.removeprefix("vision_tower.").replace("encoder.blocks.", "layers.")
            key = key.replace("encoder.final_layernorm", "final_layernorm")
            key = key.replace("pos_emb.weight", "pos_emb.position_embeddings")
            if ".wqkv." in key:
                for part, chunk in zip(("q_proj", "k_proj", "v_proj"), t.chunk(3), strict=True):
                    tower[key.replace("wqkv", f"attn.{part}")] = (
                        chunk if part == "v_proj" else _permute_rope_rows(chunk, heads)
                    )
                continue
            key = re.sub(r"\.(norm0|norm1|mlp\.fc0|mlp\.fc1|wo)\.", lambda m: f".{renames[m.group(1)]}.", key)
            tower[key] = t
    return tower, proj


@pytest.fixture(scope="module")
def models():
    text = tiny_kimi_linear_config()
    cfg = {"model_type": "kimi_k25", "text_config": text, "vision_config": VISION, "image_token_id": IMAGE_TOKEN,
           "projection_hidden_size": 64, "projection_layer_norm_eps": 1e-5}  # fmt: skip
    spec = parse_config(cfg)
    ours = build_model(spec, seed=2)
    hcfg = Kimi_K25Config(**cfg)
    hcfg.vision_config._attn_implementation = "eager"
    tower = mod.Kimi_K25VisionModel(hcfg.vision_config).eval()
    proj = mod.Kimi_K25MultimodalProjection(hcfg).eval()
    t_state, p_state = published_vision_to_hf(ours.state_dict(), VISION["num_attention_heads"])
    tower.load_state_dict(t_state, strict=True)
    proj.load_state_dict(p_state, strict=True)
    return spec, ours, tower, proj


def _pixels(grid: torch.Tensor, seed: int = 0) -> torch.Tensor:
    n = int(grid.prod(-1).sum())
    return torch.randn(n, 3, 14, 14, generator=torch.Generator().manual_seed(seed))


@torch.no_grad()
@pytest.mark.parametrize(
    "grid",
    [[[1, 8, 8]], [[1, 4, 6], [1, 8, 8]], [[2, 4, 4]]],
    ids=["native-grid", "resized-two-images", "two-frames"],
)
def test_tower_and_projector_match_kimi_k25(models, grid):
    _, ours, tower, proj = models
    grid_thw = torch.tensor(grid)
    pixels = _pixels(grid_thw)
    want = proj(tower(pixels, grid_thw).pooler_output).squeeze(1)
    got = ours.encode_images(pixels, grid_thw)
    assert_close_rel(got, want, FP32_REL_TOL, f"image embeddings for grid {grid}")


@torch.no_grad()
def test_image_embeddings_replace_placeholders(models):
    spec, ours, _, _ = models
    grid_thw = torch.tensor([[1, 4, 6]])
    embeds = ours.encode_images(_pixels(grid_thw), grid_thw)  # 6 tokens
    ids = torch.tensor([5, 6] + [IMAGE_TOKEN] * 6 + [7, 8])
    cs = HybridCacheSpec.from_model_spec(spec, torch.float32)

    def run(image_embeds, input_ids):
        cache = HybridCacheTensors.allocate(cs, 4, 16, 1, "cpu", torch.float32)
        meta = ForwardMeta.for_sequences([10], [0], [[0]], 16, [0])
        return ours(input_ids, meta, cache, image_embeds=image_embeds)

    lm = ours.language_model
    x = lm.embed(ids, embeds)
    assert torch.equal(x[2:8], embeds) and torch.equal(x[:2], lm.model.embed_tokens(ids[:2]))
    assert not torch.allclose(run(embeds, ids), run(embeds * 0.5, ids))
    with pytest.raises(ValueError, match="placeholder"):
        run(embeds[:5], ids)


@torch.no_grad()
def test_processor_output_feeds_the_tower(models):
    """`Kimi_K25ImageProcessor` output (the layout preprocess produces) goes straight in."""
    np = importlib.import_module("numpy")
    from PIL import Image
    from transformers.models.kimi_k25.image_processing_kimi_k25 import Kimi_K25ImageProcessor

    rgb = (np.random.default_rng(0).random((100, 150, 3)) * 255).astype("uint8")
    batch = Kimi_K25ImageProcessor()(images=[Image.fromarray(rgb)], return_tensors="pt")
    _, ours, tower, proj = models
    pixels, grid = batch["pixel_values"], batch["image_grid_thw"]
    want = proj(tower(pixels, grid).pooler_output).squeeze(1)
    got = ours.encode_images(pixels, grid)
    assert got.shape[0] == int(grid[0, 1] * grid[0, 2]) // 4
    assert_close_rel(got, want, FP32_REL_TOL, "embeddings of a processed image")
