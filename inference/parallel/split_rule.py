"""The tensor/expert-parallel split rule, without torch: which parameter splits along which dim in
blocks of what, which is replicated, and which counts must divide. `sharding.py` reshapes the
model by it and `dayzero analyze` (`analyze/plan.py`) counts a rank's shard by it, so a change
here changes both (the two used to hold their own copies, kept in step by a test).

* A token mixer's parameters: `MIXER_SPLITS[kind]` maps a parameter's path inside the mixer to its
  `Split`; a parameter not listed is replicated (norms, low-rank / latent projections, the DSA
  indexer, the GDN conv filter, which the rank reads its channels of). `dim == 1` of a linear
  weight is its input columns: a row-parallel projection (one all-reduce per sublayer).
* A SwiGLU (dense FFN, each routed expert, the shared expert): `FFN_SPLITS`, by width.
* GQA KV heads split when TP divides them, else (TP a multiple of them) each rank keeps the one KV
  head its query heads read (`unit_range`).
* Embedding and LM head: vocab rows, `ceil(vocab / tp)` per rank, the last rank's tail padding.
* Routed experts: split over EP and each sliced over TP; the shared expert over every rank when
  its width divides the world size, else over the TP group (`shared_expert_over_world`).
"""

from __future__ import annotations

from dataclasses import dataclass

from inference.config import DENSE, GDN, GQA, KDA, MLA, MOE, ModelSpec
from inference.parallel.config import ParallelConfigError, split_range

__all__ = [
    "FFN_SPLITS",
    "HEADS",
    "KV_HEADS",
    "K_HEADS",
    "MIXER_SPLITS",
    "V_HEADS",
    "WIDTH",
    "Split",
    "kv_heads_per_rank",
    "local_numel",
    "mixer_units",
    "shared_expert_over_world",
    "split_problem",
    "unit_range",
    "vocab_range",
]

HEADS, KV_HEADS, K_HEADS, V_HEADS, WIDTH = "heads", "kv_heads", "k_heads", "v_heads", "width"


@dataclass(frozen=True, slots=True)
class Split:
    """A parameter split over TP along `dim`, which is `mixer_units(...)[unit]` equal blocks."""

    unit: str
    dim: int = 0


_H, _H1 = Split(HEADS), Split(HEADS, 1)
MIXER_SPLITS: dict[str, dict[str, Split]] = {
    KDA: {
        **{f"{p}.weight": _H for p in ("q_proj", "k_proj", "v_proj", "f_b_proj", "g_b_proj", "b_proj")},
        **{f"{p}.weight": _H for p in ("q_conv1d", "k_conv1d", "v_conv1d")},
        "A_log": Split(HEADS, 2),
        "dt_bias": _H,
        "o_proj.weight": _H1,
    },
    MLA: {"q_proj.weight": _H, "q_b_proj.weight": _H, "kv_b_proj.weight": _H, "o_proj.weight": _H1},
    GDN: {  # in_proj_* are laid out per key head (each with its value heads)
        "in_proj_qkvz.weight": Split(K_HEADS),
        "in_proj_ba.weight": Split(K_HEADS),
        "A_log": Split(V_HEADS),
        "dt_bias": Split(V_HEADS),
        "out_proj.weight": Split(V_HEADS, 1),
    },
    GQA: {  # q_proj holds query | gate per head
        "q_proj.weight": _H,
        "k_proj.weight": Split(KV_HEADS),
        "v_proj.weight": Split(KV_HEADS),
        "o_proj.weight": _H1,
    },
}
FFN_SPLITS: dict[str, Split] = {
    "gate_proj.weight": Split(WIDTH),
    "up_proj.weight": Split(WIDTH),
    "down_proj.weight": Split(WIDTH, 1),
}


def mixer_units(s: ModelSpec, kind: str) -> dict[str, int]:
    """How many blocks of each unit a token mixer of layer kind `kind` has (the whole model's)."""
    if kind == KDA:
        return {HEADS: s.kda.num_heads}
    if kind == MLA:
        return {HEADS: s.mla.num_heads}
    if kind == GDN:
        return {K_HEADS: s.gdn.num_k_heads, V_HEADS: s.gdn.num_v_heads}
    return {HEADS: s.gqa.num_heads, KV_HEADS: s.gqa.num_kv_heads}


