"""Build an engine from a model folder, a config file (random weights) or the bundled small model."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch

from inference.engine.engine import Engine, EngineConfig
from inference.tokenizer import ByteTokenizer, load_tokenizer

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def small_model_config(vocab_size: int = 320) -> dict[str, Any]:
    """The bundled random-weight model of the embedded default: Kimi-Linear-shaped (KDA + MLA +
    MoE with a shared expert and a dense first layer), small enough to decode fast on a CPU.
    Its vocabulary covers the byte tokenizer (256 bytes + the Kimi special tokens)."""
    return {
        "model_type": "kimi_linear",
        "vocab_size": vocab_size,
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": 4,
        "num_attention_heads": 4,
        "num_key_value_heads": 4,
        "hidden_act": "silu",
        "rms_norm_eps": 1e-5,
        "tie_word_embeddings": False,
        "q_lora_rank": None,
        "kv_lora_rank": 32,
        "qk_nope_head_dim": 16,
        "qk_rope_head_dim": 8,
        "v_head_dim": 16,
        "mla_use_nope": True,
        "num_experts": 8,
        "num_experts_per_token": 2,
        "moe_intermediate_size": 32,
        "num_shared_experts": 1,
        "routed_scaling_factor": 2.446,
        "moe_renormalize": True,
        "moe_router_activation_func": "sigmoid",
        "num_expert_group": 2,
        "topk_group": 1,
        "first_k_dense_replace": 1,
        "moe_layer_freq": 1,
        "linear_attn_config": {
            "kda_layers": [1, 2, 4],
            "full_attn_layers": [3],
            "num_heads": 2,
            "head_dim": 16,
            "short_conv_kernel_size": 4,
        },
    }


def small_vl_model_config() -> dict[str, Any]:
    """The embedded default: `small_model_config` as the text model plus a two-layer MoonViT
    (patch 14, merge 2x2) and projector; images enter as the byte tokenizer's `<|media_pad|>`."""
    return {
        "model_type": "kimi_k25",
        "text_config": small_model_config(),
        "vision_config": {
            "patch_size": 14,
            "hidden_size": 32,
            "intermediate_size": 64,
            "num_attention_heads": 2,
            "num_hidden_layers": 2,
            "pos_emb_height": 16,
            "pos_emb_width": 16,
            "pos_emb_time": 4,
            "merge_kernel_size": [2, 2],
            "hidden_act": "gelu_pytorch_tanh",
            "rope_parameters": {"rope_type": "axial", "rope_theta": 10000.0},
        },
        "image_token_id": ByteTokenizer().token_id("<|media_pad|>"),
        "projection_hidden_size": 32,
        "projection_layer_norm_eps": 1e-5,
    }


def size_pools(
    cache_spec: Any, config: EngineConfig, device: torch.device, mem_fraction: float
) -> EngineConfig:
    """On CUDA, grow num_blocks to fill `mem_fraction` of the free memory left after the weights
    (state slots keep the configured count). Elsewhere the config is used as given."""
    if device.type != "cuda" or mem_fraction <= 0:
        return config
    free, _total = torch.cuda.mem_get_info(device)
    budget = free * mem_fraction - config.num_state_slots * cache_spec.state_bytes_per_slot
    per_block = cache_spec.kv_bytes_per_token * config.block_size
    num_blocks = max(int(budget // max(per_block, 1)), config.max_num_seqs)
    from dataclasses import replace

    return replace(config, num_blocks=num_blocks)


def build_engine(
    *,
    config: dict[str, Any] | str | Path | None = None,
    model_dir: str | Path | None = None,
    engine_config: EngineConfig | None = None,
    device: str | torch.device = "cpu",
    dtype: str | torch.dtype = "float32",
    seed: int = 0,
    mem_fraction: float = 0.8,
) -> Engine:
    """`model_dir`: real weights (safetensors) + config.json (+ tokenizer.json if present);
    `config`: a config dict or file with seeded random weights; neither: the bundled small model."""
    from inference.config import load_config, parse_config
    from inference.model.cache_tensors import HybridCacheSpec
    from inference.model.factory import build_model

    if isinstance(dtype, str):
        dtype = DTYPES[dtype]
    device = torch.device(device)
    if model_dir is not None:
        spec = load_config(model_dir)
        model = build_model(spec, load_format="safetensors", path=model_dir, dtype=dtype, device=device)
        tokenizer = load_tokenizer(model_dir)
    else:
        if config is None:
            config = small_model_config()
        if isinstance(config, str | Path):
            config = json.loads(Path(config).read_text())
        spec = parse_config(config)
        model = build_model(spec, load_format="dummy", dtype=dtype, device=device, seed=seed)
        tokenizer = ByteTokenizer()
    if tokenizer.vocab_size > spec.vocab_size:
        raise ValueError(f"tokenizer has {tokenizer.vocab_size} ids, the model only {spec.vocab_size}")
    cache_spec = HybridCacheSpec.from_model_spec(spec, dtype)
    ecfg = size_pools(cache_spec, engine_config or EngineConfig(), device, mem_fraction)
    return Engine(model, tokenizer, ecfg, cache_spec=cache_spec, device=device, dtype=dtype)
