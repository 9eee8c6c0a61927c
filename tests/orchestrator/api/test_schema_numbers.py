"""Numbers in task bodies are JSON numbers: true/false is refused, not read as 1/0."""

import pytest
from pydantic import ValidationError

from orchestrator.api.schemas import TaskCreate


@pytest.mark.parametrize(
    "body",
    [
        {"sampling": {"temperature": False}},
        {"sampling": {"max_tokens": True}},
        {"sampling": {"seed": True}},
        {"sampling": {"top_p": True}},
        {"budget": {"max_steps": True}},
        {"budget": {"deadline_s": False}},
    ],
    ids=lambda b: next(iter(next(iter(b.values())))),
)
def test_booleans_are_not_numbers(body):
    with pytest.raises(ValidationError, match="not a boolean"):
        TaskCreate.model_validate({"goal": "g", **body})


def test_numbers_still_pass():
    t = TaskCreate.model_validate({"goal": "g", "sampling": {"temperature": 1, "max_tokens": 5, "seed": 0}})
    assert t.sampling.temperature == 1.0 and t.sampling.max_tokens == 5
