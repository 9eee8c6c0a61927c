"""How the CLI shows a task: its transcript as it grows (the user's goal, each model turn's text
or tool calls, each tool result, the answer) and its outcome line and exit code.

`dayzero run` (reading the database) and `dayzero submit --follow` (reading the REST API) both
print through `Transcript` and `outcome`, so a task looks the same whichever way it ran.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

MAX_SHOWN_CHARS = 2000  # per message: a long tool result is cut, the whole one is in the API


def console() -> Any:
    """The stderr console a transcript prints on (stdout carries only the outcome line). Lines are
    never broken at the terminal's width: a message stays one line for `grep` and log files."""
    from rich.console import Console

    return Console(stderr=True, soft_wrap=True)


class Transcript:
    """Prints the messages of one task that it has not printed yet, on a rich console."""

    def __init__(self, console: Any) -> None:
        self.console = console
        self.shown = 0  # messages printed so far
        self.turn = 0  # model turns printed so far
        self._tool_names: dict[str, str] = {}  # tool_call_id -> tool name, for the results

    def show_new(self, messages: Sequence[Mapping[str, Any]]) -> str:
        """Print `messages[self.shown:]`; returns what the task is doing now (a status line)."""
        waiting_on_tool = False
        for m in messages[self.shown :]:
            self.turn += m["role"] == "assistant"
            self._show(m)
            waiting_on_tool = bool(m["role"] == "assistant" and m.get("tool_calls"))
        self.shown = max(self.shown, len(messages))
        return "running tool …" if waiting_on_tool else f"model turn {self.turn + 1} …"

    def _show(self, m: Mapping[str, Any]) -> None:
        from rich.markup import escape

        role, content, turn = m["role"], m.get("content"), self.turn
        if role == "user":
            self.console.print(f"[bold]user[/bold]: {escape(_text(content))}")
        elif role == "assistant":
            calls = m.get("tool_calls") or []
            if content:
                label = "model" if calls else "answer"
                self.console.print(
                    f"[bold magenta]{label}[/bold magenta] (turn {turn}): {_cut(escape(str(content)))}"
                )
            for c in calls:
                fn = c.get("function") or {}
                self._tool_names[c.get("id", "")] = fn.get("name", "?")
                self.console.print(
                    f"[bold magenta]model[/bold magenta] (turn {turn}) [cyan]→ {escape(fn.get('name', '?'))}[/cyan]"
                    f"({escape(str(fn.get('arguments', '')))})"
                )
        elif role == "tool":
            name = self._tool_names.get(m.get("tool_call_id", ""), "tool")
            self.console.print(f"  [green]← {escape(name)}[/green]: {_cut(escape(str(content)))}")
        else:
            self.console.print(f"[bold]{escape(role)}[/bold]: {_cut(escape(str(content)))}")


def outcome(status: str, result: str | None, error: Any) -> tuple[str, int]:
    """The line printed on stdout when a task ends (its answer, or its status and error) and the
    command's exit code: 0 only for a task that SUCCEEDED."""
    if status == "SUCCEEDED":
        return result or "", 0
    return f"{status}: {json.dumps(error) if error is not None else 'no error recorded'}", 1


def _text(content: Any) -> str:
    """A message's text; an image or file part shows as `[attachment]`, any other as `[type]`."""
    if isinstance(content, str):
        return content
    parts = [p for p in (content if isinstance(content, list) else []) if isinstance(p, dict)]
    return " ".join(
        p["text"] if isinstance(p.get("text"), str)
        else "[attachment]" if p.get("type") == "image_url"
        else f"[{p.get('type')}]"
        for p in parts
    )  # fmt: skip


def _cut(text: str) -> str:
    return text if len(text) <= MAX_SHOWN_CHARS else text[:MAX_SHOWN_CHARS] + " …"
