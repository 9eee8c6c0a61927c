"""The committed demo checkpoint: loads through the normal loader (manifest checked), is the
architecture the issue asks for, fits the size budget, and answers held-out tasks correctly."""

from __future__ import annotations

import shutil

import pytest
import torch

from inference.config import KDA, MOE, load_config, parse_config
from inference.demo_model.spec import DEMO_DIR, dsa_variant
from inference.embedded import EMBEDDED_MODELS, RANDOM_MODEL_NAME, EmbeddedEngineClient
from inference.loader import ChecksumError, verify_manifest
from inference.model.factory import build_model
from tests.inference.demo_model import needs_corpus_checkpoint
from training.demo_model.corpus import CATEGORIES
from training.demo_model.evaluate import answer_ok, evaluate

pytestmark = pytest.mark.skipif(
    not (DEMO_DIR / "checksums.sha256.json").is_file(), reason="demo checkpoint not trained yet"
)


def test_checkpoint_is_the_hybrid_architecture_and_small():
    spec = load_config(DEMO_DIR)
    assert KDA in spec.layer_kinds and any(k != KDA for k in spec.layer_kinds)  # KDA + MLA
    assert MOE in spec.mlp_kinds and spec.vision is not None
    model = build_model(spec, load_format="safetensors", path=DEMO_DIR)
    n = sum(p.numel() for p in model.parameters())
    assert 5_000_000 <= n <= 15_000_000, n
    committed = sum(f.stat().st_size for f in DEMO_DIR.iterdir() if f.is_file())
    assert committed <= 40 * 2**20, committed
    assert verify_manifest(DEMO_DIR)


def test_a_corrupted_checkpoint_is_refused(tmp_path):
    copy = tmp_path / "demo"
    shutil.copytree(DEMO_DIR, copy)
    shard = next(copy.glob("*.safetensors"))
    data = bytearray(shard.read_bytes())
    data[-1] ^= 1
    shard.write_bytes(bytes(data))
    with pytest.raises(ChecksumError, match=shard.name):
        build_model(load_config(copy), load_format="safetensors", path=copy)


def test_dsa_variant_with_full_topk_gives_the_mla_models_logits():
    import json

    cfg = json.loads((DEMO_DIR / "config.json").read_text())
    mla = build_model(load_config(DEMO_DIR), load_format="safetensors", path=DEMO_DIR)
    dsa = build_model(parse_config(dsa_variant(cfg)), load_format="dummy", seed=0)
    missing = dsa.load_state_dict(mla.state_dict(), strict=False).missing_keys
    assert missing and all(".indexer." in k for k in missing)  # only the indexer is new
    from tests.inference.demo_model.test_train_forward import _engine_logits

    ids = torch.randint(0, 4000, (2, 48), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        assert torch.allclose(_engine_logits(dsa, ids), _engine_logits(mla, ids), rtol=1e-4, atol=1e-4)


def test_random_model_stays_available_by_name():
    assert EMBEDDED_MODELS[RANDOM_MODEL_NAME] == "random"
    with pytest.raises(ValueError, match="unknown embedded model"):
        EmbeddedEngineClient.default("no-such-model")


@pytest.fixture(scope="module")
def outcomes():
    """Two held-out tasks of every category through `dayzero run`'s path."""
    return evaluate(DEMO_DIR, 2)[1]


@needs_corpus_checkpoint
def test_held_out_tasks_call_tools_validly_and_never_answer_with_special_tokens(outcomes):
    assert [o.category for o in outcomes] == [c for c in CATEGORIES for _ in range(2)]
    for o in outcomes:
        assert o.valid_calls == o.calls, (o.category, o.problems)
        assert not o.special_tokens and o.status == "SUCCEEDED", (o.category, o.answer)


@needs_corpus_checkpoint
def test_held_out_tasks_are_answered_correctly(outcomes):
    right = sum(o.success for o in outcomes)
    assert right >= len(outcomes) - 1, [(o.category, o.answer, o.problems) for o in outcomes if not o.success]


def test_answer_check_matches_whole_numbers_only():
    from training.demo_model.corpus import Turn

    t = Turn("q", "x = 7006743.", ("7006743",))
    assert answer_ok("1234*5678 + 91 = 7006743.", t)
    assert not answer_ok("= 17006743.", t) and not answer_ok("= 7006743.5", t) and not answer_ok(None, t)
    assert answer_ok("Hello!", Turn("hi", "Hello!")) and not answer_ok("Hello", Turn("hi", "Hello!"))


def test_judge_fails_special_tokens_wrong_tools_and_failed_tasks():
    from training.demo_model.corpus import Task, Turn
    from training.demo_model.evaluate import judge
    from workers.tool_jobs import build_registry

    reg = build_registry()
    task = Task("calc", "calc_held", [Turn("q", "The answer is 4.", ("4",), tool="calculator")])
    call = {"role": "assistant", "tool_calls": [{"id": "c", "function": {"name": "calculator",
            "arguments": '{"expression": "2 + 2"}'}}]}  # fmt: skip
    assert judge(task, "SUCCEEDED", "The answer is 4.", [call], reg).success
    assert not judge(task, "FAILED", "The answer is 4.", [call], reg).success
    assert not judge(task, "SUCCEEDED", "The answer is 4.", [], reg).success  # no calculator call
    bad = judge(task, "SUCCEEDED", "The answer is 4.<|im_end|>", [call], reg)
    assert not bad.success and bad.special_tokens
    wrong = {"role": "assistant", "tool_calls": [{"id": "c", "function": {"name": "calculator",
             "arguments": '{"expr": "2 + 2"}'}}]}  # fmt: skip
    out = judge(task, "SUCCEEDED", "The answer is 4.", [wrong], reg)
    assert out.calls == 1 and out.valid_calls == 0


def test_parallel_eval_keeps_task_order():
    summary, outcomes = evaluate(DEMO_DIR, 1, workers=2)
    assert [o.category for o in outcomes] == list(CATEGORIES)
    assert summary["overall"]["tasks"] == len(CATEGORIES)
