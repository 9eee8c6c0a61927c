"""A loss-curve PNG drawn with Pillow (already a dependency; no plotting library needed)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path

__all__ = ["save_loss_curve"]


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
