"""Images in chat messages: preprocess -> vision tower -> placeholders; content-hash prefix keys."""

import base64
import io

import numpy as np
import pytest
import torch
from PIL import Image

from inference.embedded import EMBEDDED_ENGINE_CONFIG, EmbeddedEngineClient
from inference.engine.factory import build_engine, small_vl_model_config


def data_url(seed: int, size=(56, 84)) -> str:
    rgb = np.random.default_rng(seed).integers(0, 255, (*size, 3), dtype=np.uint8)
    buf = io.BytesIO()
    Image.fromarray(rgb).save(buf, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()


CFG = small_vl_model_config()  # the embedded default: MoonViT + projector on the small text model


@pytest.fixture(scope="module")
def client():
    n = torch.get_num_threads()
    eng = build_engine(config=CFG, engine_config=EMBEDDED_ENGINE_CONFIG.evolve(checkpoint_interval=64))
    c = EmbeddedEngineClient(eng)
    torch.set_num_threads(1)
    yield c
    c.close()
    torch.set_num_threads(n)


def ask(client, url, extra=()):
    content = [{"type": "text", "text": "what is this?"}, {"type": "image_url", "image_url": {"url": url}}]
    msgs = [{"role": "user", "content": content}, *extra]
    return client.chat({"messages": msgs, "max_tokens": 6, "temperature": 0, "ignore_eos": True})


def test_image_chat_and_cache_keys(client):
    a = ask(client, data_url(1))
    b = ask(client, data_url(2))
    assert b["usage"]["prompt_tokens_details"]["cached_tokens"] == 0  # a's checkpoints hold image 1
    # 56x84 pixels -> 4x6 patches -> 2x3 merged tokens = 6 placeholders
    assert a["usage"]["prompt_tokens"] == b["usage"]["prompt_tokens"]
    assert a["choices"][0]["message"]["content"] != b["choices"][0]["message"]["content"]
    # next turn with image 1: resumes from a's cache; the same turn with image 2 must not
    turn2 = [a["choices"][0]["message"], {"role": "user", "content": "and?"}]
    a2 = ask(client, data_url(1), turn2)
    assert a2["usage"]["prompt_tokens_details"]["cached_tokens"] >= a["usage"]["prompt_tokens"]
    # the same token ids with image 2 (placeholder ids are identical): the image hash in the block
    # and checkpoint keys keeps it off image 1's cache, so its output equals an uncached run
    a2_other = ask(client, data_url(2), turn2)
    assert a2_other["usage"]["prompt_tokens_details"]["cached_tokens"] > 0
    cold = EmbeddedEngineClient(
        build_engine(config=CFG, engine_config=EMBEDDED_ENGINE_CONFIG.evolve(enable_prefix_caching=False))
    )
    try:
        ref = ask(cold, data_url(2), turn2)
        assert ref["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
        assert a2_other["choices"][0]["message"] == ref["choices"][0]["message"]
        assert ask(cold, data_url(1), turn2)["choices"][0]["message"] == a2["choices"][0]["message"]
    finally:
        cold.close()


@pytest.mark.parametrize(
    ("url", "needle"),
    [
        ("https://example.com/x.png", "are not fetched"),
        ("data:image/png;base64,!!!", "base64"),
        ("data:image/png;base64," + base64.b64encode(b"not an image").decode(), "image rejected"),
    ],
)
def test_bad_images_are_clear_errors(client, url, needle):
    with pytest.raises(ValueError, match=needle):
        ask(client, url)


def test_text_only_model_refuses_images():
    c = EmbeddedEngineClient(
        build_engine(engine_config=EMBEDDED_ENGINE_CONFIG.evolve(num_blocks=64, max_model_len=1024))
    )
    try:
        with pytest.raises(ValueError, match="does not accept images"):
            ask(c, data_url(1))
    finally:
        c.close()
