"""A vision-language model under TP / EP (gloo ranks): the driver holds the vision tower and
projector whole and sends each request's image embeddings to the ranks, which run the sharded
language model. Greedy fp32 tokens and cached-token counts equal TP=1's on the same random model
(and from the same checkpoint), with images split across prefill chunks and a later turn hitting
the prefix cache past its image."""

from __future__ import annotations

import base64
import io
import json

import numpy as np
import pytest
from PIL import Image

from inference.chat import engine_frontend
from inference.engine.factory import build_engine, small_vl_model_config
from inference.server.images import make_image_handler
from inference.server.protocol import OpenAIServing, mm_inputs
from testing.checkpoint_files import write_byte_tokenizer
from tests.inference.parallel.test_parallel_engine import CONFIG


def _data_url(seed: int, size: tuple[int, int]) -> str:
    rgb = np.random.default_rng(seed).integers(0, 255, (*size, 3), dtype=np.uint8)
    buf = io.BytesIO()
    Image.fromarray(rgb).save(buf, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()


def _user(text: str, seed: int) -> dict:
    url = _data_url(seed, (84, 112))  # 6x8 patches -> 3x4 = 12 image tokens
    return {
        "role": "user",
        "content": [{"type": "text", "text": text}, {"type": "image_url", "image_url": {"url": url}}],
    }


def _generate(engine, serving: OpenAIServing, bodies: list[dict]) -> list[tuple[list[int], int, int]]:
    """(greedy tokens, cached prompt tokens, end of the last image) of each chat body, one batch."""
    rids, ends = [], []
    for body in bodies:
        p = serving.prepare_chat(body)
        ends.append(max(s.offset + s.length for s in p.mm_spans))
        rids.append(
            engine.add_request(
                p.prompt_token_ids,
                p.sampling,
                mm_spans=p.mm_spans,
                mm_inputs=mm_inputs(p),
                message_ends=p.message_ends,
            )
        )
    reqs = {rid: engine.scheduler.requests[rid] for rid in rids}
    while engine.has_unfinished:
        engine.step()
    return [(reqs[r].output_token_ids, reqs[r].num_cached_tokens, e) for r, e in zip(rids, ends, strict=True)]


def _run(engine) -> list[tuple[list[int], int, int]]:
    """Two requests with different images, then the first one's next turn (same image)."""
    serving = OpenAIServing(
        engine_frontend(engine),
        "m",
        CONFIG.scheduler.max_model_len,
        image_handler=make_image_handler(engine),
    )
    params = {"max_tokens": 6, "temperature": 0, "ignore_eos": True}
    first = [_user("what is in this picture?", 1)]
    rounds = _generate(
        engine, serving, [{"messages": first, **params}, {"messages": [_user("and here?", 2)], **params}]
    )
    reply = engine.tokenizer.decode(rounds[0][0])
    follow = [*first, {"role": "assistant", "content": reply}, {"role": "user", "content": "tell me more"}]
    return rounds + _generate(engine, serving, [{"messages": follow, **params}])


@pytest.fixture(scope="module")
def reference() -> list[tuple[list[int], int, int]]:
    return _run(build_engine(config=small_vl_model_config(), engine_config=CONFIG))


@pytest.mark.parametrize(("tp", "ep"), [(2, 1), (1, 2)], ids=["tp2", "ep2"])
def test_vision_model_under_parallelism_matches_tp1(reference, tp: int, ep: int) -> None:
    engine = build_engine(
        config=small_vl_model_config(), engine_config=CONFIG, tensor_parallel_size=tp, expert_parallel_size=ep
    )
    try:
        got = _run(engine)
        encoder = engine.runner.model.encoder_cache.stats()
    finally:
        engine.runner.close()
    assert got == reference
    _, cached, image_end = reference[2]
    assert cached >= image_end  # the next turn hit the prefix cache past its image
    assert encoder["images_encoded"] == 2 and encoder["hits"] == 1  # in the driver, each image once


def test_vision_checkpoint_loaded_by_driver_and_ranks_matches_tp1(tmp_path) -> None:
    """The checkpoint's `language_model.*` is sliced by the ranks, its tower read by the driver."""
    from inference.config import parse_config
    from inference.loader import save_sharded
    from inference.model.factory import build_model

    cfg = small_vl_model_config()
    save_sharded(build_model(parse_config(cfg), seed=7).state_dict(), tmp_path, max_shard_bytes=300_000)
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    write_byte_tokenizer(tmp_path)
    want = _run(build_engine(model_dir=tmp_path, engine_config=CONFIG))
    engine = build_engine(model_dir=tmp_path, engine_config=CONFIG, tensor_parallel_size=2)
    try:
        assert _run(engine) == want
    finally:
        engine.runner.close()


@pytest.mark.gpu
def test_nccl_vision_model_matches_tp1_on_gpus() -> None:
    """The same check on 2 GPUs (NCCL; the tower on GPU 0 in the driver), fp32, against TP=1 on a
    GPU; the multi-GPU issues run it."""
    import torch

    if torch.cuda.device_count() < 2:
        pytest.skip(f"needs 2 GPUs, this host has {torch.cuda.device_count()}")
    want = _run(build_engine(config=small_vl_model_config(), engine_config=CONFIG, device="cuda"))
    engine = build_engine(
        config=small_vl_model_config(), engine_config=CONFIG, device="cuda", tensor_parallel_size=2
    )
    try:
        assert _run(engine) == want
    finally:
        engine.runner.close()
