"""The bundled tiny `deepseek_v32` config and the published <-> transformers-5 name map.

The published DeepSeek-V3/V3.2 safetensors keep one tensor per routed expert
(`mlp.experts.N.gate_proj/up_proj/down_proj.weight`); transformers 5 fuses them at load time
(`conversion_mapping.py`, pattern `qwen2_moe`) into `mlp.experts.gate_up_proj [E, 2I, H]` and
`mlp.experts.down_proj [E, H, I]`. Every other name is shared.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

TINY = Path(__file__).resolve().parents[1] / "inference" / "configs" / "tiny_deepseek_v32.json"


def tiny_deepseek_v32_config(**overrides: Any) -> dict[str, Any]:
    return {**json.loads(TINY.read_text()), **overrides}


def hf_config(cfg: dict[str, Any]):
    """transformers' `DeepseekV32Config` of a published config (eager attention, for the CPU)."""
    import transformers

    hc = transformers.DeepseekV32Config(
        **{k: v for k, v in cfg.items() if k not in ("architectures", "torch_dtype")}
    )
    hc._attn_implementation = "eager"
    return hc


def published_to_hf(state: dict[str, Tensor]) -> dict[str, Tensor]:
    """Published `deepseek_v32` names -> transformers 5 `DeepseekV32ForCausalLM` names."""
    out: dict[str, Tensor] = {}
    experts: dict[str, dict[int, dict[str, Tensor]]] = {}
    for name, t in state.items():
        m = re.match(r"(.*\.mlp\.experts)\.(\d+)\.(gate_proj|up_proj|down_proj)\.weight$", name)
        if m:
            experts.setdefault(m.group(1), {}).setdefault(int(m.group(2)), {})[m.group(3)] = t
        else:
            out[name] = t
    for prefix, per in experts.items():
        ids = sorted(per)
        out[f"{prefix}.gate_up_proj"] = torch.stack(
            [torch.cat([per[e]["gate_proj"], per[e]["up_proj"]]) for e in ids]
        )
        out[f"{prefix}.down_proj"] = torch.stack([per[e]["down_proj"] for e in ids])
    return out
