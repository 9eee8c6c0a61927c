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

from inference.cache.spec import HybridCacheSpec, dtype_bytes
from inference.kernels.fp8 import FP8_MAX, quantize_rows_fp8

__all__ = ["FP8_MAX", "HybridCacheSpec", "HybridCacheTensors", "quantize_rows_fp8"]


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
        if dtype_bytes(dtype) != spec.kv_dtype_bytes:
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
