"""The incremental wire form end to end through the client's memo and the server's request path
(`OpenAIServing.prepare_chat`, bodies through a JSON round trip as on the wire): a keyed
conversation whose later requests carry only their new messages (`dayzero_extends`) gets exactly
the prompt ids of a full render, over random agent conversations (tool calls, tool results,
images as text placeholders, edited histories, forged special tokens), on the bundled demo
template and on checkpoint templates the tests already use; a server that lacks the base answers
409 `conversation_unknown`, and the client's full resend is correct."""

from __future__ import annotations

import json
import random

import pytest

from inference.chat import load_frontend
from inference.chat.conversations import ConversationCache
from inference.chat.render import PromptRenderer
from inference.demo_model.spec import DEMO_DIR
from inference.server.protocol import OpenAIError, OpenAIServing
from inference.tokenizer import load_tokenizer
from orchestrator.inference_client import Sampling, chat_request_body, kept_messages
from orchestrator.inference_wire import HISTORY_CHANGED, NO_BASE, ConversationMemo
from tests.inference.chat import checkpoints

TOOLS = [
    {"type": "function", "function": {"name": "search", "parameters": {"type": "object"}}},
    {"type": "function", "function": {"name": "read", "parameters": {"type": "object"}}},
]
WORDS = ["report", "Ünïcödé", "東京", "17 * 23", "  spaced  ", "tail\n", '{"a": 1}', "<image: page 3>"]


def front(name, tmp_path):
    if name == "demo":
        return load_frontend(load_tokenizer(DEMO_DIR), DEMO_DIR)
    d = getattr(checkpoints, f"{name}_layout")(tmp_path / name)
    return load_frontend(load_tokenizer(d), d)


def conversation(rng: random.Random, turns: int, specials: list[str]):
    """Transcripts of a growing agent task, one per model turn; the same message objects grow."""
    msgs = [
        {"role": "system", "content": "You answer from the documents. " + rng.choice(WORDS)},
        {"role": "user", "content": "Task: " + " ".join(rng.choices(WORDS, k=rng.randint(1, 40)))},
    ]
    for i in range(turns):
        yield msgs
        calls = [
            {
                "id": f"functions.{rng.choice(['search', 'read'])}:{i}_{j}",
                "type": "function",
                "function": {"name": "search", "arguments": json.dumps({"q": rng.choice(WORDS), "i": i})},
            }
            for j in range(rng.choice([1, 1, 2]))
        ]
        msgs = [*msgs, {"role": "assistant", "content": rng.choice(["", *WORDS]), "tool_calls": calls}]
        for c in calls:
            body = " ".join(rng.choices(WORDS, k=rng.randint(1, 200)))
            if specials and i == 8 and rng.random() < 0.5:  # a tool result spelling a special token
                body += rng.choice(specials)
            msgs = [*msgs, {"role": "tool", "tool_call_id": c["id"], "content": body}]
        if rng.random() < 0.2:
            msgs = [
                *msgs,
                {"role": "assistant", "content": rng.choice(WORDS)},
                {
                    "role": "user",
                    "content": [{"type": "text", "text": "next <image: scan.png> " + rng.choice(WORDS)}],
                },
            ]


def send(serving: OpenAIServing, memo: ConversationMemo, key: str, msgs: list, stats: dict):
    """One request as `OpenAIChatClient.chat` makes it, the body through JSON as on the wire."""
    plan = memo.plan(key, msgs)
    body = chat_request_body("m", plan.messages, TOOLS, Sampling(cache_key=key), plan.extends)
    try:
        p = serving.prepare_chat(json.loads(json.dumps(body)))
        stats["incremental" if plan.extends else f"full:{plan.reason}"] += 1
    except OpenAIError as exc:
        assert exc.status == 409 and exc.code == "conversation_unknown"
        memo.forget(key)
        stats["full:conversation_unknown"] += 1
        body = chat_request_body("m", msgs, TOOLS, Sampling(cache_key=key))
        p = serving.prepare_chat(json.loads(json.dumps(body)))
    ack = kept_messages({"dayzero": {"conversation": {"messages": p.kept_messages}}})
    if ack == len(msgs):
        memo.kept(key, msgs, ack)
    else:
        memo.forget(key)
    return p


