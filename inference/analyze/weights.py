"""Weight bytes on disk (as the checkpoint stores them, quantized or not) and in memory (as this
runtime holds them: quantized checkpoints are dequantized at load to the serving dtype).

The quantized formats store only linear (matrix) weights quantized; which ones is the format's
rule, applied here to the published module names (`linear_weights` lists them, in the layout the
loader reads; a test checks the list against the built model):

* FP8 (DeepSeek block FP8): every decoder linear but the routers (`mlp.gate`, Qwen's
  `shared_expert_gate`) and the DSA `indexer.weights_proj` (DeepSeek's reference code keeps them
  in bf16), never the LM head; `modules_to_not_convert` (substring match, as transformers reads it)
  adds exclusions. Per `block` tile one fp32 scale.
* INT4 (compressed-tensors): every `Linear` not matched by `ignore` (`re:` entries are regexes
  matched from the start of the name, others exact names, also under a wrapper prefix);
  the DeepSeek/Kimi router is not an `nn.Linear` there, so never quantized. Per row
  `ceil(cols / 8)` int32 words, `ceil(cols / group)` bf16 scales and an int64 `weight_shape` [2].

Everything else (embeddings, norms, routers, biases, the vision tower) is stored in `torch_dtype`.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

from inference.analyze.params import parameter_counts
from inference.config import DENSE, GDN, KDA, MLA, ModelSpec, QuantSpec

__all__ = ["DTYPE_BYTES", "Linear", "WeightBytes", "is_quantized", "linear_weights", "weight_bytes"]

DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2, "fp32": 4, "bf16": 2, "fp16": 2}
_FP8_KEPT = ("mlp.gate", "shared_expert_gate", "indexer.weights_proj", "lm_head")


@dataclass(frozen=True, slots=True)
class Linear:
    """One linear weight `[rows, cols]` by its module name (the tensor is `name + ".weight"`)."""

    name: str
    rows: int
    cols: int
    router: bool = False  # a routing score, not an `nn.Linear` in every implementation


@dataclass(frozen=True, slots=True)
class WeightBytes:
    """`disk`: the checkpoint's bytes (served tensors; MTP layers excluded); `memory`: after load
    in the serving dtype; `quantized_params`: parameters stored quantized."""

    disk: int
    memory: int
    quantized_params: int
    stored_as: str


def _mixer(s: ModelSpec, kind: str, p: str) -> list[Linear]:
    h = s.hidden_size
    if kind == MLA:
        m = s.mla
        out = (
            [Linear(p + "self_attn.q_proj", m.num_heads * m.qk_head_dim, h)]
            if m.q_lora_rank is None
            else [
                Linear(p + "self_attn.q_a_proj", m.q_lora_rank, h),
                Linear(p + "self_attn.q_b_proj", m.num_heads * m.qk_head_dim, m.q_lora_rank),
            ]
        )
        out += [
            Linear(p + "self_attn.kv_a_proj_with_mqa", m.latent_dim, h),
            Linear(
                p + "self_attn.kv_b_proj", m.num_heads * (m.qk_nope_head_dim + m.v_head_dim), m.kv_lora_rank
            ),
            Linear(p + "self_attn.o_proj", h, m.num_heads * m.v_head_dim),
        ]
        if s.dsa is not None and m.q_lora_rank is not None:
            d = s.dsa
            out += [
                Linear(p + "self_attn.indexer.wq_b", d.num_heads * d.head_dim, m.q_lora_rank),
                Linear(p + "self_attn.indexer.wk", d.head_dim, h),
                Linear(p + "self_attn.indexer.weights_proj", d.num_heads, h),
            ]
        return out
    if kind == KDA:
        k = s.kda
        d, a = k.proj_dim, p + "self_attn."
        return [Linear(a + n, d, h) for n in ("q_proj", "k_proj", "v_proj")] + [
            Linear(a + "f_a_proj", k.head_dim, h), Linear(a + "f_b_proj", d, k.head_dim),
            Linear(a + "b_proj", k.num_heads, h),
            Linear(a + "g_a_proj", k.head_dim, h), Linear(a + "g_b_proj", d, k.head_dim),
            Linear(a + "o_proj", h, d),
        ]  # fmt: skip
    if kind == GDN:
        g = s.gdn
        return [
            Linear(p + "linear_attn.in_proj_qkvz", 2 * g.key_dim + 2 * g.value_dim, h),
            Linear(p + "linear_attn.in_proj_ba", 2 * g.num_v_heads, h),
            Linear(p + "linear_attn.out_proj", h, g.value_dim),
        ]
    a = s.gqa
    return [
        Linear(p + "self_attn.q_proj", a.num_heads * a.head_dim * (2 if a.output_gate else 1), h),
        Linear(p + "self_attn.k_proj", a.num_kv_heads * a.head_dim, h),
        Linear(p + "self_attn.v_proj", a.num_kv_heads * a.head_dim, h),
        Linear(p + "self_attn.o_proj", h, a.num_heads * a.head_dim),
    ]


def _swiglu(p: str, width: int, h: int, names: tuple[str, str, str]) -> list[Linear]:
    gate, up, down = names
    return [Linear(p + gate, width, h), Linear(p + up, width, h), Linear(p + down, h, width)]


def linear_weights(s: ModelSpec) -> list[Linear]:
    """Every linear weight of the served text model, by its published name, in layer order."""
    h, root = s.hidden_size, "language_model." if s.wrapper_type else ""
    kimi = s.model_type == "kimi_linear"
    out: list[Linear] = []
    for i in range(s.num_layers):
        p = f"{root}model.layers.{i}."
        out += _mixer(s, s.layer_kinds[i], p)
        if s.mlp_kinds[i] == DENSE:
            out += _swiglu(p + "mlp.", s.intermediate_size, h, ("gate_proj", "up_proj", "down_proj"))
            continue
        e = s.moe
        moe = p + ("block_sparse_moe." if kimi else "mlp.")
        out.append(Linear(moe + "gate", e.num_experts, h, router=True))
        names = ("w1", "w3", "w2") if kimi else ("gate_proj", "up_proj", "down_proj")
        for j in range(e.num_experts):
            out += _swiglu(f"{moe}experts.{j}.", e.intermediate_size, h, names)
        if e.shared_width:
            shared = moe + ("shared_expert." if s.model_type == "qwen3_next" else "shared_experts.")
            out += _swiglu(shared, e.shared_width, h, ("gate_proj", "up_proj", "down_proj"))
        if e.shared_expert_gate:
            out.append(Linear(moe + "shared_expert_gate", 1, h, router=True))
    if not s.tie_word_embeddings:
        out.append(Linear(root + "lm_head", s.vocab_size, h))
    return out


def _ignored(name: str, patterns: tuple[str, ...]) -> bool:
    """compressed-tensors `ignore`: `re:` regexes matched from the start, else the exact name; a
    plain entry also matches under a wrapper prefix (K2.5's `lm_head` is `language_model.lm_head`)."""
    return any(
        re.match(pat[3:], name) is not None
        if pat.startswith("re:")
        else name == pat or name.endswith("." + pat)
        for pat in patterns
    )


def is_quantized(q: QuantSpec, w: Linear) -> bool:
    """Whether the checkpoint format stores this linear weight quantized (see the module doc)."""
    if q.method == "fp8":
        return not w.name.endswith(_FP8_KEPT) and not any(x in w.name for x in q.ignore)
    return not w.router and not _ignored(w.name, q.ignore)


def _stored_bytes(q: QuantSpec, w: Linear) -> int:
    if q.method == "fp8":
        br, bc = q.block
        return w.rows * w.cols + 4 * math.ceil(w.rows / br) * math.ceil(w.cols / bc)
    return w.rows * (4 * math.ceil(w.cols / 8) + 2 * math.ceil(w.cols / q.group_size)) + 16


def weight_bytes(s: ModelSpec, serving_dtype: str = "bf16") -> WeightBytes:
    """Bytes of the served model's weights on disk and, once loaded (dequantized), in memory."""
    if serving_dtype not in DTYPE_BYTES:
        raise ValueError(f"serving dtype must be one of {sorted(DTYPE_BYTES)}, got {serving_dtype!r}")
    total = parameter_counts(s)[0]["total"]
    plain = DTYPE_BYTES.get(s.torch_dtype, 2)
    memory = total * DTYPE_BYTES[serving_dtype]
    q = s.quantization
    if q is None:
        return WeightBytes(total * plain, memory, 0, s.torch_dtype)
    quantized = [w for w in linear_weights(s) if is_quantized(q, w)]
    n_quant = sum(w.rows * w.cols for w in quantized)
    disk = (total - n_quant) * plain + sum(_stored_bytes(q, w) for w in quantized)
    return WeightBytes(disk, memory, n_quant, f"{q.method} + {s.torch_dtype}")
