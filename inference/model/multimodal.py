"""Text model plus MoonViT tower and projector (`language_model.*`, `vision_tower.*`, `mm_projector.*`)."""

from __future__ import annotations

import torch
from torch import Tensor, nn

from inference.config import ModelSpec
from inference.model.cache_tensors import HybridCacheTensors
from inference.model.forward_meta import ForwardMeta
from inference.model.text_models import text_model_class
from inference.model.vision import MoonViT, MultimodalProjector

__all__ = ["KimiVLForConditionalGeneration"]


class KimiVLForConditionalGeneration(nn.Module):
    """Same `forward` contract as the text model; images enter as `image_embeds`."""

    def __init__(self, spec: ModelSpec) -> None:
        super().__init__()
        if spec.vision is None:
            raise ValueError("a multimodal model needs a vision_config")
        self.spec = spec
        self.language_model = text_model_class(spec)(spec)
        self.vision_tower = MoonViT(spec.vision)
        self.mm_projector = MultimodalProjector(spec.vision, spec.hidden_size)

    @torch.no_grad()
    def encode_images(self, pixel_values: Tensor, grid_thw: Tensor) -> Tensor:
        """`[P, 3, 14, 14]` patches + `[I, 3]` grids -> `[sum_i h_i*w_i/4, hidden]` text-space embeddings."""
        return self.mm_projector(self.vision_tower(pixel_values, grid_thw))

    def supports_decode_graphs(self, dtype: torch.dtype) -> bool:
        """See `KimiLinearForCausalLM.supports_decode_graphs` (decode steps carry no images)."""
        return self.language_model.supports_decode_graphs(dtype)

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