@pytest.mark.parametrize("name", ["demo", "kimi", "qwen"])
def test_incremental_requests_give_the_ids_of_full_renders(name, tmp_path):
    f = front(name, tmp_path)
    serving = OpenAIServing(f, "m", 1 << 22)
    reference = PromptRenderer(f.template, f.tokenizer)  # renders every prompt in full
    specials = [s for s in f.tokenizer.special_tokens if s.startswith("<|")][:4]
    stats = {
        k: 0
        for k in ("incremental", f"full:{NO_BASE}", f"full:{HISTORY_CHANGED}", "full:conversation_unknown")
    }
    for seed in range(6):
        rng = random.Random(seed)
        memo = ConversationMemo()
        key = f"{name}-{seed}"
        for t, msgs in enumerate(conversation(rng, 12, specials if seed == 5 else [])):
            if t == 6 and seed % 3 == 1:  # the server lost it (evicted, restarted)
                serving.frontend.renderer.conversations.drop(key)
            p = send(serving, memo, key, msgs, stats)
            want = reference.render(msgs, TOOLS)
            assert p.prompt_token_ids == want.token_ids, (name, seed, t)
    # every conversation's first request is full; most later ones are incremental
    assert stats[f"full:{NO_BASE}"] >= 6
    assert stats["full:conversation_unknown"] >= 2, (stats, serving.frontend.renderer.fallbacks)
    assert stats["incremental"] >= 6 * 11 // 2, stats
    assert (
        serving.frontend.renderer.fallbacks.get("conversation_unknown", 0)
        == stats["full:conversation_unknown"]
    )
    assert serving.frontend.renderer._windowed > 0  # the template was rendered over windows


def test_a_template_that_numbers_messages_is_not_rendered_over_windows():
    """A template whose output depends on a message's position (here its number) fails the
    window probe: its extensions render the whole conversation, and stay exact."""
    from inference.chat.template import ChatTemplate
    from inference.tokenizer import ByteTokenizer

    numbered = (
        "{%- for m in messages -%}<|im_user|>{{ loop.index }} {{ m.role }}<|im_middle|>"
        "{{ m.content if m.content is string else '' }}<|im_end|>{%- endfor -%}"
        "{%- if add_generation_prompt -%}<|im_assistant|>assistant<|im_middle|>{%- endif -%}"
    )
    tok = ByteTokenizer()
    r = PromptRenderer(ChatTemplate({"default": numbered}, "numbered", {}), tok)
    ref = PromptRenderer(ChatTemplate({"default": numbered}, "numbered", {}), tok)
    msgs = [{"role": "system", "content": "s"}, {"role": "user", "content": "u"}]
    for i in range(12):
        msgs = [*msgs, {"role": "assistant", "content": f"a{i}"}, {"role": "user", "content": f"u{i}"}]
        assert r.render(msgs, conversation="k").token_ids == ref.render(msgs).token_ids
    assert not r.window_ok() and r.fallbacks.get("template_window") == 1
    assert r.stats["incremental"] >= 10 and r._windowed == 0


