"""The demo model's architecture (config.json) and where its committed artefacts live."""

from __future__ import annotations

from pathlib import Path
from typing import Any

__all__ = [
    "DEMO_DIR",
    "DEMO_NAME",
    "EVAL_SEED",
    "TRAIN_SEED",
    "demo_config",
    "dsa_variant",
    "write_chat_files",
]

DEMO_DIR = Path(__file__).resolve().parent / "weights"
DEMO_NAME = "dayzero-demo"  # the served name (config.json's `_name_or_path`)
CHAT_TEMPLATE = DEMO_DIR / "chat_template.jinja"
# Corpus seed ranges: training sample i is seed TRAIN_SEED + i; the held-out set is far away.
TRAIN_SEED = 1_000_000
EVAL_SEED = 9_000_000_000


def demo_config(vocab_size: int, image_token_id: int) -> dict[str, Any]:
    """Kimi-Linear-shaped hybrid (KDA layers 1, 2, 4, 5 + MLA layers 3, 6, dense first FFN then MoE
    with a shared expert) with a two-layer MoonViT and projector: about 11M parameters in all, most of
    them in the 16 routed experts per MoE layer (top-2 active). Two attention layers with four
    heads each, because the tasks are mostly copying (numbers, names, attachment ids) from earlier
    in the conversation, which attention does by matching and the second layer makes reliable."""
    text = {
        "model_type": "kimi_linear",
        "vocab_size": vocab_size,
        "hidden_size": 192,
        "intermediate_size": 512,
        "num_hidden_layers": 6,
        "num_attention_heads": 4,
        "num_key_value_heads": 4,
        "hidden_act": "silu",
        "rms_norm_eps": 1e-5,
        "tie_word_embeddings": False,
        "q_lora_rank": 96,
        "kv_lora_rank": 96,
        "qk_nope_head_dim": 32,
        "qk_rope_head_dim": 16,
        "v_head_dim": 32,
        "mla_use_nope": True,
        "num_experts": 16,
        "num_experts_per_token": 2,
        "moe_intermediate_size": 160,
        "num_shared_experts": 1,
        "routed_scaling_factor": 1.0,
        "moe_renormalize": True,
        "moe_router_activation_func": "sigmoid",
        "num_expert_group": 1,
        "topk_group": 1,
        "first_k_dense_replace": 1,
        "moe_layer_freq": 1,
        "linear_attn_config": {
            "kda_layers": [1, 2, 4, 5],
            "full_attn_layers": [3, 6],
            "num_heads": 3,
            "head_dim": 64,
            "short_conv_kernel_size": 4,
        },
    }
    return {
        "_name_or_path": DEMO_NAME,
        "model_type": "kimi_k25",
        "text_config": text,
        "vision_config": {
            "patch_size": 14,
            "hidden_size": 64,
            "intermediate_size": 128,
            "num_attention_heads": 4,
            "num_hidden_layers": 2,
            "pos_emb_height": 16,
            "pos_emb_width": 16,
            "pos_emb_time": 4,
            "merge_kernel_size": [2, 2],
            "hidden_act": "gelu_pytorch_tanh",
            "rope_parameters": {"rope_type": "axial", "rope_theta": 10000.0},
        },
        "image_token_id": image_token_id,
        "projection_hidden_size": 64,
        "projection_layer_norm_eps": 1e-5,
    }


def dsa_variant(config: dict[str, Any], topk: int = 2048) -> dict[str, Any]:
    """The same model with DeepSeek-V3.2's DSA indexer on its MLA layer (`index_*` fields).

    With `topk` at least the context length the indexer keeps every key, so this variant answers
    exactly as the MLA model does whatever the indexer's weights; a smaller `topk` makes it sparse.
    """
    text = dict(config["text_config"], index_topk=topk, index_n_heads=2, index_head_dim=32)
    return dict(config, text_config=text)


def write_chat_files(out: Path, special_ids: dict[str, int]) -> None:
    """The files a released checkpoint carries beside its tokenizer: the chat template, the named
    special tokens (`tokenizer_config.json`) and the stop ids (`generation_config.json`)."""
    import json

    out.mkdir(parents=True, exist_ok=True)
    if (out / CHAT_TEMPLATE.name).resolve() != CHAT_TEMPLATE.resolve():
        (out / CHAT_TEMPLATE.name).write_text(CHAT_TEMPLATE.read_text())
    tokenizer_config = {
        "bos_token": "[BOS]",
        "eos_token": "[EOS]",
        "pad_token": "[PAD]",
        "model_max_length": 32768,
    }
    (out / "tokenizer_config.json").write_text(json.dumps(tokenizer_config, indent=2) + "\n")
    generation = {
        "bos_token_id": special_ids["[BOS]"],
        "eos_token_id": [special_ids["<|im_end|>"], special_ids["[EOS]"]],
    }
    (out / "generation_config.json").write_text(json.dumps(generation, indent=2) + "\n")
