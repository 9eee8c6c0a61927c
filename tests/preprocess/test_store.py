"""Content-addressed blob store (local directory and fsspec URLs) and the processed-result cache."""

from __future__ import annotations

import hashlib
import uuid

import numpy as np
import pytest
from PIL import Image

from preprocess import (
    BlobCorruptError,
    BlobNotFoundError,
    BlobStore,
    PreprocessConfig,
    ProcessedCache,
    ProcessedImage,
    content_hash,
    process_image,
)
from preprocess import pipeline as pipeline_mod
from tests.preprocess.images import encode, smooth_rgb


@pytest.fixture(params=["local", "memory"])
def store(request, tmp_path) -> BlobStore:
    if request.param == "local":
        return BlobStore(str(tmp_path / "blobs"))
    return BlobStore(f"memory://dayzero-test-{uuid.uuid4().hex}")


def test_put_get_roundtrip(store):
    data = b"some bytes" * 100
    sha = store.put(data)
    assert sha == hashlib.sha256(data).hexdigest()
    assert store.put(data) == sha  # idempotent
    assert store.exists(sha) and store.get(sha) == data
    missing = hashlib.sha256(b"other").hexdigest()
    assert not store.exists(missing)
    with pytest.raises(BlobNotFoundError):
        store.get(missing)
    with pytest.raises(ValueError):
        store.get("../../etc/passwd")


def test_corruption_detected(tmp_path):
    store = BlobStore(str(tmp_path))
    sha = store.put(b"original")
    path = tmp_path / "sha256" / sha[:2] / sha[2:4] / sha
    path.write_bytes(b"tampered")
    with pytest.raises(BlobCorruptError):
        store.get(sha)


def test_local_store_leaves_no_temp_files(tmp_path):
    store = BlobStore(str(tmp_path))
    for i in range(5):
        store.put(f"blob {i}".encode())
    names = [p.name for p in tmp_path.rglob("*") if p.is_file()]
    assert len(names) == 5 and not any(".tmp-" in n for n in names)


def test_refs(store):
    sha = store.put(b"x")
    assert store.get_ref("ns", "key") is None
    store.set_ref("ns", "key", sha)
    assert store.get_ref("ns", "key") == sha
    with pytest.raises(ValueError):
        store.set_ref("ns", "../escape", sha)


def test_processed_image_serialisation_roundtrip():
    img = process_image(encode(Image.fromarray(smooth_rgb(100, 60)), "PNG"))
    blob = img.to_bytes()
    assert blob == img.to_bytes()  # deterministic: same result, same blob hash
    back = ProcessedImage.from_bytes(blob)
    assert np.array_equal(back.pixel_values, img.pixel_values) and back.pixel_values.dtype == np.float32
    assert np.array_equal(back.grid_thw, img.grid_thw)
    assert back.content_hash == img.content_hash and back.redaction == img.redaction
    assert back.source_size == img.source_size and back.resized_size == img.resized_size


def test_content_hash_names_pixels_and_settings():
    rgb = smooth_rgb(90, 70, seed=1)
    cfg = PreprocessConfig()
    h = content_hash(rgb, cfg)
    assert h == content_hash(rgb.copy(), PreprocessConfig())
    assert h != content_hash(rgb, PreprocessConfig(max_patches=100))
    assert h != content_hash(rgb, PreprocessConfig(redact_documents=True))
    assert h == content_hash(rgb, PreprocessConfig(max_bytes=1000))  # limits do not change output
    changed = rgb.copy()
    changed[0, 0, 0] ^= 1
    assert h != content_hash(changed, cfg)
    # Same pixels in another container: same content hash.
    png, bmp = encode(Image.fromarray(rgb), "PNG"), encode(Image.fromarray(rgb), "BMP")
    assert process_image(png).content_hash == process_image(bmp).content_hash == h


def test_cache_processes_each_image_once(store, monkeypatch):
    calls = {"decode": 0, "finish": 0}
    real_decode, real_finish = pipeline_mod.decode_rgb_array, pipeline_mod._finish

    def counting_decode(*a, **k):
        calls["decode"] += 1
        return real_decode(*a, **k)

    def counting_finish(*a, **k):
        calls["finish"] += 1
        return real_finish(*a, **k)

    monkeypatch.setattr(pipeline_mod, "decode_rgb_array", counting_decode)
    monkeypatch.setattr(pipeline_mod, "_finish", counting_finish)
    cache = ProcessedCache(store)
    rgb = smooth_rgb(120, 80, seed=2)
    png = encode(Image.fromarray(rgb), "PNG")
    cfg = PreprocessConfig()

    first = cache.process(png, cfg)
    assert not first.cache_hit and calls == {"decode": 1, "finish": 1}
    again = cache.process(png, cfg)
    assert again.cache_hit and again.processed_sha256 == first.processed_sha256
    assert calls == {"decode": 1, "finish": 1}  # not even decoded again
    assert np.array_equal(again.image.pixel_values, first.image.pixel_values)

    # The same pixels as BMP: decoded (new bytes) but not processed again.
    other = cache.process(encode(Image.fromarray(rgb), "BMP"), cfg)
    assert other.cache_hit and other.processed_sha256 == first.processed_sha256
    assert calls == {"decode": 2, "finish": 1}

    # Different settings: a different result.
    smaller = cache.process(png, PreprocessConfig(max_patches=16))
    assert not smaller.cache_hit and smaller.image.num_patches < first.image.num_patches
    loaded = cache.load(first.processed_sha256)
    assert loaded.content_hash == first.image.content_hash
