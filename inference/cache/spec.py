"""The hybrid cache's spec: the shapes of its two pools and the bytes each entry takes (no torch).

One spec per engine (or per parallel rank, or pipeline stage): paged rows of the full-attention
layers (MLA latent + DSA indexer key, or GQA K|V) and one recurrent-state slot per sequence for the
linear-attention layers (KDA / GDN fp32 state + conv window). Its byte arithmetic is the only copy:
the device pools (`model/cache_tensors.py`) allocate these shapes, the memory planner sizes the
pools by these bytes, and `dayzero analyze` (`analyze/params.py`) reports them.

Bytes of one token of one paged layer (`kv_bytes_per_layer_token`):

* 16-bit KV: `(latent_dim + index_head_dim) * kv_dtype_bytes`;
* FP8 latent (`latent_fp8`): `latent_dim + 4` (e4m3 values and one fp32 scale per row), and with
  DSA `index_head_dim + 4` for the indexer key and its scale.

Bytes of one slot of one recurrent layer (`state_bytes_per_layer_slot`):
`num_heads * head_dim**2 * 4` (fp32 state) `+ conv_channels * conv_window * kv_dtype_bytes`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from inference.config import ModelSpec

if TYPE_CHECKING:
    import torch

__all__ = ["FP8_SCALE_BYTES", "STATE_DTYPE_BYTES", "HybridCacheSpec", "dtype_bytes"]

STATE_DTYPE_BYTES = 4  # recurrent states stay fp32
FP8_SCALE_BYTES = 4  # one fp32 scale per FP8 row


class _HasItemsize(Protocol):
    @property
    def itemsize(self) -> int: ...


def dtype_bytes(dtype: torch.dtype | _HasItemsize | int) -> int:
    """Bytes of one element: an int is taken as the byte count, a torch dtype gives its itemsize."""
    return dtype if isinstance(dtype, int) else int(dtype.itemsize)


@dataclass(frozen=True, slots=True)
class HybridCacheSpec:
    """Shapes and byte counts the engine sizes its pools from."""

    mla_layers: tuple[int, ...]  # the paged layers (MLA, or GQA on Qwen3-Next)
    kda_layers: tuple[int, ...]  # the recurrent layers (KDA, or GDN)
    latent_dim: int  # kv_lora_rank + qk_rope_head_dim (GQA: 2 * kv_heads * head_dim)
    index_head_dim: int  # 0 when DSA is off
    kda_num_heads: int
    kda_head_dim: int
    conv_channels: int  # 3 * num_heads * head_dim (q | k | v)
    conv_window: int  # kernel_size - 1
    kv_dtype_bytes: int
    latent_fp8: bool = False  # MLA latents as float8_e4m3fn with one fp32 scale per row

    @staticmethod
    def from_model_spec(
        spec: ModelSpec, dtype: torch.dtype | int = 2, *, latent_fp8: bool = False
    ) -> HybridCacheSpec:
        """Cache shapes of `spec` with KV (and conv windows) stored in `dtype` (a torch dtype or its
        byte count; MLA latents in FP8 with per-row scales when `latent_fp8`)."""
        kda, mla, gqa, gdn = spec.kda, spec.mla, spec.gqa, spec.gdn
        # Other families on the same two pools: Qwen3-Next's GQA K|V rows are paged like the latent
        # (width 2 * kv_heads * head_dim), its gated-DeltaNet states sit in the state slots.
        if gdn is not None:
            recurrent = (
                spec.gdn_layers,
                gdn.num_v_heads,
                gdn.k_head_dim,
                gdn.conv_dim,
                gdn.conv_kernel_size - 1,
            )
        elif kda is not None:
            recurrent = (
                spec.kda_layers,
                kda.num_heads,
                kda.head_dim,
                3 * kda.proj_dim,
                kda.conv_kernel_size - 1,
            )
        else:
            recurrent = ((), 0, 0, 0, 0)
        if gqa is not None:
            paged, width = spec.gqa_layers, 2 * gqa.num_kv_heads * gqa.head_dim
        else:
            paged, width = spec.mla_layers, mla.latent_dim if mla is not None else 0
        return HybridCacheSpec(
            mla_layers=paged,
            kda_layers=recurrent[0],
            latent_dim=width,
            index_head_dim=spec.dsa.head_dim if spec.dsa is not None else 0,
            kda_num_heads=recurrent[1],
            kda_head_dim=recurrent[2],
            conv_channels=recurrent[3],
            conv_window=recurrent[4],
            kv_dtype_bytes=dtype_bytes(dtype),
            latent_fp8=latent_fp8,
        )

    @property
    def kv_bytes_per_layer_token(self) -> int:
        """Bytes one token occupies in one paged layer (latent KV plus indexer key)."""
        if self.latent_fp8:
            index = self.index_head_dim + FP8_SCALE_BYTES if self.index_head_dim else 0
            return self.latent_dim + FP8_SCALE_BYTES + index
        return (self.latent_dim + self.index_head_dim) * self.kv_dtype_bytes

    @property
    def kv_bytes_per_token(self) -> int:
        """Bytes one token occupies across all paged layers."""
        return self.kv_bytes_per_layer_token * len(self.mla_layers)

    @property
    def state_bytes_per_layer_slot(self) -> int:
        """Bytes one state slot occupies in one recurrent layer (fp32 state plus conv window)."""
        state = self.kda_num_heads * self.kda_head_dim * self.kda_head_dim * STATE_DTYPE_BYTES
        return state + self.conv_channels * self.conv_window * self.kv_dtype_bytes

    @property
    def state_bytes_per_slot(self) -> int:
        """Bytes one state slot occupies across all recurrent layers."""
        return self.state_bytes_per_layer_slot * len(self.kda_layers)
