"""Numbers in task bodies are JSON numbers: true/false is refused, not read as 1/0."""

import pytest
from pydantic import ValidationError

from orchestrator.tasks.schemas import TaskCreate


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


@pytest.mark.parametrize(
    "body",
    [{"budget": {"max_steps": "5"}}, {"budget": {"deadline_s": "10"}}, {"sampling": {"temperature": "0.5"}}],
    ids=["max_steps", "deadline_s", "temperature"],
)
def test_strings_are_not_numbers(body):
    # Before: Pydantic's lax mode turned "5" into 5 and the task was created (201).
    with pytest.raises(ValidationError):
        TaskCreate.model_validate({"goal": "g", **body})


def test_json_numbers_still_pass_with_strings_refused():
    t = TaskCreate.model_validate_json(
        '{"goal": "g", "budget": {"max_steps": 5, "deadline_s": 10}, "sampling": {"temperature": 1}}'
    )
    assert t.budget.max_steps == 5 and t.budget.deadline_s == 10.0 and t.sampling.temperature == 1.0
