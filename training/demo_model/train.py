"""Train the demo model: corpus -> tokenizer -> hybrid model -> safetensors + manifest + loss curve.

    python -m training.demo_model.train --out DIR --encode-only --corpus FILE   # on a CPU machine
    python -m training.demo_model.train --out DIR --device cuda --kda ref --corpus FILE --wall-budget 440
    python -m training.demo_model.train --out DIR --device cpu --tokens-per-batch 2048 --ref-chunk 8

Everything that decides the result is in `TrainConfig` (committed defaults, written next to the
weights as `train_config.json`): the corpus seeds and size, the tokenizer's vocabulary, the
optimiser and its schedule. A checkpoint is made in the two steps above: the corpus encoded on a
CPU machine (building it runs the real tools, PDF parser and image preprocessing, which a bare GPU
machine lacks), then trained from that file on one GPU (`train_log.json` records the device,
steps and seconds). The tokenizer is trained only when `--tokenizer` names no existing
file (`tokenizer_train.py`; reusing the committed `tokenizer.json` keeps its ids). Sample `i`
comes from seed `corpus_seed + i`, so the corpus is the same however many worker processes build it.

Image placeholders get a zero input embedding, and the saved checkpoint's projector ends in a zero
layer, so the engine feeds zeros there too: the model reads an image's size and format through
`image_info`, never its pixels, and training matches serving exactly.

The learning-rate schedule runs on `progress = max(step / steps, elapsed / time_budget)`: a run
that is slower than planned still warms down fully before its time budget ends. `--wall-budget S`
sets the time budget to what is left of S seconds after the corpus is built (less a margin for
saving), so the whole command ends within S. With the time budget the limit, the number of steps
(and so the weights) depends on the machine's speed; `train_log.json` records the steps reached
and the learning rate every 10 steps. `--steps N --time-budget 1e9` runs N steps on a schedule by
step alone (the same seeds and batches; it matches a timed run's schedule only as far as its steps
took equal time, and GPU reductions may differ in the last bits between runs).

Every conversation starts with the same tokens (the tools declaration and the user header): the
training forward computes that prefix once per batch and continues each row from its state, as the
engine's prefix cache does at serving time, and the loss covers the assistant tokens only.

On the H200 `--kda fla` uses fla's chunk_kda forward and backward; its first calls compile and
autotune Triton kernels for every new shape, which took the whole of a 7-minute device slot here
(no step finished), so `--kda ref` (the batched PyTorch reference, with 32-token chunks on a GPU)
is the dependable GPU choice. On CUDA the model trains in fp32 with TF32 matmuls: the model is so
small that kernel launches, not arithmetic, bound a step, and bf16 autocast would only add casts.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import torch.nn.functional as F

from inference.demo_model.spec import TRAIN_SEED, demo_config, write_chat_files
from training.demo_model.train_forward import text_model, train_hidden

# the tokenizer the corpus is encoded with (the trainer copies it next to the weights)
TOKENIZER = Path(__file__).resolve().parent / "weights" / "tokenizer.json"

__all__ = ["TOKENIZER", "TrainConfig", "encode_corpus", "load_corpus", "main", "save_corpus", "train"]


@dataclass(frozen=True, slots=True)
class TrainConfig:
    corpus_seed: int = TRAIN_SEED
    num_samples: int = 200_000
    vocab_size: int = 4096
    tokenizer_samples: int = 6000
    max_len: int = 1280  # an image alone takes up to 841 placeholders (sides up to 800 px)
    bucket: int = 64  # sequences are padded to a multiple of this
    tokens_per_batch: int = 24_576
    steps: int = 100_000  # in practice the time budget ends the run (see the module docstring)
    time_budget_s: float = 330.0
    ref_chunk: int = 32  # the `kda="ref"` chunk (8 is cheaper on a CPU)
    lr: float = 4e-3
    min_lr_ratio: float = 0.02
    warmup_steps: int = 100
    weight_decay: float = 0.05
    grad_clip: float = 1.0
    router_bias_rate: float = 1e-3  # aux-loss-free MoE balancing (DeepSeek-V3 style)
    seed: int = 0


def _encode_range(args: tuple[str, int, int, int]) -> list[tuple[list[int], list[bool]]]:
    tokenizer_path, seed0, start, stop = args
    torch.set_num_threads(1)
    from inference.tokenizer import HFTokenizer
    from training.demo_model.corpus import ToolBox, make_task
    from training.demo_model.render import example

    tok = HFTokenizer(tokenizer_path)
    box = ToolBox()
    out = []
    for i in range(start, stop):
        task = make_task(box, seed0 + i)
        out.append(example(tok, task.messages, box.tools, task.image_tokens))
    return out


def encode_corpus(
    tokenizer_path: str, seed0: int, n: int, workers: int
) -> list[tuple[list[int], list[bool]]]:
    """Samples `seed0 .. seed0 + n - 1` as (ids, loss mask), in seed order."""
    chunk = 2000
    jobs = [(tokenizer_path, seed0, s, min(s + chunk, n)) for s in range(0, n, chunk)]
    if workers <= 1:
        return [x for j in jobs for x in _encode_range(j)]
    import multiprocessing as mp

    with mp.get_context("spawn").Pool(workers) as pool:
        return [x for part in pool.map(_encode_range, jobs) for x in part]


def save_corpus(samples: list[tuple[list[int], list[bool]]], path: Path) -> None:
    """Encoded samples, LZMA-compressed: `{"lengths", "tokens", "masks"}` (uint32, uint16, uint8)."""
    import array
    import base64
    import lzma

    lengths = array.array("I", (len(s) for s, _ in samples))
    tokens = array.array("H", (t for s, _ in samples for t in s))
    masks = array.array("B", (int(b) for _, m in samples for b in m))
    blob = {
        k: base64.b64encode(lzma.compress(v.tobytes())).decode()
        for k, v in (("lengths", lengths), ("tokens", tokens), ("masks", masks))
    }
    path.write_text(json.dumps(blob))


def load_corpus(path: Path) -> list[tuple[list[int], list[bool]]]:
    """`save_corpus`'s file -> samples."""
    import array
    import base64
    import lzma

    blob = json.loads(path.read_text())
    arrays = {}
    for key, code in (("lengths", "I"), ("tokens", "H"), ("masks", "B")):
        arrays[key] = array.array(code)
        arrays[key].frombytes(lzma.decompress(base64.b64decode(blob[key])))
    out, pos = [], 0
    for n in arrays["lengths"]:
        out.append(
            (arrays["tokens"][pos : pos + n].tolist(), [bool(b) for b in arrays["masks"][pos : pos + n]])
        )
        pos += n
    return out


