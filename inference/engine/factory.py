"""Build an engine from a model folder, a config file (random weights) or the bundled small model."""

from __future__ import annotations

import json
import logging
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch

from inference.engine.engine import Engine, EngineConfig
from inference.engine.memory_planner import plan_pools
from inference.tokenizer import ByteTokenizer, Tokenizer, TokenizerFilesError, load_tokenizer

log = logging.getLogger(__name__)

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


def build_engine(
    *,
    config: dict[str, Any] | str | Path | None = None,
    model_dir: str | Path | None = None,
    engine_config: EngineConfig | None = None,
    device: str | torch.device = "cpu",
    dtype: str | torch.dtype = "float32",
    seed: int = 0,
    mem_fraction: float = 0.8,
    fixed_blocks: bool = False,
    tensor_parallel_size: int = 1,
    expert_parallel_size: int = 1,
    expert_dispatch: str = "local",
    pipeline_parallel_size: int = 1,
    micro_batches: int = 1,
    cluster: Any = None,
) -> Engine:
    """`model_dir`: real weights (safetensors) + config.json (+ tokenizer.json if present);
    `config`: a config dict or file with seeded random weights; neither: the bundled small model.
    The pools are planned by `plan_pools` (`mem_fraction` of a CUDA device; the rest is headroom).
    A world size (`tensor_parallel_size * expert_parallel_size * pipeline_parallel_size`) above 1
    builds no model here: one worker process per rank builds its shard (`inference.parallel.launch`);
    `micro_batches`: how many micro-batches each step is split into through the pipeline stages
    (steps themselves overlap there, `parallel.pipeline.PipelinedEngine`);
    `cluster`: a `parallel.cluster.ClusterSpec` placing the ranks on several hosts (this is node 0)."""
    from inference.config import load_config, parse_config
    from inference.model.cache_tensors import HybridCacheSpec
    from inference.model.factory import build_model

    if isinstance(dtype, str):
        dtype = DTYPES[dtype]
    device = torch.device(device)
    parallel = tensor_parallel_size * expert_parallel_size * pipeline_parallel_size > 1
    if model_dir is not None:
        spec = load_config(model_dir)
        model = (
            None
            if parallel
            else build_model(spec, load_format="safetensors", path=model_dir, dtype=dtype, device=device)
        )
        tokenizer = load_tokenizer(model_dir)
    else:
        if config is None:
            config = small_model_config()
        if isinstance(config, str | Path):
            config = json.loads(Path(config).read_text())
        spec = parse_config(config)
        tokenizer = ByteTokenizer()
        pad = tokenizer.token_id("<|media_pad|>")
        if spec.vision is not None and spec.image_token_id != pad:
            # random weights: a published config's image token id means nothing to the byte
            # tokenizer, whose <|media_pad|> is where the chat template puts image embeddings
            spec = replace(spec, image_token_id=pad)
        model = (
            None
            if parallel
            else build_model(spec, load_format="dummy", dtype=dtype, device=device, seed=seed)
        )
    check_tokenizer(tokenizer, spec, model_dir)
    engine_config = engine_config or EngineConfig()
    cache_spec = HybridCacheSpec.from_model_spec(
        spec, dtype, latent_fp8=engine_config.kv_cache_dtype == "fp8"
    )
    if parallel:
        from inference.parallel.launch import build_parallel_engine

        engine = build_parallel_engine(
            spec, tokenizer, cache_spec, engine_config,
            tensor_parallel_size=tensor_parallel_size, expert_parallel_size=expert_parallel_size,
            expert_dispatch=expert_dispatch, pipeline_parallel_size=pipeline_parallel_size,
            micro_batches=micro_batches, cluster=cluster, mem_fraction=mem_fraction, fixed_blocks=fixed_blocks,
            model_dir=model_dir, device=device, dtype=dtype, seed=seed,
        )  # fmt: skip
        return _with_checkpoint(engine, model_dir, spec)
    ecfg, plan = plan_pools(
        model,
        tokenizer,
        cache_spec,
        engine_config,
        device,
        dtype,
        mem_fraction=mem_fraction,
        fixed_blocks=fixed_blocks,
    )
    log.info("memory plan: %s", plan.describe())
    engine = Engine(model, tokenizer, ecfg, cache_spec=cache_spec, device=device, dtype=dtype)
    engine.memory_plan = plan
    return _with_checkpoint(engine, model_dir, spec)


def _with_checkpoint(engine: Engine, model_dir: str | Path | None, spec: Any) -> Engine:
    """What serving reads of the checkpoint an engine was built from (its files, its image token)."""
    engine.model_dir = None if model_dir is None else Path(model_dir)
    engine.image_token_id = spec.image_token_id if spec.vision is not None else None
    return engine


def check_tokenizer(tokenizer: Tokenizer, spec: Any, model_dir: str | Path | None) -> None:
    """Refuse a tokenizer the model cannot serve, saying which file disagrees and why."""
    where = f"{model_dir}/config.json" if model_dir is not None else "the config"
    if tokenizer.vocab_size > spec.vocab_size:
        raise TokenizerFilesError(
            f"the tokenizer has {tokenizer.vocab_size} ids but {where} gives the embedding only "
            f"{spec.vocab_size} rows: the tokenizer files belong to another model"
        )
    if spec.vision is not None and not (
        0 <= spec.image_token_id < tokenizer.vocab_size and tokenizer.is_special(spec.image_token_id)
    ):
        raise TokenizerFilesError(
            f"{where} says images enter as token {spec.image_token_id} (image_token_id), which is not a "
            f"special token of the tokenizer ({tokenizer.vocab_size} ids): the chat template places the "
            "tokenizer's image token where image embeddings go, so the two must come from the same checkpoint"
        )
