"""The synthetic agent corpus the demo model is trained on, and its held-out eval tasks.

Every task is one conversation built as the product builds it (`base.Conv`): the tools list the
runner sends, the user turn with its attachments through the product's own code, real tool runs.
Tasks come from paraphrase families (`Family`), grouped by category:

- `calc`: expressions, in English, French, German and Spanish, with their number formats and
  operator signs, long digit strings, and calls the calculator rejects and the model corrects;
- `number_words`: operands in English words; `calc_word`: word problems; `calc_multi`: two-step
  instructions;
- `image`: questions about an image attached as `dayzero run --image` attaches it;
- `document`: questions about an attached PDF (or text file), answered from its text;
- `plain`: greetings, identity, thanks, refusals of what no tool can do.

Each category has held-out families (other wordings of the same skills) that training never
samples: `eval_tasks` draws only from them. Sample `i` of training is drawn from its own
`random.Random(TRAIN_SEED + i)`, so the corpus is the same on any machine and in any process order.
"""

from __future__ import annotations

import random

from inference.demo_model.spec import EVAL_SEED, TRAIN_SEED
from training.demo_model.corpus import arithmetic, attachments, chat
from training.demo_model.corpus.base import Conv, Family, File, Task, ToolBox, Turn, tool_result_text

__all__ = [
    "CATEGORIES", "CATEGORY_WEIGHTS", "FAMILIES", "TRAIN_SEED", "Family", "File", "Task", "ToolBox",
    "Turn", "eval_tasks", "make_task", "tool_result_text",
]  # fmt: skip

FAMILIES: tuple[Family, ...] = arithmetic.FAMILIES + attachments.FAMILIES + chat.FAMILIES
CATEGORIES: tuple[str, ...] = (
    "calc",
    "number_words",
    "calc_word",
    "calc_multi",
    "image",
    "document",
    "plain",
)
# the training mix by category, the harder skills sampled most
CATEGORY_WEIGHTS: dict[str, float] = {
    "calc": 0.16,
    "number_words": 0.15,
    "calc_word": 0.17,
    "calc_multi": 0.08,
    "image": 0.16,
    "document": 0.17,
    "plain": 0.11,
}


def _build(box: ToolBox, seed: int, family: Family) -> Task:
    rng = random.Random(seed)
    c = Conv(box, rng)
    turn = family.make(c, rng)
    return Task(family.category, family.name, [turn], c.messages, c.image_tokens)


def make_task(box: ToolBox, seed: int) -> Task:
    """Training sample `seed`: a category by `CATEGORY_WEIGHTS`, then one of its training families."""
    rng = random.Random(seed)
    cat = rng.choices(list(CATEGORY_WEIGHTS), list(CATEGORY_WEIGHTS.values()))[0]
    fams = [f for f in FAMILIES if f.category == cat and not f.held_out]
    fam = rng.choices(fams, [f.weight for f in fams])[0]
    return _build(box, rng.getrandbits(63), fam)


def eval_tasks(box: ToolBox, per_category: int, categories: tuple[str, ...] = CATEGORIES) -> list[Task]:
    """`per_category` tasks of each category, from its held-out families only (eval seeds)."""
    out = []
    for ci, cat in enumerate(CATEGORIES):
        if cat not in categories:
            continue
        fams = [f for f in FAMILIES if f.category == cat and f.held_out]
        out += [_build(box, EVAL_SEED + 1000 * ci + i, fams[i % len(fams)]) for i in range(per_category)]
    return out
