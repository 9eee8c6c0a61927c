"""A loss-curve PNG drawn with Pillow (already a dependency; no plotting library needed)."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

__all__ = ["save_loss_curve", "save_success_bars"]


def save_loss_curve(steps: Sequence[int], losses: Sequence[float], path: str | Path) -> Path:
    """Training loss (log scale) against step, with labelled axes."""
    from PIL import Image, ImageDraw

    if len(steps) != len(losses) or not steps:
        raise ValueError("need equally many steps and losses, at least one")
    w, h, left, right, top, bottom = 800, 480, 70, 20, 30, 50
    img = Image.new("RGB", (w, h), "white")
    d = ImageDraw.Draw(img)
    ys = [math.log10(max(x, 1e-6)) for x in losses]
    lo, hi = math.floor(min(ys)), math.ceil(max(ys))
    hi = hi if hi > lo else lo + 1
    x_max = max(steps[-1], 1)

    def px(step: float, y: float) -> tuple[float, float]:
        return (
            left + (w - left - right) * step / x_max,
            top + (h - top - bottom) * (hi - y) / (hi - lo),
        )

    d.rectangle([left, top, w - right, h - bottom], outline="black")
    for e in range(lo, hi + 1):
        _, y = px(0, e)
        d.line([left, y, w - right, y], fill=(220, 220, 220))
        d.text((5, y - 6), f"{10**e:g}", fill="black")
    for i in range(6):
        s = x_max * i / 5
        x, _ = px(s, lo)
        d.text((x - 10, h - bottom + 5), f"{int(s)}", fill="black")
    d.line([px(s, y) for s, y in zip(steps, ys, strict=True)], fill=(200, 30, 30), width=2)
    d.text((left, 8), "demo model: training loss (assistant tokens, log scale)", fill="black")
    d.text((w // 2 - 15, h - 20), "step", fill="black")
    out = Path(path)
    img.save(out, format="PNG")
    return out


def save_success_bars(runs: Mapping[str, Mapping[str, Any]], path: str | Path) -> Path:
    """Task success per category, one bar per run (`{label: demo_eval summary}`), with the target."""
    from PIL import Image, ImageDraw

    if not runs:
        raise ValueError("need at least one run")
    cats = [*next(iter(runs.values()))["per_category"], "overall"]
    w, h, left, bottom, top = 900, 420, 50, 60, 40
    img = Image.new("RGB", (w, h), "white")
    d = ImageDraw.Draw(img)
    colours = [(150, 150, 150), (40, 110, 200), (200, 90, 30)]
    slot = (w - left - 20) / len(cats)
    bar = slot * 0.8 / len(runs)

    def y(v: float) -> float:
        return h - bottom - (h - bottom - top) * v

    for v in (0.0, 0.5, 0.9, 1.0):
        d.line([left, y(v), w - 20, y(v)], fill=(200, 60, 60) if v == 0.9 else (220, 220, 220))
        d.text((8, y(v) - 6), f"{v:.0%}", fill="black")
    for i, c in enumerate(cats):
        for j, summary in enumerate(runs.values()):
            row = summary["overall"] if c == "overall" else summary["per_category"].get(c, {})
            v = row.get("success") or 0.0
            x0 = left + i * slot + slot * 0.1 + j * bar
            d.rectangle([x0, y(v), x0 + bar - 2, y(0)], fill=colours[j % len(colours)])
        d.text((left + i * slot + 4, h - bottom + 6), c, fill="black")
    for j, label in enumerate(runs):
        d.rectangle([left + j * 220, 10, left + j * 220 + 12, 22], fill=colours[j % len(colours)])
        d.text((left + j * 220 + 18, 10), label, fill="black")
    d.text((w - 260, 10), "held-out task success (target 90%)", fill="black")
    out = Path(path)
    img.save(out, format="PNG")
    return out
