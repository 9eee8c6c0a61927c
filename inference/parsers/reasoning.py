"""Reasoning formats: text between `<think>` and `</think>` is `reasoning_content`, the rest the
answer. Whether the output starts inside the reasoning is read from the prompt: templates that
open `<think>` in the generation prompt (DeepSeek-V3.1 thinking, Qwen3) leave the model inside it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class ReasoningFormat:
    name: str
    start: str = "<think>"
    end: str = "</think>"

    def detect(self, special_tokens: Mapping[str, int], template_source: str) -> bool:
        """A template that writes the end marker renders reasoning: the model was trained to think
        (a vocabulary that merely has the tokens is not enough)."""
        return self.end in template_source

    def starts_inside(self, prompt_text: str) -> bool:
        tail = prompt_text.rstrip()
        return tail.endswith(self.start)

    def split(self, text: str, *, inside: bool) -> tuple[str | None, str, bool]:
        """(reasoning or None, the rest, whether the reasoning is still open at the end)."""
        body = text
        if not inside:
            stripped = text.lstrip()
            if not stripped.startswith(self.start):
                return None, text, False
            body = stripped[len(self.start) :]
        i = body.find(self.end)
        if i < 0:
            return body, "", True
        return body[:i], body[i + len(self.end) :], False


THINK = ReasoningFormat("think")
# vLLM's names for the same format, so its flags work here too
REASONING_FORMATS: dict[str, ReasoningFormat] = {
    n: THINK for n in ("think", "deepseek_r1", "deepseek_v3", "qwen3", "kimi", "kimi_k2")
}