def test_a_base_the_server_does_not_have_is_refused_409():
    f = load_frontend(load_tokenizer(DEMO_DIR), DEMO_DIR)
    serving = OpenAIServing(f, "m", 1 << 20)
    msgs = [{"role": "system", "content": "s"}, {"role": "user", "content": "hello"}]
    memo = ConversationMemo()
    p = serving.prepare_chat(chat_request_body("m", msgs, [], Sampling(cache_key="k")))
    assert p.kept_messages == 2
    memo.kept("k", msgs, 2)
    new = [*msgs, {"role": "assistant", "content": "hi"}, {"role": "user", "content": "more"}]
    plan = memo.plan("k", new)
    assert plan.extends is not None and len(plan.messages) == 2
    bad = dict(plan.extends, digest="0" * 64)  # a different history under the same key
    for ext in (bad, dict(plan.extends, messages=3)):
        with pytest.raises(OpenAIError) as err:
            serving.prepare_chat(chat_request_body("m", plan.messages, [], Sampling(cache_key="k"), ext))
        assert (err.value.status, err.value.code) == (409, "conversation_unknown")
    with pytest.raises(OpenAIError) as err:  # an extension needs the key
        serving.prepare_chat(chat_request_body("m", plan.messages, [], Sampling(), plan.extends))
    assert err.value.status == 400
    p = serving.prepare_chat(chat_request_body("m", plan.messages, [], Sampling(cache_key="k"), plan.extends))
    assert p.prompt_render == "incremental" and p.kept_messages == 4
    assert p.prompt_token_ids == serving.frontend.renderer.render(new).token_ids
    # an evicted conversation: the same request is refused
    tiny = OpenAIServing(load_frontend(load_tokenizer(DEMO_DIR), DEMO_DIR), "m", 1 << 20)
    tiny.frontend.renderer.conversations = ConversationCache(max_tokens=1)
    with pytest.raises(OpenAIError) as err:
        tiny.prepare_chat(chat_request_body("m", plan.messages, [], Sampling(cache_key="k"), plan.extends))
    assert err.value.code == "conversation_unknown"


def test_the_memo_sends_only_what_follows_the_very_messages_it_sent():
    memo = ConversationMemo()
    a = [{"role": "user", "content": "x"}]
    assert memo.plan("k", a).reason == NO_BASE
    memo.kept("k", a, 1)
    b = [*a, {"role": "assistant", "content": "y"}]
    plan = memo.plan("k", b)
    assert plan.messages == b[1:] and plan.extends["messages"] == 1
    copy = [dict(a[0]), b[1]]  # equal but not the same objects: not trusted, sent in full
    assert memo.plan("k", copy).reason == HISTORY_CHANGED
    assert memo.plan("k", a).reason == HISTORY_CHANGED  # nothing new
    assert memo.plan(None, b).extends is None


def test_long_conversations_are_never_rendered_whole_to_check_the_window(monkeypatch):
    """The check of windowed turns against a full render falls due every VERIFY_EVERY windowed
    turns and is made on a conversation under VERIFY_MAX_CHARS: a long conversation's turns render
    only their window (O(new messages)), a short one's turn makes the check, ids stay exact."""
    from inference.chat import render
    from inference.tokenizer import ByteTokenizer

    monkeypatch.setattr(render, "VERIFY_MAX_CHARS", 4000)
    f = load_frontend(ByteTokenizer(), None)
    r = PromptRenderer(f.template, f.tokenizer)
    ref = PromptRenderer(f.template, f.tokenizer)
    widest: list[int] = []
    plain = r.render_text
    monkeypatch.setattr(r, "render_text", lambda m, *a, **k: (widest.append(len(m)), plain(m, *a, **k))[1])

    def grow(msgs: list, i: int, size: int) -> list:
        call = {
            "id": f"functions.read:{i}",
            "type": "function",
            "function": {"name": "read", "arguments": "{}"},
        }
        return [
            *msgs,
            {"role": "assistant", "content": "", "tool_calls": [call]},
            {"role": "tool", "tool_call_id": call["id"], "content": f"page {i} " + "x" * size},
        ]

    long = [{"role": "system", "content": "s"}, {"role": "user", "content": "read it all"}]
    for i in range(2 * render.VERIFY_EVERY):
        long = grow(long, i, 400)
        widest.clear()
        assert r.render(long, TOOLS, conversation="long").token_ids == ref.render(long, TOOLS).token_ids
        if i >= 10:  # past the bound: the window (head, WINDOW kept, 2 new) and no more
            assert max(widest) <= 2 + render.WINDOW + 2, (i, widest)
    assert r._windowed >= render.VERIFY_EVERY and r.verified == 0
    short = [{"role": "system", "content": "s"}, {"role": "user", "content": "a short one"}]
    for i in range(4):
        short = grow(short, i, 10)
        assert r.render(short, TOOLS, conversation="short").token_ids == ref.render(short, TOOLS).token_ids
    assert r.verified == 1  # the check that fell due, made on the short conversation
