"""TP/EP/PP plans with 20% headroom per GPU, preferring the fewest GPUs that hold the model.

Weights per GPU follow the runtime's split rule (`inference/parallel/split_rule.py`, torch-free,
which `inference/parallel/sharding.py` reshapes the model by): each rank holds its slice of the language model plus what every
rank keeps whole (norms, routers, latent and low-rank projections, the DSA indexer, the GDN conv
filter, GQA KV heads past `tp`), and a vision-language model's tower and projector are held whole
by the driver on GPU 0 (`model/multimodal.VisionEncoder`), so GPU 0 is the fullest GPU: its free
memory sizes the KV/state pool, which every rank allocates alike.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from inference.analyze.params import (
    KV_DTYPE_BYTES,
    cache_bytes,
    kv_per_layer,
    mixer_param_numels,
    moe_layer_params,
    parameter_counts,
)
from inference.config import DENSE, GQA, MOE, ModelSpec
from inference.parallel.split_rule import (
    FFN_SPLITS,
    MIXER_SPLITS,
    WIDTH,
    local_numel,
    mixer_units,
    shared_expert_over_world,
    split_problem,
    vocab_range,
)

__all__ = [
    "HEADROOM",
    "MAX_GPUS",
    "WEIGHT_BYTES",
    "ParallelPlan",
    "driver_params",
    "fewest_gpus_plans",
    "gpu_counts",
    "plan_parallel",
    "rank_params",
]

GiB = 1024**3
MAX_GPUS = 1024  # the most GPUs a plan considers when none is given
HEADROOM = 0.20  # fraction of each GPU kept free (activations, fragmentation, CUDA context)
# bytes per weight; int4 counts its group scales (one bf16 scale per 32 weights, the K2.5 layout)
WEIGHT_BYTES = {"bf16": 2.0, "fp8": 1.0, "int4": 0.5 + 2 / 32, "fp4": 0.5}


@dataclass(frozen=True, slots=True)
class ParallelPlan:
    """One replica over `tp * pp` GPUs; routed experts split `ep` ways over the TP group (ep == tp).

    `weight_bytes_per_gpu`: the language-model shard each GPU holds; `driver_weight_bytes`: what
    GPU 0 holds besides (a vision tower and projector, whole, in the driver; 0 for a text model).
    KV and state figures are per GPU, the same on every GPU."""

    gpus: int
    tp: int
    ep: int
    pp: int
    weight_bytes_per_gpu: float
    driver_weight_bytes: float
    kv_bytes_per_gpu: float
    state_bytes_per_gpu: float
    usable_bytes_per_gpu: float
    fits: bool
    max_sequences: int
    note: str = ""


def _split_problem(s: ModelSpec, tp: int) -> str:
    """Why TP=`tp` does not split this model evenly ("" when it does); analyze's plans put EP = TP."""
    return split_problem(s, tp, tp)


def _kv_per_gpu(s: ModelSpec, tp: int) -> int:
    """KV bytes per token on one rank: the MLA latent and indexer keys are shared by all heads, so
    every TP rank keeps them whole; GQA K/V split by kv head (replicated past num_kv_heads)."""
    total = 0
    for kind in s.layer_kinds:
        per = kv_per_layer(s, kind, KV_DTYPE_BYTES)
        total += per / min(tp, s.gqa.num_kv_heads) if kind == GQA else per
    return math.ceil(total)


def _rank_mixer(s: ModelSpec, kind: str, tp: int) -> int:
    """One rank's parameters of a token mixer: each parameter as the split rule cuts it."""
    splits, units = MIXER_SPLITS[kind], mixer_units(s, kind)
    return sum(local_numel(n, splits.get(name), units, tp) for name, n in mixer_param_numels(s, kind).items())


def _rank_ffn(h: int, width: int, tp: int) -> int:
    """One rank's parameters of a SwiGLU of `width` (dense FFN, a routed or the shared expert)."""
    return sum(local_numel(h * width, split, {WIDTH: width}, tp) for split in FFN_SPLITS.values())


