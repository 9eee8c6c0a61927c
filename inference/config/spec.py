"""The frozen spec every reader produces: what the model, cache and analysis need to know.

One `ModelSpec` describes a decoder of the family: per-layer mixer kinds (KDA, MLA, gated
DeltaNet, gated GQA attention) and FFN kinds (dense, MoE), with one geometry spec per mixer kind
that occurs (`None` where the model has no layer of that kind).
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = [
    "DENSE",
    "GDN",
    "GQA",
    "KDA",
    "MLA",
    "MOE",
    "ConfigError",
    "DSASpec",
    "GDNSpec",
    "GQASpec",
    "KDASpec",
    "MLASpec",
    "MTPSpec",
    "MoESpec",
    "ModelSpec",
    "QuantSpec",
    "VisionSpec",
]

KDA = "kda"  # Kimi Delta Attention (linear, recurrent state)
MLA = "mla"  # multi-head latent attention (paged latent KV), optionally with the DSA indexer
GDN = "gdn"  # gated DeltaNet (Qwen3-Next linear attention, recurrent state)
GQA = "gqa"  # grouped-query softmax attention with an output gate (Qwen3-Next full attention)
DENSE = "dense"
MOE = "moe"


class ConfigError(ValueError):
    """A config field is unknown, missing, or inconsistent with the others."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"config field '{field}': {message}")
        self.field = field


@dataclass(frozen=True, slots=True)
class KDASpec:
    """Kimi Delta Attention geometry (value head dim equals key head dim, as published)."""

    num_heads: int
    head_dim: int
    conv_kernel_size: int

    @property
    def proj_dim(self) -> int:
        return self.num_heads * self.head_dim


@dataclass(frozen=True, slots=True)
class MLASpec:
    """Multi-head latent attention geometry. `use_rope=False` is Kimi-Linear's NoPE variant.

    `rope_scaling` keeps the published scaling dict as sorted items (YaRN for the 128K DeepSeek
    and Kimi-K2 checkpoints): it changes no shape; the MLA layer turns it into its rotary angles
    and softmax scale (`inference.model.rope.RotaryAngles`).
    """

    num_heads: int
    q_lora_rank: int | None
    kv_lora_rank: int
    qk_nope_head_dim: int
    qk_rope_head_dim: int
    v_head_dim: int
    use_rope: bool
    rope_theta: float
    rope_scaling: tuple[tuple[str, object], ...] | None = None

    @property
    def qk_head_dim(self) -> int:
        return self.qk_nope_head_dim + self.qk_rope_head_dim

    @property
    def latent_dim(self) -> int:
        """Width of one cached token: normalised latent plus the shared rope key."""
        return self.kv_lora_rank + self.qk_rope_head_dim


@dataclass(frozen=True, slots=True)
class DSASpec:
    """DeepSeek-V3.2 sparse attention: a lightning indexer picks `topk` keys per query."""

    topk: int
    num_heads: int
    head_dim: int


@dataclass(frozen=True, slots=True)
class GDNSpec:
    """Gated DeltaNet (Qwen3-Next): `num_v_heads` recurrent states of `k_head_dim x v_head_dim`;
    query/key heads are shared by `num_v_heads // num_k_heads` value heads."""

    num_k_heads: int
    num_v_heads: int
    k_head_dim: int
    v_head_dim: int
    conv_kernel_size: int

    @property
    def key_dim(self) -> int:
        return self.num_k_heads * self.k_head_dim

    @property
    def value_dim(self) -> int:
        return self.num_v_heads * self.v_head_dim

    @property
    def conv_dim(self) -> int:
        """Channels of the short conv: q | k | v."""
        return 2 * self.key_dim + self.value_dim


@dataclass(frozen=True, slots=True)
class GQASpec:
    """Grouped-query attention with q/k RMSNorm, partial rope and a sigmoid output gate
    (Qwen3-Next's full-attention layers: `q_proj` emits the query and the gate together)."""

    num_heads: int
    num_kv_heads: int
    head_dim: int
    rotary_dim: int
    rope_theta: float
    output_gate: bool


