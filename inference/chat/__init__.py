"""Chat prompts from a checkpoint's own chat template (`template`), rendered to token ids
(`render`), and the serving front end that pairs them with the output parser (`frontend`)."""

from inference.chat.frontend import (
    BUNDLED_TEMPLATE_DIR,
    ChatFrontend,
    ChatOptions,
    engine_frontend,
    load_frontend,
)
from inference.chat.render import PromptRenderer, RenderedPrompt
from inference.chat.template import ChatTemplate, TemplateRenderError, load_chat_template

__all__ = [
    "BUNDLED_TEMPLATE_DIR",
    "ChatFrontend",
    "ChatOptions",
    "ChatTemplate",
    "PromptRenderer",
    "RenderedPrompt",
    "TemplateRenderError",
    "engine_frontend",
    "load_chat_template",
    "load_frontend",
]
