"""Device tensors of the hybrid cache: paged MLA latent KV and per-slot KDA state.

Layout (per layer, keyed by 0-based layer index):

* MLA layer `i`: `kv[i]` `[num_blocks, block_size, kv_lora_rank + qk_rope_head_dim]` in the model
  dtype: the RMS-normalised latent followed by the (rotated, if rope is on) shared key. With the
  FP8 latent option (`HybridCacheSpec.latent_fp8`) `kv[i]` is float8_e4m3fn and `kv_scale[i]`
  `[num_blocks, block_size]` fp32 holds each row's dequantisation scale (row absmax / 448: one
  scale per cached token, set once when the token is written, so appending never rescales a
  block). With DSA on, also `index_k[i]`: the indexer keys, `[num_blocks, block_size,
  index_head_dim]` in the model dtype, or with the FP8 option `[num_blocks, block_size *
  (index_head_dim + 4)]` bytes per block: the block's e4m3 keys then their fp32 scales (one per
  key: its `index_head_dim` values are one quantisation block, as DeepSeek-V3.2's FP8 indexer
  cache keeps them). Scales inside the block travel with it through every block copy, tier
  move and byte count without a tensor of their own; `index_keys(i)` gives the two views.
* KDA layer `i`: `state[i]` `[num_slots, num_heads, head_k_dim, head_v_dim]` fp32 recurrent state
  and `conv[i]` `[num_slots, 3 * num_heads * head_dim, kernel_size - 1]` in the model dtype: the
  last `kernel_size - 1` pre-conv inputs, channels ordered q | k | v, oldest first.

The engine owns which blocks and slots belong to whom; this class only holds and copies tensors.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import Tensor

from inference.config import ModelSpec

__all__ = ["FP8_MAX", "HybridCacheSpec", "HybridCacheTensors", "quantize_rows_fp8"]

FP8_MAX = 448.0  # largest finite float8_e4m3fn


def quantize_rows_fp8(rows: Tensor) -> tuple[Tensor, Tensor]:
    """`[T, D]` -> (`[T, D]` float8_e4m3fn, `[T]` fp32 scales) with `rows ~= q.float() * scale`."""
    amax = rows.detach().abs().amax(dim=-1).float()
    scale = torch.where(amax > 0, amax / FP8_MAX, torch.ones_like(amax))
    q = (rows.float() / scale[:, None]).clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn)
    return q, scale


def _dtype_bytes(dtype: torch.dtype) -> int:
    return torch.empty((), dtype=dtype).element_size()


@dataclass(frozen=True, slots=True)
class HybridCacheSpec:
    """Shapes and byte counts the engine sizes its pools from."""

    mla_layers: tuple[int, ...]
    kda_layers: tuple[int, ...]
    latent_dim: int  # kv_lora_rank + qk_rope_head_dim
    index_head_dim: int  # 0 when DSA is off
    kda_num_heads: int
    kda_head_dim: int
    conv_channels: int  # 3 * num_heads * head_dim (q | k | v)
    conv_window: int  # kernel_size - 1
    kv_dtype_bytes: int
    latent_fp8: bool = False  # MLA latents as float8_e4m3fn with one fp32 scale per row

    @staticmethod
    def from_model_spec(
        spec: ModelSpec, dtype: torch.dtype = torch.bfloat16, *, latent_fp8: bool = False
    ) -> HybridCacheSpec:
        """Cache shapes of `spec` with KV (and conv windows) stored in `dtype` (MLA latents in FP8
        with per-row scales when `latent_fp8`)."""
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
            kv_dtype_bytes=_dtype_bytes(dtype),
            latent_fp8=latent_fp8,
        )

    @property
    def kv_bytes_per_token(self) -> int:
        """Bytes one token occupies across all MLA layers (latent KV plus indexer keys)."""
        latent = self.latent_dim + 4 if self.latent_fp8 else self.latent_dim * self.kv_dtype_bytes
        index = self.index_head_dim * (1 if self.latent_fp8 else self.kv_dtype_bytes)
        if self.latent_fp8 and self.index_head_dim:
            index += 4
        per_layer = latent + index
        return per_layer * len(self.mla_layers)

    @property
    def state_bytes_per_slot(self) -> int:
        """Bytes one state slot occupies across all KDA layers (fp32 state plus conv window)."""
        state = self.kda_num_heads * self.kda_head_dim * self.kda_head_dim * 4
        conv = self.conv_channels * self.conv_window * self.kv_dtype_bytes
        return (state + conv) * len(self.kda_layers)


@dataclass
class HybridCacheTensors:
    """The cache tensors one model instance reads and writes (see module docstring for layout)."""

    spec: HybridCacheSpec
    block_size: int
    kv: dict[int, Tensor] = field(default_factory=dict)
    kv_scale: dict[int, Tensor] = field(default_factory=dict)
    index_k: dict[int, Tensor] = field(default_factory=dict)
    state: dict[int, Tensor] = field(default_factory=dict)
    conv: dict[int, Tensor] = field(default_factory=dict)

    @staticmethod
    def allocate(
        spec: HybridCacheSpec,
        num_blocks: int,
        block_size: int,
        num_slots: int,
        device: torch.device | str,
        dtype: torch.dtype,
    ) -> HybridCacheTensors:
        """Allocate zeroed pools: `num_blocks` KV blocks of `block_size` tokens, `num_slots` slots."""
        if num_blocks <= 0 or block_size <= 0 or num_slots <= 0:
            raise ValueError(f"need positive sizes, got {num_blocks=} {block_size=} {num_slots=}")
        if _dtype_bytes(dtype) != spec.kv_dtype_bytes:
            raise ValueError(f"spec was built for {spec.kv_dtype_bytes}-byte KV, got {dtype}")
        out = HybridCacheTensors(spec=spec, block_size=block_size)
        for i in spec.mla_layers:
            shape = (num_blocks, block_size, spec.latent_dim)
            if spec.latent_fp8:
                out.kv[i] = torch.zeros(shape, device=device, dtype=torch.float8_e4m3fn)
                out.kv_scale[i] = torch.ones(num_blocks, block_size, device=device, dtype=torch.float32)
            else:
                out.kv[i] = torch.zeros(shape, device=device, dtype=dtype)
            if spec.index_head_dim and spec.latent_fp8:
                out.index_k[i] = torch.zeros(
                    num_blocks, block_size * (spec.index_head_dim + 4), device=device, dtype=torch.uint8
                )
            elif spec.index_head_dim:
                out.index_k[i] = torch.zeros(
                    num_blocks, block_size, spec.index_head_dim, device=device, dtype=dtype
                )
        h, d = spec.kda_num_heads, spec.kda_head_dim
        for i in spec.kda_layers:
            out.state[i] = torch.zeros(num_slots, h, d, d, device=device, dtype=torch.float32)
            out.conv[i] = torch.zeros(
                num_slots, spec.conv_channels, spec.conv_window, device=device, dtype=dtype
            )
        return out

    @property
    def num_slots(self) -> int:
        """State slots allocated (0 for a model without KDA layers)."""
        return next(iter(self.state.values())).shape[0] if self.state else 0

    def write_latents(self, layer: int, slots: Tensor, rows: Tensor) -> None:
        """Store `rows` `[T, latent_dim]` at flat `slots` `[T]` of layer `layer` (quantised if FP8)."""
        pool = self.kv[layer]
        flat = pool.view(-1, pool.shape[-1])
        if layer in self.kv_scale:
            q, scale = quantize_rows_fp8(rows)
            # as bytes: index_copy_ has no float8 kernel on the CPU
            flat.view(torch.uint8).index_copy_(0, slots, q.view(torch.uint8))
            self.kv_scale[layer].view(-1).index_copy_(0, slots, scale)
        else:
            flat.index_copy_(0, slots, rows.to(pool.dtype))

    def read_latents(self, layer: int, rows: Tensor, dtype: torch.dtype) -> Tensor:
        """Flat pool `rows` (any shape of int indices) of layer `layer` as `[..., latent_dim]` `dtype`."""
        pool = self.kv[layer]
        out = pool.view(-1, pool.shape[-1])[rows]
        if layer in self.kv_scale:
            return (out.float() * self.kv_scale[layer].view(-1)[rows][..., None]).to(dtype)
        return out.to(dtype)

    def index_keys(self, layer: int) -> tuple[Tensor, Tensor | None]:
        """Layer `layer`'s indexer keys as `[num_blocks, block_size, D]` and, for FP8 keys, their
        scales `[num_blocks, block_size]` fp32 (strided views into the one per-block tensor)."""
        pool = self.index_k[layer]
        if pool.dtype != torch.uint8:
            return pool, None
        bs, d = self.block_size, self.spec.index_head_dim
        keys = pool[:, : bs * d].view(torch.float8_e4m3fn).view(pool.shape[0], bs, d)
        return keys, pool[:, bs * d :].view(torch.float32)

    def write_index_keys(self, layer: int, slots: Tensor, rows: Tensor) -> None:
        """Store indexer keys `rows` `[T, D]` at flat `slots` `[T]` of layer `layer` (quantised if FP8)."""
        keys, scales = self.index_keys(layer)
        if scales is None:
            keys.view(-1, keys.shape[-1]).index_copy_(0, slots, rows.to(keys.dtype))
            return
        q, scale = quantize_rows_fp8(rows)
        blk, pos = slots // self.block_size, slots % self.block_size
        # as bytes: index_put_ has no float8 kernel on the CPU
        keys.view(torch.uint8)[blk, pos] = q.view(torch.uint8)
        scales[blk, pos] = scale

    def zero_slot(self, slot: int) -> None:
        """Reset every KDA layer's state and conv window of `slot` (a new sequence starts empty)."""
        for i in self.spec.kda_layers:
            self.state[i][slot].zero_()
            self.conv[i][slot].zero_()

    def copy_block(self, src: int, dst: int) -> None:
        """Copy KV block `src` to `dst` in every MLA layer (latent KV and indexer keys)."""
        for pool in (*self.kv.values(), *self.kv_scale.values(), *self.index_k.values()):
            pool[dst].copy_(pool[src])

    def copy_slot(self, src: int, dst: int) -> None:
        """Copy every KDA layer's state and conv window from slot `src` to slot `dst`."""
        for i in self.spec.kda_layers:
            self.state[i][dst].copy_(self.state[i][src])
            self.conv[i][dst].copy_(self.conv[i][src])
