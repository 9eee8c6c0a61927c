"""A checkpoint's chat template (jinja), found and rendered as transformers' `apply_chat_template`.

Sources, first found wins: `--chat-template FILE`; `chat_template.jinja`; `chat_template.json`
(`{"chat_template": ...}`); `tokenizer_config.json["chat_template"]` — a string, or a list of
named templates (`[{"name", "template"}]`, plus `additional_chat_templates/NAME.jinja`), of which
`tool_use` serves requests with tools and `default` the rest, as transformers picks them.

Rendering uses the same environment as transformers: a sandboxed jinja2 environment with
`trim_blocks`, `lstrip_blocks`, `loopcontrols`, a `{% generation %}` block, the `tojson` filter
(no HTML escaping; indent / separators / sort_keys), `raise_exception` and `strftime_now`; the
variables are `messages`, `tools`, `documents`, `add_generation_prompt`, the named special
tokens of `tokenizer_config.json` (`bos_token`, `eos_token`, ...) and the request's
`chat_template_kwargs` (e.g. `thinking`), which win over the special tokens.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import jinja2
import jinja2.ext
import jinja2.nodes
from jinja2.sandbox import ImmutableSandboxedEnvironment

from inference.tokenizer import TokenizerFilesError, read_json

SPECIAL_TOKEN_KEYS = (
    "bos_token",
    "eos_token",
    "unk_token",
    "sep_token",
    "pad_token",
    "cls_token",
    "mask_token",
)


class TemplateRenderError(ValueError):
    """The template refused the request (its `raise_exception`) or failed on it."""


class _GenerationBlock(jinja2.ext.Extension):
    """`{% generation %}...{% endgeneration %}`: transformers marks assistant text with it; the
    text renders unchanged."""

    tags = {"generation"}  # noqa: RUF012 - jinja2's extension interface

    def parse(self, parser: Any) -> jinja2.nodes.Node:
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return jinja2.nodes.CallBlock(self.call_method("_render"), [], [], body).set_lineno(lineno)

    def _render(self, caller: Any) -> str:
        return caller()


def _raise_exception(message: str) -> None:
    raise jinja2.exceptions.TemplateError(message)


def _tojson(
    x: Any, ensure_ascii: bool = False, indent: Any = None, separators: Any = None, sort_keys: bool = False
) -> str:
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


@functools.lru_cache(maxsize=32)
def _compile(source: str) -> jinja2.Template:
    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[_GenerationBlock, jinja2.ext.loopcontrols]
    )
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    return env.from_string(source)


@dataclass(frozen=True, slots=True)
class ChatTemplate:
    """The template(s) of one checkpoint, ready to render."""

    templates: Mapping[str, str]  # name -> source; "default" always present
    origin: str  # the file it came from (reported by `analyze` and in errors)
    special_tokens: Mapping[str, str] = field(default_factory=dict)  # bos_token etc. -> text

    def source(self, has_tools: bool) -> str:
        if has_tools and "tool_use" in self.templates:
            return self.templates["tool_use"]
        return self.templates["default"]

    def render(
        self,
        messages: Sequence[Mapping[str, Any]],
        tools: Sequence[Mapping[str, Any]] | None = None,
        *,
        add_generation_prompt: bool = True,
        kwargs: Mapping[str, Any] | None = None,
    ) -> str:
        template = _compile(self.source(bool(tools)))
        variables = {**self.special_tokens, **(kwargs or {})}
        try:
            return template.render(
                messages=list(messages),
                tools=list(tools) if tools else None,
                documents=None,
                add_generation_prompt=add_generation_prompt,
                **variables,
            )
        except jinja2.exceptions.TemplateError as exc:
            raise TemplateRenderError(
                f"the chat template ({self.origin}) refused the request: {exc}"
            ) from None
        except (TypeError, ValueError, KeyError, AttributeError, IndexError) as exc:
            raise TemplateRenderError(
                f"the chat template ({self.origin}) failed on the request: {exc}"
            ) from None


def _named(raw: Any, origin: Path) -> dict[str, str]:
    if isinstance(raw, str):
        return {"default": raw}
    if isinstance(raw, list) and all(
        isinstance(t, Mapping) and isinstance(t.get("name"), str) and isinstance(t.get("template"), str)
        for t in raw
    ):
        return {t["name"]: t["template"] for t in raw}
    raise TokenizerFilesError(f"{origin}: chat_template must be a string or a list of {{name, template}}")


def _special_token_texts(tcfg: Mapping[str, Any]) -> dict[str, str]:
    out = {}
    for key in SPECIAL_TOKEN_KEYS:
        v = tcfg.get(key)
        v = v.get("content") if isinstance(v, Mapping) else v
        if isinstance(v, str):
            out[key] = v
    return out


def load_chat_template(model_dir: str | Path, override: str | Path | None = None) -> ChatTemplate:
    """The checkpoint's template (see the module docstring); a folder with none is refused."""
    d = Path(model_dir)
    tcfg_path = d / "tokenizer_config.json"
    tcfg = read_json(tcfg_path)
    specials = _special_token_texts(tcfg)
    templates: dict[str, str] = {}
    origin: Path | None = None
    if override is not None:
        origin = Path(override)
        templates = {"default": origin.read_text(encoding="utf-8")}
    elif (d / "chat_template.jinja").is_file():
        origin = d / "chat_template.jinja"
        templates = {"default": origin.read_text(encoding="utf-8")}
    elif (d / "chat_template.json").is_file():
        origin = d / "chat_template.json"
        templates = _named(read_json(origin).get("chat_template"), origin)
    elif "chat_template" in tcfg:
        origin = tcfg_path
        templates = _named(tcfg["chat_template"], origin)
    extra = d / "additional_chat_templates"
    if override is None and extra.is_dir():
        for f in sorted(extra.glob("*.jinja")):
            templates.setdefault(f.stem, f.read_text(encoding="utf-8"))
    if origin is None or "default" not in templates:
        raise TokenizerFilesError(
            f"{d}: no chat template (chat_template.jinja, chat_template.json or tokenizer_config.json's "
            "chat_template); pass one with --chat-template FILE"
        )
    for name, src in templates.items():
        try:
            _compile(src)
        except jinja2.exceptions.TemplateSyntaxError as exc:
            raise TokenizerFilesError(f"{origin}: template {name!r} does not parse: {exc}") from None
    return ChatTemplate(templates, str(origin), specials)
