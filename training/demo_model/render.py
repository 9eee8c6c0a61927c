"""The one place training, the tokenizer trainer and the corpus tools render a conversation to ids.

`render` is the serving chat template (the checkpoint's `chat_template.jinja`, the Kimi layout) with an
image handler that stands in for the vision path: an image part becomes its `<|media_pad|>`
placeholders, as many as the preprocess pipeline makes for that image (`Task.image_tokens`).
`example` adds the loss mask: the assistant's own tokens, except messages marked `learn: False`
(a mistaken tool call kept in the conversation so the model learns to recover from its error).
"""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from typing import Any

__all__ = ["example", "render"]


@functools.cache
def _renderer(tokenizer: Any) -> Any:
    from inference.chat import BUNDLED_TEMPLATE_DIR, PromptRenderer, load_chat_template

    return PromptRenderer(
        load_chat_template(BUNDLED_TEMPLATE_DIR),
        tokenizer,
        image_token_id=tokenizer.token_id("<|media_pad|>"),
    )


def render(
    tokenizer: Any,
    messages: Sequence[Mapping[str, Any]],
    tools: Sequence[Mapping[str, Any]],
    image_tokens: Mapping[str, int] | None = None,
) -> Any:
    """`messages` with `tools` as the serving template renders them (no generation prompt);
    returns its `RenderedPrompt` (`token_ids`, the end of every message in `message_ends`)."""

    def images(part: Mapping[str, Any]) -> tuple[int, str, None]:
        url = (part.get("image_url") or {}).get("url", "")
        if image_tokens is None or url not in image_tokens:
            raise ValueError(f"no placeholder count for image {url[:60]!r}")
        return image_tokens[url], url, None

    return _renderer(tokenizer).render(
        messages, tools, add_generation_prompt=False, image_handler=images, every_message_end=True
    )


def example(
    tokenizer: Any,
    messages: Sequence[Mapping[str, Any]],
    tools: Sequence[Mapping[str, Any]],
    image_tokens: Mapping[str, int] | None = None,
) -> tuple[list[int], list[bool]]:
    """(token ids, loss mask) of one training conversation."""
    r = render(tokenizer, messages, tools, image_tokens)
    ids = r.token_ids
    a, m, e = (tokenizer.token_id(x) for x in ("<|im_assistant|>", "<|im_middle|>", "<|im_end|>"))
    mask = [False] * len(ids)
    ends = list(r.message_ends)[-len(messages) :]  # the tools declaration ends first, if any
    starts = [r.message_ends[0] if tools else 0, *ends[:-1]]
    for msg, s, end in zip(messages, starts, ends, strict=True):
        if msg.get("role") != "assistant" or msg.get("learn") is False:
            continue
        # after the `<|im_assistant|>assistant<|im_middle|>` header, through `<|im_end|>`
        if ids[s] != a:
            raise ValueError("an assistant message does not start with <|im_assistant|>")
        body = ids.index(m, s) + 1
        for i in range(body, end):
            mask[i] = True
        if ids[end - 1] != e:
            raise ValueError("an assistant message does not end with <|im_end|>")
    return ids, mask
