"""Extensions of a keyed conversation rendered over a window (`PromptRenderer._window`): the
leading system messages and the goal, the last `WINDOW` kept messages and the new ones. What the
new messages add to the window's render is what they add to the whole conversation's for
templates that render each message from its neighbours and the conversation's start; a template
is let do it only after `probe_window` found it so on an agent conversation."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

WINDOW = 4  # kept messages rendered with an extension's new ones


def head_len(msgs: Sequence[Mapping[str, Any]]) -> int:
    """The leading system messages and the first message after them (the task's goal)."""
    i = 0
    while i < len(msgs) and msgs[i].get("role") == "system":
        i += 1
    return min(len(msgs), i + 1)


def probe_window(render_text: Callable[..., str]) -> bool:
    """Whether every extension of a probe agent conversation (system, goal, tool calls and
    results, answers, new user turns; one or two new messages, with and without a generation
    prompt) renders over its window exactly as in full."""
    tools = [{"type": "function", "function": {"name": "probe", "parameters": {"type": "object"}}}]
    msgs: list[Mapping[str, Any]] = [
        {"role": "system", "content": "probe system"},
        {"role": "user", "content": "probe goal"},
    ]
    for i in range(WINDOW + 4):
        call = {
            "id": f"functions.probe:{i}",
            "type": "function",
            "function": {"name": "probe", "arguments": "{}"},
        }
        msgs.append({"role": "assistant", "content": f"step {i}" if i % 2 else "", "tool_calls": [call]})
        msgs.append({"role": "tool", "tool_call_id": call["id"], "content": f"result {i}"})
        if i % 3 == 2:
            msgs += [
                {"role": "assistant", "content": f"answer {i}"},
                {"role": "user", "content": f"more {i}"},
            ]
    try:
        for n in range(head_len(msgs) + WINDOW + 1, len(msgs)):
            for k in (1, 2):
                if n + k > len(msgs):
                    continue
                head = head_len(msgs)
                old = [*msgs[:head], *msgs[n - WINDOW : n]]
                new = msgs[n : n + k]
                for gen in (False, True):
                    full_old = render_text(msgs[:n], tools, add_generation_prompt=False)
                    full_new = render_text(msgs[: n + k], tools, add_generation_prompt=gen)
                    w_old = render_text(old, tools, add_generation_prompt=False)
                    w_new = render_text([*old, *new], tools, add_generation_prompt=gen)
                    if not (w_new.startswith(w_old) and full_new == full_old + w_new[len(w_old) :]):
                        return False
    except ValueError:
        return False
    return True