def kv_heads_per_rank(num_kv_heads: int, tp: int) -> int:
    """GQA KV heads one rank holds: `num_kv_heads / tp`, or 1 (a copy) when TP is a multiple of them."""
    if num_kv_heads % tp == 0:
        return num_kv_heads // tp
    if tp % num_kv_heads == 0:
        return 1
    raise ParallelConfigError(
        f"GQA KV heads (num_key_value_heads={num_kv_heads}) neither divide nor are divided by "
        f"--tensor-parallel-size {tp}: choose a size that divides or is a multiple of {num_kv_heads}"
    )


def unit_range(n: int, tp: int, rank: int, unit: str, what: str) -> tuple[int, int]:
    """`[start, stop)` of the `n` blocks of `unit` that TP rank `rank` holds."""
    if unit == KV_HEADS and kv_heads_per_rank(n, tp) * tp != n:
        head = rank * n // tp  # the KV head this rank's query heads read
        return head, head + 1
    return split_range(n, tp, rank, what)


def local_numel(numel: int, split: Split | None, units: dict[str, int], tp: int) -> int:
    """Elements rank 0 holds of a parameter of `numel` elements split by `split` (None: whole)."""
    if split is None or tp == 1:
        return numel
    n = units[split.unit]
    lo, hi = unit_range(n, tp, 0, split.unit, split.unit)
    return numel // n * (hi - lo)


def vocab_range(vocab: int, tp: int, rank: int) -> tuple[int, int, int]:
    """`(start, stop, rows)`: rank `rank`'s vocab ids `[start, stop)` in `rows = ceil(vocab / tp)`
    local rows (the last rank's tail rows are padding, zero and never sampled)."""
    rows = -(-vocab // tp)
    start = min(rank * rows, vocab)
    return start, min(start + rows, vocab), rows


def shared_expert_over_world(width: int, world: int) -> bool:
    """The shared expert is sliced over every rank when its width divides the world size, else over
    the TP group (one EP replica adds it)."""
    return width % world == 0


def split_problem(s: ModelSpec, tp: int, ep: int) -> str:
    """Why TP=`tp` x EP=`ep` does not split this model ("" when it does): the counts the rule above
    splits must divide (GQA KV heads may instead be a divisor of TP: a copy per rank)."""
    counts: list[tuple[str, int, str, int]] = []  # (what, count, "TP" | "EP", parts)
    for kind in (KDA, MLA, GDN, GQA):
        if kind in s.layer_kinds:
            for unit, n in mixer_units(s, kind).items():
                if unit != KV_HEADS:
                    counts.append((_UNIT_NAMES[kind, unit], n, "TP", tp))
    if s.gqa is not None and GQA in s.layer_kinds:
        kv = s.gqa.num_kv_heads
        if kv % tp and tp % kv:
            return f"GQA kv heads (num_key_value_heads={kv}) neither divide nor are a multiple of TP {tp}"
    if s.moe is not None and MOE in s.mlp_kinds:
        counts.append(("routed experts", s.moe.num_experts, "EP", ep))
        counts.append(("moe_intermediate_size", s.moe.intermediate_size, "TP", tp))  # each expert sliced
        if s.moe.shared_width:
            counts.append(("shared expert width", s.moe.shared_width, "TP", tp))
    if DENSE in s.mlp_kinds:
        counts.append(("intermediate_size", s.intermediate_size, "TP", tp))
    for what, n, axis, parts in counts:
        if n % parts:
            return f"{what} {n} not divisible by {axis} {parts}"
    return ""


_UNIT_NAMES = {
    (KDA, HEADS): "KDA heads",
    (MLA, HEADS): "MLA heads",
    (GDN, K_HEADS): "GDN key heads (linear_num_key_heads)",
    (GDN, V_HEADS): "GDN value heads (linear_num_value_heads)",
    (GQA, HEADS): "GQA heads (num_attention_heads)",
}
