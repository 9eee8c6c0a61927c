"""The demo corpus: held-out families stay out of training, user turns are the product's, the loss
mask covers what the model must say, and the tokenizer copies digits and attachment ids exactly."""

from __future__ import annotations

import json
import random

import pytest

from training.demo_model.corpus import CATEGORIES, FAMILIES, TRAIN_SEED, ToolBox, eval_tasks, make_task
from training.demo_model.corpus.base import Conv
from training.demo_model.render import example


@pytest.fixture(scope="module")
def box() -> ToolBox:
    return ToolBox()


def test_every_category_has_training_and_held_out_families():
    for cat in CATEGORIES:
        fams = [f for f in FAMILIES if f.category == cat]
        assert any(f.held_out for f in fams) and any(not f.held_out for f in fams), cat


def test_training_never_samples_a_held_out_family(box):
    held = {f.name for f in FAMILIES if f.held_out}
    seen = {make_task(box, TRAIN_SEED + i).family for i in range(600)}
    assert not seen & held
    assert {f.category for f in FAMILIES if f.name in seen} == set(CATEGORIES)


def test_held_out_questions_are_not_training_questions(box):
    train_q = {make_task(box, TRAIN_SEED + i).turns[0].user for i in range(3000)}
    evals = eval_tasks(box, 5)
    assert {t.category for t in evals} == set(CATEGORIES)
    assert all(t.family.endswith("_held") for t in evals)
    assert not {t.turns[0].user for t in evals} & train_q


def _image_task(box, seed=0):
    fam = next(f for f in FAMILIES if f.name == "image")
    rng = random.Random(seed)
    while True:
        c = Conv(box, rng)
        turn = fam.make(c, rng)
        if turn.tool == "image_info":
            return c, turn


def test_image_turn_is_what_the_runner_sends_and_its_label_names_the_called_id(box):
    from preprocess.pipeline import process_image

    c, turn = _image_task(box)
    content = c.messages[0]["content"]
    assert [p["type"] for p in content] == ["text", "image_url", "text"]
    att_id = c.attachments[0]["id"]
    assert att_id in content[2]["text"] and turn.files[0].name in content[2]["text"]
    call = next(m for m in c.messages if m.get("tool_calls"))["tool_calls"][0]["function"]
    assert json.loads(call["arguments"]) == {"attachment_id": att_id}
    # as many placeholders as the preprocess pipeline gives this file
    grid = process_image(turn.files[0].data).grid_list()
    assert list(c.image_tokens.values()) == [sum(h // 2 * (w // 2) for _, h, w in grid)]


def test_document_turn_holds_the_parsed_pdf_text(box):
    fam = next(f for f in FAMILIES if f.name == "document_held")
    rng = random.Random(3)
    c = Conv(box, rng)
    turn = fam.make(c, rng)
    text = "".join(p["text"] for p in c.messages[0]["content"])
    assert text.startswith(turn.user) and "[document " in text and turn.needles[0] in text
    assert turn.expected in text  # the answer is a sentence of the document


def test_loss_mask_covers_the_assistant_and_skips_a_mistaken_call(box):
    from inference.tokenizer import HFTokenizer
    from training.demo_model.train import TOKENIZER

    tok = HFTokenizer(TOKENIZER)
    fam = next(f for f in FAMILIES if f.name == "calc_recover")
    rng = random.Random(1)
    c = Conv(box, rng)
    fam.make(c, rng)
    ids, mask = example(tok, c.messages, box.tools)
    learnt = tok.decode([i for i, m in zip(ids, mask, strict=True) if m])
    bad, good = (json.loads(m["tool_calls"][0]["function"]["arguments"])["expression"]
                 for m in c.messages if m.get("tool_calls"))  # fmt: skip
    assert c.messages[1]["learn"] is False and "error" in c.messages[2]["content"]
    assert good in learnt and bad not in learnt
    assert learnt.endswith(c.messages[-1]["content"] + "<|im_end|>")
    assert c.messages[0]["content"] not in learnt


def test_tokenizer_round_trips_digits_and_copies_attachment_ids_token_for_token():
    from inference.tokenizer import HFTokenizer
    from training.demo_model.train import TOKENIZER

    tok = HFTokenizer(TOKENIZER)
    for s in ("7777 * 8 + 9", "100000000000007", "1 234,5 × 12", "0.0001"):
        assert tok.decode(tok.encode(s)) == s
    att = "196afcfe-ab23-407c-82fa-acd18d26c3b5"
    label, call = (
        tok.encode(f"[image a.png, attachment_id {att}]"),
        tok.encode(f'{{"attachment_id": "{att}"}}'),
    )
    want = tok.encode(att)
    assert any(label[i : i + len(want)] == want for i in range(len(label)))
    assert any(call[i : i + len(want)] == want for i in range(len(call)))
