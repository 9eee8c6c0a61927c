"""Model code of the hybrid Kimi-Linear / Kimi-K3 family (see ARCHITECTURE.md, Inference runtime)."""

from inference.model.cache_tensors import HybridCacheSpec, HybridCacheTensors
from inference.model.factory import build_model, init_dummy_weights
from inference.model.forward_meta import ForwardMeta
from inference.model.kimi_linear import KimiLinearForCausalLM
from inference.model.multimodal import KimiVLForConditionalGeneration

__all__ = [
    "ForwardMeta",
    "HybridCacheSpec",
    "HybridCacheTensors",
    "KimiLinearForCausalLM",
    "KimiVLForConditionalGeneration",
    "build_model",
    "init_dummy_weights",
]
