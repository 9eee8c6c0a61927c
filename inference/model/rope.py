"""Rotary angles of the MLA layer: plain rope, or YaRN as DeepSeek-V3/V3.2 and Kimi-K2 ship it.

YaRN (arXiv 2309.00071) stretches a model trained at `original_max_position_embeddings` to
`factor` times that length. Per rotary channel pair `i` (frequency `theta^(-2i/dim)`):

* fast channels (more than `beta_fast` turns over the original length) keep their frequency
  (extrapolation), slow ones (fewer than `beta_slow` turns) are divided by `factor`
  (interpolation), and a linear ramp blends the channels between the two boundaries;
* cos/sin are multiplied by `attention_factor` (transformers' `attention_scaling`): given, else
  `mscale(factor, mscale) / mscale(factor, mscale_all_dim)` when both are set, else
  `mscale(factor)`, with `mscale(s, m) = 0.1 * m * ln(s) + 1`;
* the softmax scale `1/sqrt(qk_head_dim)` is multiplied by `mscale(factor, mscale_all_dim)^2`
  when `mscale_all_dim` is set (DeepSeek's `softmax_scale * mscale * mscale`).

With the published values (`mscale == mscale_all_dim == 1`) the cos/sin factor is 1 and all of
YaRN's temperature sits in the softmax scale. The formulas follow transformers 5.17's
`_compute_yarn_parameters` and `yarn_apply_mscale` (deepseek_v3 / deepseek_v32) to the letter,
including its defaults (`beta_fast` 32, `beta_slow` 1, `truncate` true), so both compute the same
fp32 angles.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor

from inference.config import MLASpec

__all__ = ["RotaryAngles", "yarn_mscale"]


def yarn_mscale(scale: float, mscale: float = 1.0) -> float:
    """YaRN's attention temperature `0.1 * mscale * ln(scale) + 1` (1 when not stretched)."""
    return 1.0 if scale <= 1 else 0.1 * mscale * math.log(scale) + 1.0


def _correction_dim(turns: float, dim: int, base: float, original: int) -> float:
    """The (fractional) channel index whose wavelength fits `turns` times in `original` tokens."""
    return dim * math.log(original / (turns * 2 * math.pi)) / (2 * math.log(base))


def _attention_factor(factor: float, p: dict[str, object]) -> float:
    """transformers' `attention_scaling`: the given `attention_factor`, else YaRN's temperature ratio."""
    given = p.get("attention_factor")
    if given is not None:
        return float(given)
    mscale, mscale_all = p.get("mscale"), p.get("mscale_all_dim")
    if mscale and mscale_all:
        return yarn_mscale(factor, float(mscale)) / yarn_mscale(factor, float(mscale_all))
    return yarn_mscale(factor)


@dataclass(frozen=True, slots=True)
class RotaryAngles:
    """The MLA layer's rope, built once per layer from its spec (plain rope: `factor` 1).

    Channel pair `i` turns at `theta^(-2i/dim)`, divided by `factor` where the ramp over
    `[low, high]` says interpolate. The angles are recomputed on the device at every call (a
    handful of element-wise ops on `dim // 2` values): no host copy, so a CUDA graph captures it,
    and no buffer the checkpoint would have to hold. `cos_sin_factor` multiplies cos and sin;
    `softmax_factor` multiplies the softmax scale.
    """

    dim: int
    base: float
    factor: float = 1.0
    low: float = 0.0
    high: float = 1.0
    cos_sin_factor: float = 1.0
    softmax_factor: float = 1.0

    @classmethod
    def for_mla(cls, m: MLASpec) -> RotaryAngles:
        dim, base = m.qk_rope_head_dim, m.rope_theta
        if m.rope_scaling is None:
            return cls(dim, base)
        p = dict(m.rope_scaling)  # the reader checked: YaRN with a numeric factor and original length
        factor, original = float(p["factor"]), int(p["original_max_position_embeddings"])
        beta_fast = float(p.get("beta_fast") or 32)  # `or`: a 0 in the config means the default, as in HF
        beta_slow = float(p.get("beta_slow") or 1)
        low = _correction_dim(beta_fast, dim, base, original)
        high = _correction_dim(beta_slow, dim, base, original)
        if p.get("truncate", True):
            low, high = math.floor(low), math.ceil(high)
        low, high = max(low, 0), min(high, dim - 1)
        if low == high:
            high += 0.001  # a one-channel ramp would divide by zero
        mscale_all = p.get("mscale_all_dim")
        softmax = yarn_mscale(factor, float(mscale_all)) ** 2 if mscale_all else 1.0
        return cls(dim, base, factor, low, high, _attention_factor(factor, p), softmax)

    def inv_freq(self, device: torch.device | str = "cpu") -> Tensor:
        """`[dim // 2]` fp32 inverse frequencies (YaRN's blend of extrapolated and interpolated)."""
        pos_freqs = self.base ** (torch.arange(0, self.dim, 2, device=device, dtype=torch.float32) / self.dim)
        if self.factor == 1.0:
            return 1.0 / pos_freqs
        ramp = (torch.arange(self.dim // 2, device=device, dtype=torch.float32) - self.low) / (
            self.high - self.low
        )
        extrapolate = 1 - ramp.clamp(0, 1)  # 1 on fast channels: keep the trained frequency
        return (1.0 / (self.factor * pos_freqs)) * (1 - extrapolate) + (1.0 / pos_freqs) * extrapolate

    def cos_sin(self, positions: Tensor) -> tuple[Tensor, Tensor]:
        """`(cos, sin)` each `[T, dim // 2]` fp32 for integer `positions` `[T]`."""
        freqs = positions.float()[:, None] * self.inv_freq(positions.device)[None, :]
        if self.cos_sin_factor == 1.0:
            return freqs.cos(), freqs.sin()
        return freqs.cos() * self.cos_sin_factor, freqs.sin() * self.cos_sin_factor
