"""Images in chat messages: decode + patchify through `preprocess`, encode with the model's vision
tower, and hand the chat template (placeholder count, content hash, embeddings).

Only inline images are accepted (`data:image/...;base64,...`, or the bare base64 string): the
server fetches nothing. The content hash from `preprocess` is what the prefix cache keys on.
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Mapping
from typing import Any

import torch

from inference.chat import ImageHandler


def _image_bytes(part: Mapping[str, Any]) -> bytes:
    src = part.get("image_url", part.get("image"))
    if isinstance(src, Mapping):
        src = src.get("url")
    if not isinstance(src, str) or not src:
        raise ValueError("an image part needs image_url.url (a data: URL)")
    if src.startswith(("http://", "https://")):
        raise ValueError("remote image URLs are not fetched; send the image inline as a data: URL")
    if src.startswith("data:"):
        head, _, src = src.partition(",")
        if ";base64" not in head:
            raise ValueError("image data URLs must be base64-encoded")
    try:
        return base64.b64decode(src, validate=True)
    except (binascii.Error, ValueError):
        raise ValueError("the image is not valid base64") from None


def make_image_handler(engine: Any) -> ImageHandler | None:
    """The handler for this engine's model, or None if the model has no vision tower."""
    model = engine.runner.model
    spec = getattr(model, "spec", None)
    if spec is None or spec.vision is None or not hasattr(model, "encode_images"):
        return None
    try:
        pad = engine.tokenizer.token_id("<|media_pad|>")
    except ValueError:
        return None
    if pad != spec.image_token_id:
        raise ValueError(
            f"the tokenizer's <|media_pad|> is {pad}, the model's image token is {spec.image_token_id}"
        )
    from preprocess import ImageError, PreprocessConfig, process_image

    config = PreprocessConfig(patch_size=spec.vision.patch_size, merge_size=spec.vision.merge_kernel[0])
    device = engine.runner.device
    dtype = next(model.vision_tower.parameters()).dtype

    def handle(part: Mapping[str, Any]) -> tuple[int, str, torch.Tensor]:
        data = _image_bytes(part)
        try:
            img = process_image(data, config)
        except ImageError as exc:
            raise ValueError(f"image rejected: {exc}") from None
        pixels = torch.as_tensor(img.pixel_values.copy()).to(device=device, dtype=dtype)
        grid = torch.as_tensor(img.grid_thw).to(device)
        with torch.inference_mode():
            emb = model.encode_images(pixels, grid)
        return int(emb.shape[0]), img.content_hash, emb

    return handle