def _common_prefix(rows: list[list[int]]) -> list[int]:
    """The longest token prefix all rows share (the tools declaration and the user header)."""
    first = rows[0]
    n = min(len(r) for r in rows)
    for r in rows:
        while n and r[:n] != first[:n]:
            n = next(i for i in range(n) if r[i] != first[i])
    return first[:n]


def _batches(
    samples: list[tuple[list[int], list[bool]]], cfg: TrainConfig, pad_id: int, gen: torch.Generator
):
    """Endless length-bucketed batches `(ids [B, L], mask [B, L])`, reshuffled every epoch."""
    buckets: dict[int, list[int]] = {}
    for i, (ids, _) in enumerate(samples):
        if 0 < len(ids) <= cfg.max_len:
            buckets.setdefault(-(-len(ids) // cfg.bucket) * cfg.bucket, []).append(i)
    while True:
        plan = []
        for length, idx in sorted(buckets.items()):
            per = max(1, cfg.tokens_per_batch // length)
            order = [idx[j] for j in torch.randperm(len(idx), generator=gen).tolist()]
            plan += [(length, order[k : k + per]) for k in range(0, len(order), per)]
        for p in torch.randperm(len(plan), generator=gen).tolist():
            length, rows = plan[p]
            ids = torch.full((len(rows), length), pad_id, dtype=torch.long)
            mask = torch.zeros(len(rows), length, dtype=torch.bool)
            for r, i in enumerate(rows):
                s, m = samples[i]
                ids[r, : len(s)] = torch.tensor(s)
                mask[r, : len(m)] = torch.tensor(m)
            yield ids, mask


def _lr(cfg: TrainConfig, step: int, progress: float) -> float:
    if step < cfg.warmup_steps:
        return cfg.lr * (step + 1) / cfg.warmup_steps
    cos = 0.5 * (1 + math.cos(math.pi * min(progress, 1.0)))
    return cfg.lr * (cfg.min_lr_ratio + (1 - cfg.min_lr_ratio) * cos)


def train(
    cfg: TrainConfig,
    out: Path,
    *,
    device: str,
    tokenizer: Path,
    workers: int,
    kda: str,
    corpus: Path | None = None,
    wall_budget_s: float | None = None,
) -> dict:
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    from inference.config import parse_config
    from inference.loader import save_sharded
    from inference.model.factory import build_model
    from inference.model.moe import SparseMoE
    from inference.tokenizer import HFTokenizer

    t_start = time.perf_counter()
    if device == "cpu":
        torch.set_num_threads(1)  # the CPU fallback: one core
    else:
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
    out.mkdir(parents=True, exist_ok=True)
    if not tokenizer.is_file():
        from training.demo_model.corpus import ToolBox, make_task
        from training.demo_model.tokenizer_train import collect_segments, train_tokenizer

        box = ToolBox()
        tasks = (make_task(box, cfg.corpus_seed + i) for i in range(cfg.tokenizer_samples))
        convs = ((t.messages, box.tools, t.image_tokens) for t in tasks)
        train_tokenizer(collect_segments(convs), cfg.vocab_size, tokenizer)
    tok = HFTokenizer(tokenizer)
    (out / "tokenizer.json").write_bytes(tokenizer.read_bytes())
    config = demo_config(tok.vocab_size, tok.token_id("<|media_pad|>"))
    (out / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    write_chat_files(out, {t: tok.token_id(t) for t in ("[BOS]", "[EOS]", "<|im_end|>")})

    if corpus is not None and corpus.is_file():
        samples = load_corpus(corpus)[: cfg.num_samples]
    else:
        samples = encode_corpus(str(tokenizer), cfg.corpus_seed, cfg.num_samples, workers)
        if corpus is not None:
            save_corpus(samples, corpus)
    prefix = _common_prefix([s for s, _ in samples])
    samples = [(s[len(prefix) :], m[len(prefix) :]) for s, m in samples]
    n_tok = sum(len(s) for s, _ in samples)
    t_data = time.perf_counter() - t_start
    print(
        f"corpus: {len(samples)} samples, shared prefix {len(prefix)} + {n_tok} tokens, {t_data:.1f} s",
        flush=True,
    )
    if wall_budget_s is not None:  # what is left of the wall budget, less a margin for saving
        from dataclasses import replace

        cfg = replace(cfg, time_budget_s=max(10.0, wall_budget_s - t_data - 25.0))
    (out / "train_config.json").write_text(json.dumps(asdict(cfg), indent=2) + "\n")

    torch.manual_seed(cfg.seed)
    dev = torch.device(device)
    model = build_model(
        parse_config(config), load_format="dummy", dtype=torch.float32, device=dev, seed=cfg.seed
    )
    model.train()
    lm = text_model(model)
    params = [p for n, p in model.named_parameters() if n.startswith("language_model.")]
    decay = [p for p in params if p.dim() >= 2]
    no_decay = [p for p in params if p.dim() < 2]
    opt = torch.optim.AdamW(
        [{"params": decay, "weight_decay": cfg.weight_decay}, {"params": no_decay, "weight_decay": 0.0}],
        lr=cfg.lr, betas=(0.9, 0.95), fused=dev.type == "cuda",
    )  # fmt: skip
    moes = [m for m in lm.modules() if isinstance(m, SparseMoE)]
    prefix_t = torch.tensor(prefix, dtype=torch.long, device=dev)
    gen = torch.Generator().manual_seed(cfg.seed)
    batches = _batches(samples, cfg, tok.token_id("[PAD]"), gen)
    log: list[dict] = []
    t0 = time.perf_counter()
    seen = done = 0
    with Progress(
        TextColumn("[bold]training"), BarColumn(), TextColumn("{task.completed}/{task.total}"),
        TextColumn("loss {task.fields[loss]:.4f}"), TextColumn("{task.fields[tps]:,.0f} tok/s"),
        TimeElapsedColumn(),
    ) as bar:  # fmt: skip
        task_bar = bar.add_task("train", total=cfg.steps, loss=float("nan"), tps=0.0)
        for step in range(cfg.steps):
            elapsed = time.perf_counter() - t0
            if elapsed > cfg.time_budget_s:
                break
            progress = max(step / cfg.steps, elapsed / cfg.time_budget_s)
            for g in opt.param_groups:
                g["lr"] = _lr(cfg, step, progress)
            ids, mask = next(batches)
            ids, mask = ids.to(dev, non_blocking=True), mask.to(dev, non_blocking=True)
            loads: list[torch.Tensor] = []
            hidden = train_hidden(
                model,
                ids,
                prefix=prefix_t,
                kda=kda,
                expert_loads=loads,
                ref_chunk=cfg.ref_chunk,
                zero_token_id=config["image_token_id"],
            )
            # logits only where there is a target: each row's first token is predicted from the
            # prefix's last position, which is never an assistant token
            logits = lm.lm_head(hidden[:, :-1][mask[:, 1:]])
            loss = F.cross_entropy(logits.float(), ids[:, 1:][mask[:, 1:]])
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(params, cfg.grad_clip)
            opt.step()
            with torch.no_grad():  # push each router's bias towards equal expert loads
                for moe, load in zip(moes, loads, strict=True):
                    moe.gate.e_score_correction_bias += cfg.router_bias_rate * torch.sign(
                        load.float().mean() - load.float()
                    )
            seen += ids.numel()
            done = step + 1
            if step % 10 == 0 or step == cfg.steps - 1:
                lv = loss.item()
                if step % 200 == 0 or step in (10, 50):  # plain lines too, for logs that are not a terminal
                    bar.console.print(
                        f"step {step} loss {lv:.4f} lr {opt.param_groups[0]['lr']:.2e} {elapsed:.1f} s"
                    )
                log.append({"step": step, "loss": lv, "lr": opt.param_groups[0]["lr"], "elapsed_s": elapsed})
                bar.update(
                    task_bar, completed=step + 1, loss=lv, tps=seen / max(time.perf_counter() - t0, 1e-9)
                )
            else:
                bar.update(task_bar, completed=step + 1)
    train_s = time.perf_counter() - t0
    model.eval()
    with torch.no_grad():  # image embeddings are zero, as in training (see train_hidden)
        model.mm_projector.proj[-1].weight.zero_()
        model.mm_projector.proj[-1].bias.zero_()
    state = {
        k: v.detach().to(torch.bfloat16)
        if v.is_floating_point() and not k.endswith(("A_log", "dt_bias", "e_score_correction_bias"))
        else v.detach()
        for k, v in model.state_dict().items()
    }
    save_sharded(state, out, max_shard_bytes=12 << 20)  # shards small enough to copy anywhere
    try:
        from training.demo_model.plot import save_loss_curve

        save_loss_curve([r["step"] for r in log], [r["loss"] for r in log], out / "loss_curve.png")
    except ImportError as exc:  # a bare GPU box without Pillow: plot from train_log.json later
        print(f"loss curve not drawn here ({exc})", flush=True)
    summary = {
        "steps": done,
        "time_budget_s": round(cfg.time_budget_s, 1),
        "final_loss": log[-1]["loss"] if log else None,
        "train_s": round(train_s, 1),
        "corpus_s": round(t_data, 1),
        "tokens_seen": seen,
        "s_per_step": round(train_s / max(done, 1), 4),
        "params": sum(p.numel() for p in model.parameters()),
        "device": torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu",
        "kda": kda,
    }
    (out / "train_log.json").write_text(json.dumps({"summary": summary, "log": log}, indent=1) + "\n")
    return summary


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--tokenizer", type=Path, default=TOKENIZER, help="trained there if absent")
    p.add_argument("--kda", choices=("fla", "ref"), default="ref", help="KDA path (see the module docstring)")
    p.add_argument(
        "--corpus", type=Path, default=None, help="encoded corpus file: read if present, else written"
    )
    p.add_argument("--encode-only", action="store_true", help="encode (and save) the corpus, then stop")
    p.add_argument("--workers", type=int, default=min(16, os.cpu_count() or 1))
    p.add_argument("--steps", type=int, default=None)
    p.add_argument("--samples", type=int, default=None)
    p.add_argument("--tokens-per-batch", type=int, default=None)
    p.add_argument("--time-budget", type=float, default=None)
    p.add_argument("--ref-chunk", type=int, default=None)
    p.add_argument(
        "--wall-budget", type=float, default=None, help="seconds for the whole command (see the docstring)"
    )
    args = p.parse_args(argv)
    cfg = TrainConfig()
    over = {"steps": args.steps, "num_samples": args.samples, "tokens_per_batch": args.tokens_per_batch,
            "time_budget_s": args.time_budget, "ref_chunk": args.ref_chunk}  # fmt: skip
    from dataclasses import replace

    cfg = replace(cfg, **{k: v for k, v in over.items() if v is not None})
    if args.encode_only:
        if args.corpus is None:
            p.error("--encode-only needs --corpus")
        save_corpus(
            encode_corpus(str(args.tokenizer), cfg.corpus_seed, cfg.num_samples, args.workers), args.corpus
        )
        return 0
    summary = train(
        cfg,
        args.out,
        device=args.device,
        tokenizer=args.tokenizer,
        workers=args.workers,
        kda=args.kda,
        corpus=args.corpus,
        wall_budget_s=args.wall_budget,
    )
    print(json.dumps(summary), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
