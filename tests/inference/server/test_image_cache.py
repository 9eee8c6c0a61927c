"""Vision-encoder cache and batching: an image repeated across turns is encoded once, and its
placeholders (keyed by content hash) are prefix-cache hits on later turns."""

from __future__ import annotations

import base64
import io

import httpx
import numpy as np
import pytest
import torch
from PIL import Image

from inference.embedded import EMBEDDED_ENGINE_CONFIG, EmbeddedEngineClient
from inference.engine.factory import build_engine, small_vl_model_config
from inference.model.multimodal import ImageInput, VisionEncoderCache
from inference.server.images import ImageSources
from inference.server.serve import BackgroundServer
from preprocess import BlobStore, PreprocessConfig, ProcessedCache

CFG = small_vl_model_config()
# A checkpoint every block, so a prefix hit can reach just past the image.
ENGINE = EMBEDDED_ENGINE_CONFIG.evolve(checkpoint_interval=16, num_blocks=512, max_model_len=512 * 16)


def _png(seed: int, size=(168, 224)) -> bytes:
    rgb = np.random.default_rng(seed).integers(0, 255, (*size, 3), dtype=np.uint8)
    buf = io.BytesIO()
    Image.fromarray(rgb).save(buf, format="PNG")
    return buf.getvalue()


def _data_url(data: bytes) -> str:
    return "data:image/png;base64," + base64.b64encode(data).decode()


def _engine():
    engine = build_engine(config=CFG, engine_config=ENGINE)
    calls: list[int] = []
    engine.runner.model.vision_tower.register_forward_hook(lambda _m, args, _o: calls.append(len(args[1])))
    return engine, calls


def _image_end(prompt_ids: list[int], pad_id: int) -> int:
    return max(i for i, t in enumerate(prompt_ids) if t == pad_id) + 1


def _first_message(image_url: str) -> dict:
    return {
        "role": "user",
        "content": [
            {"type": "text", "text": "what is in this picture?"},
            {"type": "image_url", "image_url": {"url": image_url}},
        ],
    }


def _three_turns(send, image_url: str) -> list[dict]:
    msgs = [_first_message(image_url)]
    out = []
    for follow_up in ("tell me more", "and the colours?", None):
        resp = send({"messages": msgs, "max_tokens": 4, "temperature": 0, "ignore_eos": True})
        out.append(resp)
        if follow_up:
            msgs = [*msgs, resp["choices"][0]["message"], {"role": "user", "content": follow_up}]
    return out


def _image_end(serving, image_url: str) -> int:
    """Prompt position just past the image's placeholders (rendering reads, never encodes)."""
    rendered = serving.frontend.renderer.render(
        [_first_message(image_url)], image_handler=serving.image_handler
    )
    (span,) = rendered.mm_spans
    assert span.length == 48  # 224x168 -> 16x12 patches -> 8x6 merged tokens
    return span.offset + span.length


def _check(turns: list[dict], calls: list[int], cache: VisionEncoderCache, image_end: int) -> None:
    assert calls == [1]  # the tower ran once, for one image
    stats = cache.stats()
    assert stats["encoder_calls"] == 1 and stats["images_encoded"] == 1 and stats["hits"] == 2
    first, *later = (t["usage"] for t in turns)
    assert first["prompt_tokens_details"]["cached_tokens"] < image_end
    for u in later:  # turns 2 and 3: the image's tokens (and everything before them) were cached
        assert u["prompt_tokens_details"]["cached_tokens"] >= image_end


@pytest.fixture
def one_thread():
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


def test_three_turns_one_image_encoded_once_embedded(one_thread):
    engine, calls = _engine()
    client = EmbeddedEngineClient(engine)
    try:
        url = _data_url(_png(3))
        end = _image_end(client.serving, url)
        _check(_three_turns(client.chat, url), calls, engine.runner.model.encoder_cache, end)
    finally:
        client.close()


def test_three_turns_by_reference_over_http(one_thread, tmp_path):
    blob_url = str(tmp_path / "blobs")
    cached = ProcessedCache(BlobStore(blob_url)).process(_png(4), PreprocessConfig())
    url = f"dayzero-processed:{cached.processed_sha256}"
    engine, calls = _engine()
    with BackgroundServer(engine, model_name="m", images=ImageSources(blob_url=blob_url)) as srv:
        with httpx.Client(base_url=srv.url, timeout=60) as http:

            def send(body):
                r = http.post("/v1/chat/completions", json=body)
                assert r.status_code == 200, r.text
                return r.json()

            turns = _three_turns(send, url)
        end = _image_end(srv.app.state.serving, url)
    _check(turns, calls, engine.runner.model.encoder_cache, end)


def test_encoder_cache_is_bounded_lru():
    cache = VisionEncoderCache(max_bytes=3 * 4 * 8)  # three [2, 4] fp32 entries
    for key in "abc":
        cache.put(key, torch.zeros(2, 4))
    assert cache.get("a") is not None  # a is now the most recent
    cache.put("d", torch.zeros(2, 4))
    assert cache.get("b") is None and cache.get("a") is not None and len(cache) == 3
    cache.put("huge", torch.zeros(100, 4))  # larger than the bound: not kept, nothing evicted
    assert cache.get("huge") is None and len(cache) == 3 and cache.nbytes == 96
    with pytest.raises(ValueError):
        VisionEncoderCache(max_bytes=-1)


def test_images_of_a_request_are_encoded_in_one_call(one_thread):
    engine, calls = _engine()
    model = engine.runner.model
    config = PreprocessConfig()
    from preprocess import process_image

    imgs = [process_image(_png(s, size), config) for s, size in ((5, (56, 84)), (6, (112, 56)))]
    inputs = [
        ImageInput(i.content_hash, torch.from_numpy(i.pixel_values.copy()), torch.from_numpy(i.grid_thw))
        for i in imgs
    ]
    out = model.encode_images_cached([inputs[0], inputs[1], inputs[0]])
    assert calls == [2]  # one tower call holding both distinct images
    assert [o.shape[0] for o in out] == [6, 8, 6] and out[0] is out[2]
    for inp, got in zip(inputs, out, strict=False):  # the same as encoding each alone
        alone = model.encode_images(inp.pixel_values, inp.grid_thw)
        torch.testing.assert_close(got, alone, rtol=1e-5, atol=1e-5)
    before = len(calls)
    again = model.encode_images_cached(inputs[::-1])
    assert len(calls) == before and again[0] is out[1]  # both cached now: no tower call