def rank_params(
    s: ModelSpec, tp: int, ep: int = 1, layers: range | None = None, first: bool = True, last: bool = True
) -> int:
    """Parameters of rank 0's language-model shard (vocab rows padded to `ceil(vocab / tp)`) on the
    runtime's `--tensor-parallel-size tp --expert-parallel-size ep` mesh; `tp` x `ep` must split the
    model. `ep=1` is also what analyze's plans hold: EP = TP over the same GPUs holds each GPU's
    1/tp of every routed expert as TP's slice of each does. The vision side is `driver_params`.
    A pipeline stage's rank (`analyze/stages.py`): its `layers`, the embedding if `first` (or a
    tied LM head's if `last`), the final norm and LM head if `last`."""
    if problem := _split_problem(s, tp) if ep == 1 else split_problem(s, tp, ep):
        mesh = f"TP={tp}" + (f" x EP={ep}" if ep > 1 else "")
        raise ValueError(f"{mesh} does not split this model ({problem}): choose a TP that divides it")
    layers = range(s.num_layers) if layers is None else layers
    h = s.hidden_size
    rows = vocab_range(s.vocab_size, tp, 0)[2]
    tables = (first or (last and s.tie_word_embeddings)) + (last and not s.tie_word_embeddings)
    n = rows * h * tables + h * (2 * len(layers) + last)  # + norms, whole
    kinds = [s.layer_kinds[i] for i in layers]
    mlps = [s.mlp_kinds[i] for i in layers]
    for kind in kinds:
        n += _rank_mixer(s, kind, tp)
    if s.moe is not None and MOE in mlps:
        e = s.moe
        router, _, _, _ = moe_layer_params(s)
        gate = h if e.shared_expert_gate else 0  # replicated, as the router
        over = tp * ep if shared_expert_over_world(e.shared_width, tp * ep) else tp
        shared = _rank_ffn(h, e.shared_width, over) if e.shared_width else 0
        routed = e.num_experts // ep * _rank_ffn(h, e.intermediate_size, tp)
        n += mlps.count(MOE) * (router + gate + shared + routed)
    n += mlps.count(DENSE) * _rank_ffn(h, s.intermediate_size, tp)
    return n


def driver_params(s: ModelSpec) -> int:
    """Parameters the driver holds whole on GPU 0: a vision tower and its projector (0 if none)."""
    comp = parameter_counts(s)[1]
    return comp.get("vision_tower", 0) + comp.get("mm_projector", 0)


def plan_parallel(
    s: ModelSpec, gpus: int, gpu_mem_gib: float, context: int, weight_dtype: str = "bf16", sequences: int = 1
) -> list[ParallelPlan]:
    """Every (tp, pp) with tp * pp == gpus that splits cleanly, best first (fits, fewer stages, room).

    TP splits attention heads and FFN columns, EP (== tp) splits routed experts (the runtime's
    `--tensor-parallel-size tp` slices each expert over the TP group: the same bytes per GPU), PP
    splits layers (counted here as an even split of a rank's shard; `stages.plan_nodes` plans the
    runtime's own stages, one per host). GPU 0
    also holds the driver's vision tower, and the fewest free bytes, those of GPU 0, size the pool.
    """
    wb = WEIGHT_BYTES[weight_dtype]
    driver = driver_params(s) * WEIGHT_BYTES["bf16"]  # no checkpoint format quantizes the tower
    _, state_seq = cache_bytes(s)
    usable = gpu_mem_gib * GiB * (1 - HEADROOM)
    plans = []
    for tp in (t for t in range(1, gpus + 1) if gpus % t == 0):
        pp = gpus // tp
        if pp > s.num_layers or _split_problem(s, tp):
            continue
        w = rank_params(s, tp) * wb / pp
        kv = _kv_per_gpu(s, tp) * context / pp
        st = state_seq / (tp * pp)
        per_seq = kv + st
        free = usable - w - driver
        n = max(0, math.floor(free / per_seq)) if per_seq else (sequences if free > 0 else 0)
        plans.append(
            ParallelPlan(
                gpus=gpus, tp=tp, ep=tp, pp=pp, weight_bytes_per_gpu=w, driver_weight_bytes=driver,
                kv_bytes_per_gpu=kv * sequences,
                state_bytes_per_gpu=st * sequences, usable_bytes_per_gpu=usable, fits=n >= sequences,
                max_sequences=n, note="" if n >= sequences else "does not fit",
            )
        )  # fmt: skip
    return sorted(plans, key=lambda p: (not p.fits, p.pp, -p.max_sequences))


def fewest_gpus_plans(
    s: ModelSpec, limit: int, gpu_mem_gib: float, context: int, weight_dtype: str = "bf16", sequences: int = 1
) -> list[ParallelPlan]:
    """The plans of the fewest GPUs (of `gpu_counts(limit)`) that hold the model, best first; when
    none does, those of `limit` GPUs (none fitting; [] when no split of `limit` divides the model)."""
    plans: list[ParallelPlan] = []
    for n in gpu_counts(limit):
        plans = plan_parallel(s, n, gpu_mem_gib, context, weight_dtype, sequences)
        if plans and plans[0].fits:
            break
    return plans


def gpu_counts(limit: int) -> list[int]:
    """Candidate replica sizes up to `limit`: powers of two, and `limit` itself."""
    counts = [n for n in (2**i for i in range(12)) if n <= limit]
    return counts + ([limit] if limit not in counts else [])
