"""What serving needs of a checkpoint to talk to users: its tokenizer, its chat template rendered
to ids, and its output parser (tool calls, reasoning). Built from the checkpoint's own files
(`load_frontend`); a random-weight model (no checkpoint) uses the byte tokenizer with the bundled
Kimi-layout template, the demo model's file."""

from __future__ import annotations

import functools
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from inference.chat.render import PromptRenderer
from inference.chat.template import ChatTemplate, load_chat_template
from inference.parsers import OutputParser, make_output_parser
from inference.tokenizer import Tokenizer, TokenizerFilesError

# the Kimi chat layout as a file: the bundled demo model's template, also used by random-weight
# models, whose byte tokenizer has that layout's special tokens
BUNDLED_TEMPLATE_DIR = Path(__file__).resolve().parents[1] / "demo_model" / "weights"


@dataclass(frozen=True)
class ChatFrontend:
    tokenizer: Tokenizer
    template: ChatTemplate
    renderer: PromptRenderer
    parser: OutputParser

    @functools.cached_property
    def max_token_bytes(self) -> int:
        """The most bytes one token stands for (a bound used to refuse oversized text untokenized)."""
        table = self.tokenizer.token_bytes()
        if table is not None:
            return max(1, *map(len, table))
        return max(1, *(len(self.tokenizer.decode([i]).encode()) for i in range(self.tokenizer.vocab_size)))

    def describe(self) -> dict[str, str]:
        """What `dayzero analyze` and the server's start-up log report."""
        r = self.parser.reasoning
        return {
            "tokenizer": type(self.tokenizer).__name__,
            "vocab_size": str(self.tokenizer.vocab_size),
            "chat_template": self.template.origin,
            "templates": ", ".join(sorted(self.template.templates)),
            "tool_call_parser": self.parser.tool_format.name,
            "reasoning_parser": r.name if r is not None else "none",
            "eos_token_ids": str(list(self.tokenizer.eos_token_ids)),
        }


def load_frontend(
    tokenizer: Tokenizer,
    model_dir: str | Path | None,
    *,
    image_token_id: int | None = None,
    chat_template: str | Path | None = None,
    tool_call_parser: str = "auto",
    reasoning_parser: str = "auto",
) -> ChatFrontend:
    """`model_dir` None: a random-weight model (byte tokenizer, bundled template)."""
    template = load_chat_template(model_dir if model_dir is not None else BUNDLED_TEMPLATE_DIR, chat_template)
    if model_dir is None:  # the byte tokenizer's own names, not the demo checkpoint's configs
        template = ChatTemplate(template.templates, template.origin, {})
    source = "\n".join(template.templates.values())
    parser = make_output_parser(
        tokenizer.special_tokens, source, tool_call_parser=tool_call_parser, reasoning_parser=reasoning_parser
    )
    renderer = PromptRenderer(template, tokenizer, image_token_id=image_token_id)
    try:  # a template that cannot render the simplest chat is refused now, not on every request
        renderer.render([{"role": "user", "content": "Hello"}])
    except ValueError as exc:
        raise TokenizerFilesError(
            f"{template.origin}: the chat template cannot render a one-message chat: {exc}"
        ) from None
    return ChatFrontend(tokenizer, template, renderer, parser)


@dataclass(frozen=True, slots=True)
class ChatOptions:
    """How the checkpoint's chat files are read (vLLM's flag names): a template file overriding
    the checkpoint's, and the tool-call / reasoning parsers (`auto`: chosen from the checkpoint)."""

    chat_template: str | None = None
    tool_call_parser: str = "auto"
    reasoning_parser: str = "auto"


def engine_frontend(engine: Any, options: ChatOptions | None = None) -> ChatFrontend:
    """The chat front end of the checkpoint `engine` was built from."""
    o = options or ChatOptions()
    return load_frontend(
        engine.tokenizer,
        engine.model_dir,
        image_token_id=engine.image_token_id,
        chat_template=o.chat_template,
        tool_call_parser=o.tool_call_parser,
        reasoning_parser=o.reasoning_parser,
    )
