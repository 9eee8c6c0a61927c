"""The Kimi chat template, rendered straight to token ids.

Layout (as Kimi-K2 / Kimi-Linear's template):
    <|im_system|>tool_declare<|im_middle|>[tools json]<|im_end|>        (if tools)
    <|im_system|>system<|im_middle|>TEXT<|im_end|>
    <|im_user|>user<|im_middle|>TEXT<|im_end|>
    <|im_assistant|>assistant<|im_middle|>TEXT[<|tool_calls_section_begin|>
        <|tool_call_begin|>ID<|tool_call_argument_begin|>ARGS<|tool_call_end|>...
        <|tool_calls_section_end|>]<|im_end|>
    <|im_system|>tool<|im_middle|>## Return of ID\\nTEXT<|im_end|>
    <|im_assistant|>assistant<|im_middle|>                              (generation prompt)
Message text is encoded as plain bytes (a message cannot forge special tokens). An assistant
message is rendered from its content and tool calls exactly as the model produced them, so the
next turn's prompt starts with the previous turn's tokens and reuses its cache.
Images: `<|media_start|>image<|media_content|>` + one `<|media_pad|>` per image embedding +
`<|media_end|>`; the caller's `image_handler` turns an image part into (count, hash, payload).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from inference.cache.coordinator import MMSpan
from inference.tokenizer import Tokenizer
from inference.toolparse import ARG_BEGIN, CALL_BEGIN, CALL_END, SECTION_BEGIN, SECTION_END

ROLE_TOKEN = {
    "system": "<|im_system|>",
    "user": "<|im_user|>",
    "assistant": "<|im_assistant|>",
    "tool": "<|im_system|>",
}
ImageHandler = Callable[[Mapping[str, Any]], tuple[int, str, Any]]


@dataclass(slots=True)
class RenderedPrompt:
    token_ids: list[int]
    mm_spans: list[MMSpan] = field(default_factory=list)
    mm_payloads: list[Any] = field(default_factory=list)
    forced_prefix: str = ""  # generation-prompt text the model's output continues (tool_choice)
    message_ends: list[int] = field(
        default_factory=list
    )  # positions after each <|im_end|> (cache checkpoints)


class ChatTemplate:
    def __init__(self, tokenizer: Tokenizer) -> None:
        self.tok = tokenizer
        self.sp = tokenizer.token_id

    def _text(self, out: list[int], text: str) -> None:
        out.extend(self.tok.encode(text))

    def _content(self, out: list[int], content: Any, r: RenderedPrompt, images: ImageHandler | None) -> None:
        if content is None:
            return
        if isinstance(content, str):
            self._text(out, content)
            return
        if not isinstance(content, list):
            raise ValueError("message content must be a string or a list of content parts")
        for part in content:
            if not isinstance(part, Mapping) or "type" not in part:
                raise ValueError("each content part must be an object with a 'type'")
            if part["type"] == "text":
                if not isinstance(part.get("text"), str):
                    raise ValueError("a text part needs a string 'text'")
                self._text(out, part["text"])
            elif part["type"] in ("image_url", "image"):
                if images is None:
                    raise ValueError("this model/engine does not accept images")
                n, digest, payload = images(part)
                out.append(self.sp("<|media_start|>"))
                self._text(out, "image")
                out.append(self.sp("<|media_content|>"))
                r.mm_spans.append(MMSpan(len(out), n, digest))
                r.mm_payloads.append(payload)
                out.extend([self.sp("<|media_pad|>")] * n)
                out.append(self.sp("<|media_end|>"))
            else:
                raise ValueError(f"unsupported content part type {part['type']!r}")

    def render(
        self,
        messages: Sequence[Mapping[str, Any]],
        tools: Sequence[Mapping[str, Any]] | None = None,
        *,
        tool_choice: Any = "auto",
        add_generation_prompt: bool = True,
        image_handler: ImageHandler | None = None,
    ) -> RenderedPrompt:
        if not isinstance(messages, Sequence) or not messages:
            raise ValueError("'messages' must be a non-empty list")
        out: list[int] = []
        r = RenderedPrompt(out)
        if tools:
            out += [self.sp("<|im_system|>")]
            self._text(out, "tool_declare")
            out.append(self.sp("<|im_middle|>"))
            self._text(out, json.dumps(list(tools), ensure_ascii=False, separators=(",", ":")))
            out.append(self.sp("<|im_end|>"))
            r.message_ends.append(len(out))
        num_calls = 0
        for i, m in enumerate(messages):
            if not isinstance(m, Mapping):
                raise ValueError(f"messages[{i}] must be an object")
            role = m.get("role")
            if role not in ROLE_TOKEN:
                raise ValueError(f"messages[{i}].role must be one of {sorted(ROLE_TOKEN)}, got {role!r}")
            out.append(self.sp(ROLE_TOKEN[role]))
            self._text(out, role)
            out.append(self.sp("<|im_middle|>"))
            if role == "tool":
                self._text(out, f"## Return of {m.get('tool_call_id', '')}\n")
            self._content(out, m.get("content"), r, image_handler if role == "user" else None)
            calls = m.get("tool_calls") if role == "assistant" else None
            if calls:
                out.append(self.sp(SECTION_BEGIN))
                for j, c in enumerate(calls):
                    fn = c.get("function") if isinstance(c, Mapping) else None
                    if not isinstance(fn, Mapping) or not isinstance(fn.get("name"), str):
                        raise ValueError(
                            f"messages[{i}].tool_calls[{j}] needs a 'function' object with a string 'name'"
                        )
                    call_id = c.get("id") or f"functions.{fn.get('name', '')}:{num_calls}"
                    out.append(self.sp(CALL_BEGIN))
                    self._text(out, str(call_id))
                    out.append(self.sp(ARG_BEGIN))
                    args = fn.get("arguments", "{}")
                    self._text(out, args if isinstance(args, str) else json.dumps(args, ensure_ascii=False))
                    out.append(self.sp(CALL_END))
                    num_calls += 1
                out.append(self.sp(SECTION_END))
            out.append(self.sp("<|im_end|>"))
            r.message_ends.append(len(out))
        if add_generation_prompt:
            out.append(self.sp("<|im_assistant|>"))
            self._text(out, "assistant")
            out.append(self.sp("<|im_middle|>"))
            r.forced_prefix = self._forced(tool_choice, tools, num_calls)
            out.extend(self.tok.encode(r.forced_prefix, allow_special=True))
        return r

    @staticmethod
    def _forced(tool_choice: Any, tools: Sequence[Mapping[str, Any]] | None, num_calls: int) -> str:
        if tool_choice in (None, "auto", "none"):
            return ""
        if not tools:
            raise ValueError("tool_choice needs 'tools'")
        if tool_choice == "required":
            return SECTION_BEGIN
        if isinstance(tool_choice, Mapping) and tool_choice.get("type") == "function":
            name = (tool_choice.get("function") or {}).get("name")
            names = {(t.get("function") or {}).get("name") for t in tools}
            if name not in names:
                raise ValueError(f"tool_choice names unknown function {name!r}")
            return f"{SECTION_BEGIN}{CALL_BEGIN}functions.{name}:{num_calls}{ARG_BEGIN}"
        raise ValueError("tool_choice must be 'none', 'auto', 'required' or {'type': 'function', ...}")
