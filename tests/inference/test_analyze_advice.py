"""`dayzero analyze`'s advice: a warning for a context past the trained length (with the YaRN
factor that would reach it), and for a plan that does not fit, the smallest change along each
axis, each checked here by planning with that change (it fits) and with one step less (it does
not)."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import pytest

from inference.analyze import analyze
from inference.config import load_config, parse_config

CONFIGS = Path(__file__).resolve().parents[2] / "inference" / "configs"
GiB = 1024**3


def _fits(spec, **kw) -> bool:
    a = analyze(spec, **kw)
    return a.plan is not None and a.plan.fits


def _suggestion(a, prefix: str) -> str:
    found = [s for s in a.suggestions if s.startswith(prefix)]
    assert len(found) == 1, a.suggestions
    return found[0]


def test_a_million_tokens_of_deepseek_v32_on_eight_h200s():
    v32 = load_config(CONFIGS / "deepseek_v32_exp.json")
    ask = {"gpus": 8, "gpu_mem_gib": 141.0, "context": 1_000_000}
    a = analyze(v32, **ask)
    assert a.warnings == [
        "--context 1,000,000 exceeds max_position_embeddings 163,840, the longest context the checkpoint "
        "was trained for (YaRN x40 over 4,096 original positions); covering 1,000,000 tokens takes "
        "rope_scaling.factor >= 245 (1,000,000 / 4,096), a scaling the model was not trained with: expect "
        "quality to drop past 163,840 tokens"
    ]
    assert not a.plan.fits
    # the smallest weight precision change: fp8 fits, and it is the first one smaller than bf16
    assert _suggestion(a, "--weights fp8: fits on 8 GPU(s)")
    assert _fits(v32, **ask, weight_dtype="fp8")
    # the fewest GPUs past 8: 16 fits, and 8 did not
    assert _suggestion(a, "--gpus 16: fits on 16 GPU(s)")
    assert _fits(v32, **{**ask, "gpus": 16})
    # the bf16 weights alone exceed eight GPUs: no context helps, nor do offload tiers
    assert _suggestion(a, "no shorter context fits: the bf16 weights alone exceed 8 GPU(s) of 141 GiB")
    assert not _fits(v32, **{**ask, "context": 1})
    assert _suggestion(a, "offload tiers hold KV blocks and state checkpoints, not weights")


def test_shorter_context_and_offload_tiers_for_conversations_that_cannot_run_at_once():
    kimi = load_config(CONFIGS / "kimi_linear_48b_a3b.json")
    ask = {"gpus": 2, "gpu_mem_gib": 80.0, "context": 1_000_000, "sequences": 8}
    a = analyze(kimi, **ask)
    assert a.warnings == []  # the config names no trained length (and its MLA is NoPE)
    assert not a.plan.fits
    m = re.fullmatch(r"--context ([\d,]+): the longest that fits \(.*\)", _suggestion(a, "--context "))
    longest = int(m.group(1).replace(",", ""))
    assert longest % 1024 == 0
    assert _fits(kimi, **{**ask, "context": longest}) and not _fits(
        kimi, **{**ask, "context": longest + 1024}
    )
    m = re.fullmatch(
        r"--sequences (\d+) run at once; `dayzero infer serve --kv-offload-host-gb (\d+)` .* keeps the other "
        r"(\d+) conversations' caches while they are idle and brings them back when they resume",
        _suggestion(a, "--sequences "),
    )
    running, host_gib, idle = map(int, m.groups())
    assert _fits(kimi, **{**ask, "sequences": running}) and not _fits(
        kimi, **{**ask, "sequences": running + 1}
    )
    assert idle == 8 - running
    assert host_gib == math.ceil(idle * a.memory_per_sequence_bytes / GiB)


def test_a_plan_that_fits_has_no_suggestions_and_a_trained_context_no_warning():
    a = analyze(load_config(CONFIGS / "deepseek_v32_exp.json"), gpus=16, gpu_mem_gib=141.0, context=163_840)
    assert a.plan.fits and a.suggestions == [] and a.warnings == []


def test_context_warnings_by_position_encoding():
    # rotary positions without scaling: the YaRN setting that would reach the context
    cfg = json.loads((CONFIGS / "deepseek_v3_671b.json").read_text())
    del cfg["rope_scaling"]
    cfg["max_position_embeddings"] = 4096
    (w,) = analyze(parse_config(cfg), gpus=64, gpu_mem_gib=141.0, context=10_000).warnings
    assert w.endswith(
        'rope_scaling = {"type": "yarn", "factor": 3, "original_max_position_embeddings": 4096} would cover it, '
        "a scaling the model was not trained with"
    )
    # no rotary positions anywhere (NoPE MLA + KDA): nothing to scale
    kimi = json.loads((CONFIGS / "kimi_linear_48b_a3b.json").read_text())
    kimi["max_position_embeddings"] = 131072
    (w,) = analyze(parse_config(kimi), gpus=8, context=200_000).warnings
    assert "no rotary positions (NoPE), so no rope scaling applies" in w
    # qwen3_next: this runtime serves no rope scaling for it
    (w,) = analyze(load_config(CONFIGS / "qwen3_next_80b_a3b.json"), gpus=8, context=524_288).warnings
    assert (
        "a YaRN factor of 2 over 262,144 positions would cover it, but this runtime serves no rope scaling"
        in w
    )


def test_max_position_embeddings_is_read_and_checked():
    assert load_config(CONFIGS / "kimi_k25.json").max_position_embeddings == 262144  # from text_config
    cfg = json.loads((CONFIGS / "deepseek_v3_671b.json").read_text())
    cfg["max_position_embeddings"] = 0
    with pytest.raises(ValueError, match="max_position_embeddings"):
        parse_config(cfg)


def test_cli_prints_warnings_and_suggestions(capsys):
    from orchestrator.cli import main

    args = ["analyze", str(CONFIGS / "deepseek_v32_exp.json"), "--gpus", "8", "--gpu-mem", "141"]
    assert main([*args, "--context", "1000000"]) == 1
    text = capsys.readouterr().out
    assert "\nwarning: --context 1,000,000 exceeds max_position_embeddings 163,840" in text
    assert "\nto fit, change one of (the smallest change along each):\n  - --weights fp8: fits" in text
    assert main([*args, "--context", "1000000", "--json"]) == 1
    data = json.loads(capsys.readouterr().out)
    assert data["warnings"][0].startswith("--context 1,000,000") and data["suggestions"][0].startswith(
        "--weights fp8"
    )
