"""Text model plus MoonViT tower and projector (`language_model.*`, `vision_tower.*`, `mm_projector.*`).

Image embeddings are cached by the image's content hash (`VisionEncoderCache`, least recently used
out first, bounded in bytes): an agent re-sends its whole transcript every turn, and the same image
must not go through the tower again each time. `encode_images_cached` encodes all of a request's
uncached images in one tower call.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from inference.config import ModelSpec
from inference.model.cache_tensors import HybridCacheTensors
from inference.model.forward_meta import ForwardMeta
from inference.model.text_models import text_model_class
from inference.model.vision import MoonViT, MultimodalProjector, tokens_per_image

__all__ = ["ImageInput", "KimiVLForConditionalGeneration", "VisionEncoder", "VisionEncoderCache"]

DEFAULT_ENCODER_CACHE_BYTES = 256 * 1024 * 1024


@dataclass(frozen=True, slots=True)
class ImageInput:
    """One preprocessed image: its content hash (the cache key), `[P, 3, p, p]` patches, `[1, 3]` grid."""

    content_hash: str
    pixel_values: Tensor
    grid_thw: Tensor


class VisionEncoderCache:
    """content hash -> `[tokens, hidden]` embeddings; thread-safe; evicts least recently used
    entries once their bytes pass `max_bytes` (an entry larger than the bound is not kept)."""

    def __init__(self, max_bytes: int = DEFAULT_ENCODER_CACHE_BYTES) -> None:
        if max_bytes < 0:
            raise ValueError(f"max_bytes must be >= 0, got {max_bytes}")
        self.max_bytes = max_bytes
        self._entries: OrderedDict[str, Tensor] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()
        self.hits = 0
        self.misses = 0
        self.encoder_calls = 0  # tower forwards
        self.images_encoded = 0

    def get(self, key: str) -> Tensor | None:
        with self._lock:
            emb = self._entries.get(key)
            if emb is None:
                self.misses += 1
                return None
            self._entries.move_to_end(key)
            self.hits += 1
            return emb

    def put(self, key: str, emb: Tensor) -> None:
        size = emb.numel() * emb.element_size()
        with self._lock:
            old = self._entries.pop(key, None)
            if old is not None:
                self._bytes -= old.numel() * old.element_size()
            if size > self.max_bytes:
                return
            self._entries[key] = emb
            self._bytes += size
            while self._bytes > self.max_bytes:
                _, dropped = self._entries.popitem(last=False)
                self._bytes -= dropped.numel() * dropped.element_size()

    def __len__(self) -> int:
        return len(self._entries)

    @property
    def nbytes(self) -> int:
        return self._bytes

    def stats(self) -> dict[str, int]:
        with self._lock:
            return {
                "entries": len(self._entries),
                "bytes": self._bytes,
                "hits": self.hits,
                "misses": self.misses,
                "encoder_calls": self.encoder_calls,
                "images_encoded": self.images_encoded,
            }


class VisionEncoder(nn.Module):
    """The tower, projector and encoder cache: images to text-space embeddings. Alone, it is the
    image side of a parallel engine (held by the driver; the ranks hold the language model)."""

    def __init__(self, spec: ModelSpec, *, language_model: nn.Module | None = None) -> None:
        super().__init__()
        if spec.vision is None:
            raise ValueError("a multimodal model needs a vision_config")
        self.spec = spec
        if language_model is not None:  # first: the order dummy weights are drawn in
            self.language_model = language_model
        self.vision_tower = MoonViT(spec.vision)
        self.mm_projector = MultimodalProjector(spec.vision, spec.hidden_size)
        self.encoder_cache = VisionEncoderCache()

    @torch.no_grad()
    def encode_images(self, pixel_values: Tensor, grid_thw: Tensor) -> Tensor:
        """`[P, 3, 14, 14]` patches + `[I, 3]` grids -> `[sum_i h_i*w_i/4, hidden]` text-space embeddings."""
        return self.mm_projector(self.vision_tower(pixel_values, grid_thw))

    @torch.no_grad()
    def encode_images_cached(self, images: Sequence[ImageInput]) -> list[Tensor]:
        """Embeddings per image, from the cache where present; all the others (each distinct hash
        once) go through the tower together in one `encode_images` call."""
        cache = self.encoder_cache
        found: dict[str, Tensor] = {}
        todo: dict[str, ImageInput] = {}
        for img in images:
            if img.content_hash in found or img.content_hash in todo:
                continue
            emb = cache.get(img.content_hash)
            if emb is None:
                todo[img.content_hash] = img
            else:
                found[img.content_hash] = emb
        if todo:
            batch = list(todo.values())
            out = self.encode_images(
                torch.cat([i.pixel_values for i in batch]), torch.cat([i.grid_thw for i in batch])
            )
            counts = [sum(tokens_per_image(i.grid_thw, self.spec.vision.merge_kernel)) for i in batch]
            with cache._lock:
                cache.encoder_calls += 1
                cache.images_encoded += len(batch)
            for img, emb in zip(batch, out.split(counts), strict=True):
                emb = emb.clone()  # own storage: a cached slice would pin the whole batch
                cache.put(img.content_hash, emb)
                found[img.content_hash] = emb
        return [found[i.content_hash] for i in images]


class KimiVLForConditionalGeneration(VisionEncoder):
    """Same `forward` contract as the text model; images enter as `image_embeds`."""

    def __init__(self, spec: ModelSpec) -> None:
        super().__init__(spec, language_model=text_model_class(spec)(spec))

    def supports_decode_graphs(self, dtype: torch.dtype) -> bool:
        """See `KimiLinearForCausalLM.supports_decode_graphs` (decode steps carry no images)."""
        return self.language_model.supports_decode_graphs(dtype)

    def supports_short_step_graphs(self, dtype: torch.dtype) -> bool:
        """See `KimiLinearForCausalLM.supports_short_step_graphs` (steps with images run eagerly)."""
        return self.language_model.supports_short_step_graphs(dtype)

    def forward(
        self,
        input_ids: Tensor,
        meta: ForwardMeta,
        cache: HybridCacheTensors,
        *,
        image_embeds: Tensor | None = None,
    ) -> Tensor:
        """See `KimiLinearForCausalLM.forward`; `image_embeds` come from `encode_images`."""
        return self.language_model(input_ids, meta, cache, image_embeds=image_embeds)
