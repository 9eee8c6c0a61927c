"""MoonViT vision tower and projector, in the published Kimi-K2.5 checkpoint layout.

Inputs follow `Kimi_K25ImageProcessor`: `pixel_values` `[num_patches, 3, patch, patch]` (patches of
all images, each image raster-ordered, frames after each other) and `grid_thw` `[num_images, 3]`
(frames, patch rows, patch columns). Each image becomes `(h / 2) * (w / 2)` text-space embeddings
(2x2 patch merge, frames mean-pooled), which replace its placeholder tokens in the text.

Published names: `vision_tower.patch_embed.{proj, pos_emb.weight}`,
`vision_tower.encoder.blocks.N.{norm0, norm1, wqkv, wo, mlp.fc0, mlp.fc1}`,
`vision_tower.encoder.final_layernorm`, `mm_projector.{pre_norm, proj.0, proj.2}`. The fused
`wqkv` rotates q and k with interleaved complex-style 2D rope (pairs `(2i, 2i+1)`).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from inference.config import VisionSpec

__all__ = ["MoonViT", "MultimodalProjector", "tokens_per_image", "vision_rope_angles"]


def vision_rope_angles(grid_thw: Tensor, head_dim: int, theta: float) -> Tensor:
    """Per-patch rotation angles `[num_patches, head_dim // 2]` fp32 for interleaved pairs.

    Pair `i` turns by `(col if i is even else row) * theta ** (-(i // 2) * 4 / head_dim)`.
    """
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim // 2, 2, dtype=torch.float32) / (head_dim // 2)))
    parts = []
    for t, h, w in grid_thw.tolist():
        rows = torch.arange(h).repeat_interleave(w).float()
        cols = torch.arange(w).repeat(h).float()
        ang = torch.stack([cols[:, None] * inv_freq, rows[:, None] * inv_freq], dim=-1).flatten(1)
        parts.append(ang.repeat(int(t), 1))
    return torch.cat(parts).to(grid_thw.device)


def _rope_pairs(x: Tensor, angles: Tensor) -> Tensor:
    """x: `[N, H, D]`, angles `[N, D // 2]`: rotate pairs `(2i, 2i+1)` in place of each other."""
    cos, sin = angles.cos()[:, None, :], angles.sin()[:, None, :]
    x1, x2 = x[..., 0::2].float(), x[..., 1::2].float()
    return torch.stack([x1 * cos - x2 * sin, x1 * sin + x2 * cos], dim=-1).flatten(-2).to(x.dtype)


class PatchEmbed(nn.Module):
    """14x14 patch projection plus the resized learned position grid."""

    def __init__(self, spec: VisionSpec) -> None:
        super().__init__()
        self.spec = spec
        self.proj = nn.Conv2d(3, spec.hidden_size, kernel_size=spec.patch_size, stride=spec.patch_size)
        self.pos_emb = _PosEmb(spec)

    def forward(self, pixel_values: Tensor, grid_thw: Tensor) -> Tensor:
        """`[P, 3, p, p]` -> `[P, D]`."""
        x = self.proj(pixel_values.to(self.proj.weight.dtype)).view(pixel_values.shape[0], -1)
        return x + self.pos_emb(grid_thw).to(x.dtype)


class _PosEmb(nn.Module):
    """Learned `[H, W, D]` grid, bicubically resized per image, plus a sinusoid per video frame."""

    def __init__(self, spec: VisionSpec) -> None:
        super().__init__()
        self.spec = spec
        self.weight = nn.Parameter(torch.zeros(spec.pos_emb_height, spec.pos_emb_width, spec.hidden_size))

    def _time_table(self, frames: int, device: torch.device) -> Tensor:
        d = self.spec.hidden_size
        inv_freq = 1.0 / (10000 ** (torch.arange(0, d, 2, dtype=torch.float32, device=device) / d))
        f = torch.arange(frames, dtype=torch.float32, device=device)[:, None] * inv_freq
        return torch.cat([f.sin(), f.cos()], dim=1)  # [frames, D]

    def forward(self, grid_thw: Tensor) -> Tensor:
        """`[I, 3]` grids -> `[P, D]` fp32 position embeddings, patches in processor order."""
        out = []
        table = self.weight
        for t, h, w in grid_thw.tolist():
            if (h, w) == tuple(table.shape[:2]):
                grid = table.reshape(h * w, -1)
            else:
                grid = F.interpolate(
                    table.permute(2, 0, 1)[None].float(), size=(h, w), mode="bicubic", align_corners=False
                )[0].permute(1, 2, 0).reshape(h * w, -1)  # fmt: skip
            grid = grid.float()
            if t > 1:
                grid = (grid[None] + self._time_table(t, table.device)[:, None, :]).reshape(t * h * w, -1)
            out.append(grid)
        return torch.cat(out)


class _MLP(nn.Module):
    def __init__(self, dim: int, hidden: int) -> None:
        super().__init__()
        self.fc0 = nn.Linear(dim, hidden)
        self.fc1 = nn.Linear(hidden, dim)

    def forward(self, x: Tensor) -> Tensor:
        """x: `[P, D]` -> `[P, D]`."""
        return self.fc1(F.gelu(self.fc0(x), approximate="tanh"))


class _Block(nn.Module):
    def __init__(self, spec: VisionSpec) -> None:
        super().__init__()
        d = spec.hidden_size
        self.num_heads, self.head_dim = spec.num_heads, spec.head_dim
        self.norm0 = nn.LayerNorm(d, eps=1e-5)
        self.norm1 = nn.LayerNorm(d, eps=1e-5)
        self.wqkv = nn.Linear(d, 3 * d)
        self.wo = nn.Linear(d, d)
        self.mlp = _MLP(d, spec.intermediate_size)

    def forward(self, x: Tensor, angles: Tensor, lengths: list[int]) -> Tensor:
        """x: `[P, D]`, angles `[P, head_dim // 2]`; attention stays inside each image (`lengths`)."""
        n = x.shape[0]
        q, k, v = self.wqkv(self.norm0(x)).view(n, 3, self.num_heads, self.head_dim).unbind(1)
        q, k = _rope_pairs(q, angles), _rope_pairs(k, angles)
        outs = []
        for qi, ki, vi in zip(q.split(lengths), k.split(lengths), v.split(lengths), strict=True):
            o = F.scaled_dot_product_attention(qi.transpose(0, 1), ki.transpose(0, 1), vi.transpose(0, 1))
            outs.append(o.transpose(0, 1).reshape(qi.shape[0], -1))
        x = x + self.wo(torch.cat(outs))
        return x + self.mlp(self.norm1(x))


class _Encoder(nn.Module):
    def __init__(self, spec: VisionSpec) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(_Block(spec) for _ in range(spec.num_layers))
        self.final_layernorm = nn.LayerNorm(spec.hidden_size, eps=1e-5)


class MoonViT(nn.Module):
    """Patch embedding, bidirectional per-image transformer, final norm and 2x2 merge."""

    def __init__(self, spec: VisionSpec) -> None:
        super().__init__()
        self.spec = spec
        self.patch_embed = PatchEmbed(spec)
        self.encoder = _Encoder(spec)

    def forward(self, pixel_values: Tensor, grid_thw: Tensor) -> Tensor:
        """`[P, 3, p, p]`, `[I, 3]` -> merged patch groups `[M, kh * kw, D]` (frames mean-pooled)."""
        s = self.spec
        if pixel_values.dim() != 4 or pixel_values.shape[1:] != (3, s.patch_size, s.patch_size):
            raise ValueError(
                f"pixel_values must be [P, 3, {s.patch_size}, {s.patch_size}], got {tuple(pixel_values.shape)}"
            )
        counts = [int(t * h * w) for t, h, w in grid_thw.tolist()]
        if sum(counts) != pixel_values.shape[0]:
            raise ValueError(
                f"grid_thw describes {sum(counts)} patches, pixel_values has {pixel_values.shape[0]}"
            )
        kh, kw = s.merge_kernel
        if any(h % kh or w % kw for _, h, w in grid_thw.tolist()):
            raise ValueError(f"every grid must be divisible by the merge kernel {s.merge_kernel}")
        x = self.patch_embed(pixel_values, grid_thw)
        angles = vision_rope_angles(grid_thw.cpu(), s.head_dim, s.rope_theta).to(x.device)
        for block in self.encoder.blocks:
            x = block(x, angles, counts)
        x = self.encoder.final_layernorm(x)
        merged = []
        for part, (t, h, w) in zip(x.split(counts), grid_thw.tolist(), strict=True):
            g = part.view(t, h // kh, kh, w // kw, kw, -1).permute(1, 3, 0, 2, 4, 5)
            merged.append(g.reshape((h // kh) * (w // kw), t, kh * kw, -1).mean(dim=1))
        return torch.cat(merged)


class MultimodalProjector(nn.Module):
    """LayerNorm per patch, then `Linear -> GELU -> Linear` on each merged 2x2 group."""

    def __init__(self, spec: VisionSpec, text_hidden: int) -> None:
        super().__init__()
        self.pre_norm = nn.LayerNorm(spec.hidden_size, eps=spec.projector_ln_eps)
        self.proj = nn.Sequential(
            nn.Linear(spec.merged_dim, spec.merged_dim), nn.GELU(), nn.Linear(spec.merged_dim, text_hidden)
        )

    def forward(self, merged: Tensor) -> Tensor:
        """`[M, kh * kw, D]` -> `[M, text_hidden]`."""
        return self.proj(self.pre_norm(merged).reshape(merged.shape[0], -1))


def tokens_per_image(grid_thw: Tensor, merge_kernel: tuple[int, int]) -> list[int]:
    """Placeholder tokens each image takes in the text sequence."""
    kh, kw = merge_kernel
    return [int(h // kh * (w // kw)) for _, h, w in grid_thw.tolist()]
