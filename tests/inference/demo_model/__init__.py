"""Shared marks for the demo-model tests."""

from __future__ import annotations

import pytest

from inference.demo_model.spec import DEMO_DIR
from training.demo_model.train import TOKENIZER


def _trained_on_this_corpus() -> bool:
    """Whether the committed checkpoint was trained with the corpus's tokenizer (so the behaviour
    tests describe it): the trainer copies that tokenizer next to the weights."""
    ckpt = DEMO_DIR / "tokenizer.json"
    return (DEMO_DIR / "checksums.sha256.json").is_file() and ckpt.read_bytes() == TOKENIZER.read_bytes()


# behaviour of a checkpoint trained on `training.demo_model.corpus`
needs_corpus_checkpoint = pytest.mark.skipif(
    not _trained_on_this_corpus(),
    reason="the committed checkpoint was not trained on this corpus (retrain: training/demo_model/train.py)",
)
