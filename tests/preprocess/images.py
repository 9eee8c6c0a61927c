"""Deterministic generated test images (no files shipped, no downloads)."""

from __future__ import annotations

import io

import numpy as np
from PIL import Image


def smooth_rgb(width: int, height: int, seed: int = 0) -> np.ndarray:
    """Gradients, stripes and mild noise: exercises the bicubic kernel like a photo would."""
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:height, 0:width].astype(np.float32)
    fx, fy = rng.uniform(5, 60, 2)
    r = 128 + 120 * np.sin(x / fx + y / (2 * fy))
    g = 128 + 120 * np.cos(x / (3 * fy) - y / fx)
    b = 255 * (x + y) / max(1, width + height - 2)
    img = np.stack([r, g, b], axis=-1) + rng.normal(0, 6, (height, width, 3))
    return np.clip(img, 0, 255).astype(np.uint8)


def encode(img: Image.Image, fmt: str, **params) -> bytes:
    buf = io.BytesIO()
    img.save(buf, fmt, **params)
    return buf.getvalue()


def cartoon_face(size: int = 160, background: int = 90) -> np.ndarray:
    """A drawn frontal face (skin oval, dark eyes and brows, nose, mouth) that OpenCV's frontal
    Haar cascade detects; the canvas is 2*size square with the face in the middle."""
    import cv2

    img = np.full((size * 2, size * 2, 3), background, np.uint8)
    c = size
    cv2.ellipse(img, (c, c), (int(size * 0.42), int(size * 0.55)), 0, 0, 360, (200, 170, 150), -1)
    for dx in (-1, 1):
        ex, ey = c + dx * int(size * 0.18), c - int(size * 0.12)
        cv2.ellipse(img, (ex, ey), (int(size * 0.09), int(size * 0.045)), 0, 0, 360, (40, 30, 30), -1)
        brow = (ex - int(size * 0.1), ey - int(size * 0.1)), (ex + int(size * 0.1), ey - int(size * 0.11))
        cv2.line(img, *brow, (60, 40, 30), max(2, size // 30))
    cv2.line(img, (c, c - int(size * 0.05)), (c, c + int(size * 0.12)), (170, 140, 120), max(2, size // 40))
    cv2.ellipse(
        img, (c, c + int(size * 0.28)), (int(size * 0.15), int(size * 0.05)), 0, 0, 360, (120, 60, 60), -1
    )
    return cv2.GaussianBlur(img, (0, 0), size / 100)


def text_card(width: int = 640, height: int = 400, lines: int = 6) -> np.ndarray:
    """A grey photo-like background with a white 'document' carrying printed text lines."""
    import cv2

    img = smooth_rgb(width, height, seed=11) // 2 + 40
    x0, y0, x1, y1 = width // 6, height // 6, width * 5 // 6, height * 5 // 6
    cv2.rectangle(img, (x0, y0), (x1, y1), (250, 250, 250), -1)
    words = [
        "Name: Jane Example",
        "Account 0042-1234-5678",
        "Date of birth 01.02.1990",
        "Address 12 Sample St",
    ]
    for i in range(lines):
        y = y0 + 30 + i * ((y1 - y0 - 40) // lines)
        cv2.putText(
            img,
            words[i % len(words)],
            (x0 + 15, y),
            cv2.FONT_HERSHEY_SIMPLEX,
            0.6,
            (20, 20, 20),
            1,
            cv2.LINE_AA,
        )
    return img