@dataclass(frozen=True, slots=True)
class MoESpec:
    """Routed experts, grouped top-k and shared experts.

    `scoring` is "sigmoid" (DeepSeek/Kimi: bias-corrected choice, `e_score_correction_bias`) or
    "softmax" (Qwen3-Next: plain top-k of the softmax). `shared_intermediate_size` is the width
    of the one shared SwiGLU (num_shared_experts * moe width for DeepSeek/Kimi); with
    `shared_expert_gate` its output is scaled by `sigmoid(x @ w)` (Qwen3-Next).
    """

    num_experts: int
    top_k: int
    intermediate_size: int
    num_shared_experts: int
    routed_scaling_factor: float
    renormalize: bool
    num_groups: int
    topk_groups: int
    scoring: str = "sigmoid"
    shared_intermediate_size: int | None = None
    shared_expert_gate: bool = False

    @property
    def shared_width(self) -> int:
        if self.shared_intermediate_size is not None:
            return self.shared_intermediate_size
        return self.intermediate_size * self.num_shared_experts


@dataclass(frozen=True, slots=True)
class MTPSpec:
    """Multi-token-prediction layers the checkpoint ships after the decoder (DeepSeek-V3
    `num_nextn_predict_layers`): noted for analysis and speculative decoding, not served."""

    num_layers: int


@dataclass(frozen=True, slots=True)
class QuantSpec:
    """How the checkpoint stores its quantized weights (`quantization_config`).

    * `fp8`: DeepSeek block FP8: `weight` float8_e4m3fn and `weight_scale_inv` fp32, one scale per
      `block` (rows, cols) tile (the last tiles may be partial);
    * `int4`: compressed-tensors `pack-quantized`: `weight_packed` int32 (8 values of 4 bits per
      int32, offset by 8), `weight_scale` per `group_size` consecutive input columns, `weight_shape`;
      symmetric (no zero point).

    `ignore` lists the module-name patterns stored unquantized (compressed-tensors `ignore`, FP8
    `modules_to_not_convert`; `re:` marks a regex): the analysis reads it, the loader goes by the
    tensors the checkpoint holds. `bits` per stored weight value.
    """

    method: str  # "fp8" | "int4"
    bits: int
    block: tuple[int, int] | None = None
    group_size: int | None = None
    ignore: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class VisionSpec:
    """MoonViT tower and its 2-layer projector into the text hidden size."""

    patch_size: int
    hidden_size: int
    intermediate_size: int
    num_heads: int
    num_layers: int
    pos_emb_height: int
    pos_emb_width: int
    pos_emb_time: int
    merge_kernel: tuple[int, int]
    rope_theta: float
    projector_ln_eps: float

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_heads

    @property
    def merged_dim(self) -> int:
        return self.hidden_size * self.merge_kernel[0] * self.merge_kernel[1]


@dataclass(frozen=True, slots=True)
class ModelSpec:
    """Everything the model, cache and analysis need, with 0-based per-layer kinds.

    `model_type` is the text model's published type (kimi_linear, deepseek_v3, deepseek_v32,
    kimi_k2, qwen3_next); `wrapper_type` the multimodal wrapper's (kimi_k25, ...) when there is one.
    """

    model_type: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    layer_kinds: tuple[str, ...]  # KDA | MLA | GDN | GQA per layer
    mlp_kinds: tuple[str, ...]  # DENSE | MOE per layer
    rms_norm_eps: float
    tie_word_embeddings: bool
    kda: KDASpec | None
    mla: MLASpec | None
    moe: MoESpec | None
    dsa: DSASpec | None = None
    vision: VisionSpec | None = None
    image_token_id: int | None = None
    torch_dtype: str = "bfloat16"
    gdn: GDNSpec | None = None
    gqa: GQASpec | None = None
    mtp: MTPSpec | None = None
    quantization: QuantSpec | None = None  # stored weight format; None = plain torch_dtype
    wrapper_type: str | None = None
    # The context length the checkpoint was trained for (`max_position_embeddings`), when it says;
    # the engine does not enforce it (its --max-model-len does), `dayzero analyze` warns past it.
    max_position_embeddings: int | None = None

    @property
    def kda_layers(self) -> tuple[int, ...]:
        return tuple(i for i, k in enumerate(self.layer_kinds) if k == KDA)

    @property
    def mla_layers(self) -> tuple[int, ...]:
        return tuple(i for i, k in enumerate(self.layer_kinds) if k == MLA)

    @property
    def gdn_layers(self) -> tuple[int, ...]:
        return tuple(i for i, k in enumerate(self.layer_kinds) if k == GDN)

    @property
    def gqa_layers(self) -> tuple[int, ...]:
        return tuple(i for i, k in enumerate(self.layer_kinds) if k == GQA)
