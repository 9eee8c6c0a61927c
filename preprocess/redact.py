"""Privacy redaction: faces and document-like (text) regions, blurred or blacked out in place.

Runs right after decode, before hashing, resizing or storing, so no later stage sees the pixels.
The record keeps boxes and counts only, never pixels.

Detectors, both shipped inside `opencv-python-headless` (no download at run time):
* faces: OpenCV's bundled Haar cascades (frontal + profile, the profile one also mirrored), run on
  a copy scaled to at most `_DETECT_SIDE` pixels. `cv2.CascadeClassifier` and `cv2.data.haarcascades`
  exist in OpenCV 4.x; OpenCV 5 removed them, and then a request for face redaction fails with
  `RedactionUnavailableError` (fails closed) instead of passing pixels through unredacted.
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

_DETECT_SIDE = 1280
_FACE_CASCADES = ("haarcascade_frontalface_default.xml", "haarcascade_profileface.xml")
_MARGIN = 0.12  # grow each face box a little: cascades box the inner face, hair and ears identify too


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


def _face_cascades() -> tuple[Any, ...]:
    """The loaded cascades, one set per thread (a CascadeClassifier is not safe to share)."""
    cached = getattr(_LOCAL, "cascades", None)
    if cached is None:
        cached = _LOCAL.cascades = _load_face_cascades()
    return cached


def _clear_face_cascades() -> None:
    _LOCAL.cascades = None


def _load_face_cascades() -> tuple[Any, ...]:
    import cv2

    if not hasattr(cv2, "CascadeClassifier") or not hasattr(cv2, "data"):
        raise RedactionUnavailableError(
            f"face redaction needs OpenCV's Haar cascades, which OpenCV {cv2.__version__} no longer ships; "
            "install opencv-python-headless<5 or turn face redaction off",
            {"opencv": cv2.__version__},
        )
    cascades = []
    for name in _FACE_CASCADES:
        path = os.path.join(cv2.data.haarcascades, name)
        classifier = cv2.CascadeClassifier(path)
        if classifier.empty():
            raise RedactionUnavailableError(
                f"face redaction cannot load {name} from {cv2.data.haarcascades}; reinstall opencv-python-headless",
                {"cascade": name},
            )
        cascades.append(classifier)
    return tuple(cascades)


def _detection_gray(rgb: np.ndarray) -> tuple[np.ndarray, float]:
    import cv2

    h, w = rgb.shape[:2]
    scale = min(1.0, _DETECT_SIDE / max(h, w))
    small = (
        rgb
        if scale == 1.0
        else cv2.resize(
            rgb, (max(1, round(w * scale)), max(1, round(h * scale))), interpolation=cv2.INTER_AREA
        )
    )
    return cv2.cvtColor(small, cv2.COLOR_RGB2GRAY), scale


def detect_faces(gray: np.ndarray) -> list[tuple[int, int, int, int]]:
    import cv2

    eq = cv2.equalizeHist(gray)
    frontal, profile = _face_cascades()
    min_side = max(20, min(gray.shape[:2]) // 40)
    found: list[tuple[int, int, int, int]] = []
    for x, y, w, h in frontal.detectMultiScale(
        eq, scaleFactor=1.1, minNeighbors=5, minSize=(min_side, min_side)
    ):
        found.append((int(x), int(y), int(w), int(h)))
    # The profile cascade looks one way only; run it on the mirror image for the other.
    width = eq.shape[1]
    for flipped in (False, True):
        img = eq[:, ::-1].copy() if flipped else eq
        for x, y, w, h in profile.detectMultiScale(
            img, scaleFactor=1.1, minNeighbors=6, minSize=(min_side, min_side)
        ):
            x = width - int(x) - int(w) if flipped else int(x)
            found.append((x, int(y), int(w), int(h)))
    return _merge_overlapping(found)


def detect_documents(gray: np.ndarray) -> list[tuple[int, int, int, int]]:
    """Boxes around blocks of at least two text-like lines."""
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
        if 6 <= ch <= max(8, h // 10) and cw >= max(3 * ch, 24) and area >= 0.45 * cw * ch:
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
    # Pixelate to at most 8x8 cells (area average), then smooth: removes identity, keeps the scene plausible.
    h, w = region.shape[:2]
    cells = cv2.resize(region, (min(8, w), min(8, h)), interpolation=cv2.INTER_AREA)
    coarse = cv2.resize(cells, (w, h), interpolation=cv2.INTER_LINEAR)
    region[...] = cv2.GaussianBlur(coarse, (0, 0), max(w, h) / 16)


def detect(rgb: np.ndarray, config: PreprocessConfig) -> RedactionRecord:
    """Find what `config` asks to redact; boxes are in `rgb`'s pixel coordinates.

    Detection runs on a grey copy scaled to at most `_DETECT_SIDE` pixels (faces and text lines
    stay large enough there, and the cost no longer grows with the photo's size)."""
    if not config.redaction_enabled:
        return NO_REDACTION
    gray, scale = _detection_gray(rgb)
    boxes: list[RedactionBox] = []
    detectors: list[str] = []
    if config.redact_faces:
        detectors.append("opencv-haar:" + "+".join(_FACE_CASCADES))
        for box in detect_faces(gray):
            boxes.append(RedactionBox("face", *_to_full(box, scale, _MARGIN, rgb.shape)))
    if config.redact_documents:
        detectors.append("opencv-morphology:text-lines")
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
