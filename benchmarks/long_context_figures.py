"""`benchmarks.long_context`'s figures file: merging a run's rows into it (each row tagged with what
measured it) and drawing its PNG."""

from __future__ import annotations

import json
from typing import Any

# -- the plot ---------------------------------------------------------------------------------
ROW_SECTIONS = ("prefill_decode", "returning", "turn10", "fp8")  # dicts of rows; the rest are rows


META = ("device", "torch", "quick", "config", "section_wall_s", "measured_by", "not_measured")


def merge(old: dict[str, Any], new: dict[str, Any], session: str, old_session: str) -> dict[str, Any]:
    """`new`'s rows into `old` (a figures file), each row tagged with who measured it: untagged
    rows of `old` get `old_session`, `new`'s get `session`; a new row replaces the old one of the
    same name. Rows that failed go to `not_measured` (the error, not the trace)."""

    def tag(row: Any, who: str) -> Any:
        if isinstance(row, dict) and "error" not in row:
            row.setdefault("measured_by", who)
        return row

    out = json.loads(json.dumps(old))
    for sec in ROW_SECTIONS:
        for row in out.get(sec, {}).values():
            tag(row, old_session)
    for sec in set(out) - set(META) - set(ROW_SECTIONS):
        tag(out[sec], old_session)
    failed = out.setdefault("not_measured", {})
    for sec, val in new.items():
        if sec in META:
            continue
        rows = val.items() if sec in ROW_SECTIONS and isinstance(val, dict) else [(None, val)]
        for name, row in rows:
            where = f"{sec}.{name}" if name else sec
            if isinstance(row, dict) and "error" in row:
                failed[where] = f"{session}: {row['error']}"
                continue
            failed.pop(where, None)
            if name is None:
                out[sec] = tag(row, session)
            else:
                out.setdefault(sec, {})[name] = tag(row, session)
    walls = out.setdefault("section_wall_s", {})
    for k, v in new.get("section_wall_s", {}).items():
        walls[k] = v
    return out


def plot(results: dict[str, Any], path: str) -> str | None:
    """Four panels of horizontal bars (Pillow; skipped where it is not installed); a bar's label
    names the session that measured it where the row says."""

    def label(name: str, row: Any) -> str:
        who = row.get("measured_by", "") if isinstance(row, dict) else ""
        return f"{name} [{who.split(' (')[0]}]" if who else name

    def rows(sec: str):
        return [(k, v) for k, v in results.get(sec, {}).items() if isinstance(v, dict)]

    pd = rows("prefill_decode") + [(f"fp8 {k}", v) for k, v in rows("fp8") if "ttft_s" in v]
    panels: list[tuple[str, list[tuple[str, float]]]] = [
        ("prefill TTFT (s)", [(label(k, v), v["ttft_s"]) for k, v in pd if "ttft_s" in v]),
        ("decode batch 1 (tok/s)", [(label(k, v), v["decode_tok_per_s"]) for k, v in pd if "decode_tok_per_s" in v]),
    ]  # fmt: skip
    bars = [(label(f"return {k}", v), v["ttft_ms"]) for k, v in rows("returning") if "ttft_ms" in v]
    bars += [(label(f"turn10 {k} {w}", v), v[f"ttft_ms_{w}_cache"]) for k, v in rows("turn10")
             if "ratio" in v for w in ("with", "without")]  # fmt: skip
    panels.append(("returning conversation / turn-10 TTFT (ms)", bars))
    pr = results.get("promotion", {})
    names = ("promotion_gb_per_s_consecutive", "promotion_gb_per_s_scattered", "pinned_h2d_gb_per_s")
    bw = [(label(k, pr), pr[k]) for k in names if k in pr]
    if not bw and "promotion_gb_per_s" in pr:  # a run from before the two layouts were measured
        bw = [(label("promotion_gb_per_s", pr), pr["promotion_gb_per_s"])]
    bw += [
        (label(f"in engine from {k}", v), v["promotion_gb_per_s"])
        for k, v in rows("returning")
        if "promotion_gb_per_s" in v
    ]
    panels.append(("bandwidth (GB/s)", bw))
    return bar_panels(panels, path)


def bar_panels(panels: list[tuple[str, list[tuple[str, float]]]], path: str) -> str | None:
    """Panels of labelled horizontal bars, one under the other, as a PNG (Pillow; None where it
    is not installed)."""
    try:
        from PIL import Image, ImageDraw
    except ImportError:
        return None
    row_h, w, label_w = 18, 900, 330
    h = sum(30 + row_h * max(len(b), 1) for _, b in panels) + 20
    img = Image.new("RGB", (w, h), "white")
    d = ImageDraw.Draw(img)
    y = 10
    for title, bars in panels:
        d.text((10, y), title, fill="black")
        y += 20
        top = max((v for _, v in bars), default=1) or 1
        for label, v in bars:
            d.text((10, y + 3), label[:52], fill="black")
            x1 = label_w + (w - label_w - 90) * v / top
            d.rectangle([label_w, y + 2, max(x1, label_w + 1), y + row_h - 3], fill=(70, 110, 180))
            d.text((x1 + 5, y + 3), f"{v:g}", fill="black")
            y += row_h
        y += 10
    img.save(path)
    return path
