"""A keyed conversation's turns tokenize only their new messages, and give exactly the ids of a full
render, turn after turn, for every release layout and the bundled template; a turn that does not
extend what the key last rendered (edited history, other tools) takes the full path."""

from __future__ import annotations

import json
import random

from inference.chat import load_frontend
from inference.chat.conversations import ConversationCache
from inference.demo_model.spec import DEMO_DIR
from inference.tokenizer import ByteTokenizer, load_tokenizer
from tests.inference.chat import checkpoints

TOOLS = [{"type": "function", "function": {"name": "search", "parameters": {"type": "object"}}}]


def frontends(tmp_path):
    yield "byte", load_frontend(ByteTokenizer(), None)
    yield "demo", load_frontend(load_tokenizer(DEMO_DIR), DEMO_DIR)
    for name, make in (
        ("kimi", checkpoints.kimi_layout),
        ("deepseek", checkpoints.deepseek_layout),
        ("qwen", checkpoints.qwen_layout),
    ):
        d = make(tmp_path / name)
        yield name, load_frontend(load_tokenizer(d), d)


def turns(seed: int, n: int):
    """A growing agent conversation: user asks, assistant calls a tool, the tool answers, ..."""
    rng = random.Random(seed)
    words = ["report", "Ünïcödé", "東京", "17 * 23", "  spaced  ", "tail\n", '{"a": 1}']
    msgs = [
        {"role": "system", "content": "You are terse."},
        {"role": "user", "content": "start " + rng.choice(words)},
    ]
    for i in range(n):
        yield list(msgs)
        call = {
            "id": f"functions.search:{i}",
            "type": "function",
            "function": {"name": "search", "arguments": json.dumps({"q": str(i)})},
        }
        msgs += [
            {"role": "assistant", "content": rng.choice(words), "tool_calls": [call]},
            {
                "role": "tool",
                "tool_call_id": call["id"],
                "content": " ".join(rng.choices(words, k=rng.randint(1, 30))),
            },
        ]
        if i % 3 == 2:
            msgs += [
                {"role": "assistant", "content": "done " + rng.choice(words)},
                {"role": "user", "content": rng.choice(words)},
            ]


def test_keyed_turns_equal_full_renders(tmp_path):
    for name, front in frontends(tmp_path):
        r = front.renderer
        prompts: dict[str, list[int]] = {}  # by `PrefixLink.name`
        for seed in range(3):
            key = f"{name}-{seed}"
            for msgs in turns(seed, 8):
                got = r.render(msgs, TOOLS, conversation=key)
                want = r.render(msgs, TOOLS)
                check_link(got, prompts)
                assert got.token_ids == want.token_ids, (name, len(msgs))
                assert got.text == want.text
                assert want.message_ends[-1] in got.message_ends, (name, want.message_ends, got.message_ends)
        assert r.stats["incremental"] >= 3 * 7 - 2, (name, r.stats)  # every turn after the first, nearly


def check_link(got, prompts: dict[str, list[int]]) -> None:
    """What a keyed turn tells the engine holds: its prompt starts with the first `num_shared`
    tokens of the prompt it names (the engine then copies that prompt's block keys)."""
    link = got.prefix_link
    assert link is not None and link.name not in prompts
    assert (link.extends is not None) == got.incremental
    if link.extends is not None:
        base = prompts[link.extends]
        assert 0 < link.num_shared <= min(len(base), len(got.token_ids))
        assert got.token_ids[: link.num_shared] == base[: link.num_shared]
    prompts[link.name] = list(got.token_ids)


def test_a_turn_that_does_not_extend_the_key_renders_in_full():
    front = load_frontend(ByteTokenizer(), None)
    r = front.renderer
    msgs = next(iter(turns(0, 1)))
    r.render(msgs, TOOLS, conversation="k")
    edited = [
        *msgs[:-1],
        {"role": "user", "content": "something else"},
        {"role": "assistant", "content": "a"},
        {"role": "user", "content": "b"},
    ]
    before = dict(r.stats)
    full = r.render(edited, TOOLS, conversation="k")
    assert full.token_ids == r.render(edited, TOOLS).token_ids
    assert full.prefix_link is not None and full.prefix_link.extends is None  # nothing vouched
    assert r.stats["full"] == before["full"] + 1  # edited history
    longer = [*edited, {"role": "assistant", "content": "c"}, {"role": "user", "content": "d"}]
    assert not r.render(longer, None, conversation="k").incremental  # other tools
    assert r.render(
        [*longer, {"role": "assistant", "content": "e"}, {"role": "user", "content": "f"}],
        None,
        conversation="k",
    ).incremental


def test_the_store_is_bounded_in_tokens():
    cache = ConversationCache(max_tokens=2000)
    front = load_frontend(ByteTokenizer(), None)
    r = type(front.renderer)(front.template, front.tokenizer, conversations=cache)
    for i in range(20):
        r.render(
            [
                {"role": "user", "content": "x" * 300},
                {"role": "assistant", "content": "y"},
                {"role": "user", "content": "z"},
            ],
            conversation=f"c{i}",
        )
    assert cache._tokens <= 2000 and len(cache._items) < 20
