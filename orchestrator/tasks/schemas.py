"""The task model's input schemas (Pydantic), apart from the DB models: `TaskCreate` is the one task
body shared by REST (`POST /v1/tasks`), Kafka (`dayzero.tasks`: the same JSON plus `tenant`) and
`dayzero run`; its limits and the attachment and id rules every ingress checks."""

from __future__ import annotations

import math
from collections.abc import Collection
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    StringConstraints,
    model_validator,
)
from pydantic_core import PydanticCustomError

MAX_GOAL_CHARS = 32_000
MAX_MESSAGES = 256
MAX_ATTACHMENTS = 16
MAX_TOOLS = 128
MAX_METADATA_KEYS = 32
IMAGE_MEDIA_TYPES = ("image/png", "image/jpeg", "image/webp", "image/gif")
ATTACHMENT_MEDIA_TYPES = (*IMAGE_MEDIA_TYPES, "application/pdf")  # PDFs: parsed on the preprocess workers

ATTACHMENT_URL_PREFIX = "dayzero://attachments/"  # + attachment id (`orchestrator.attachments`)
# An image part of `messages` turned into the attachment at this index (its id is not known yet).
INLINE_IMAGE_PREFIX = ATTACHMENT_URL_PREFIX + "#"

ShortStr = Annotated[str, StringConstraints(min_length=1, max_length=128)]
MetaValue = Annotated[str, StringConstraints(max_length=1024)] | int | float | bool | None
ID_PATTERN = r"^[A-Za-z0-9._:-]{1,64}$"


def _json_number(value: Any) -> Any:
    # Pydantic's lax mode reads true/false as 1/0 and "5" as 5; the schema says number, so a
    # boolean or a string is a 422. (Strict mode would refuse 5.0 for an integer, which JSON
    # Schema calls an integer.)
    if isinstance(value, bool):
        raise ValueError("expected a number, not a boolean")
    if isinstance(value, str):
        raise ValueError("expected a number, not a string")
    return value


JsonNumber = BeforeValidator(_json_number)


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


def check_text(value: Any, where: str = "body") -> Any:
    """Reject NUL and unpaired surrogates anywhere (neither can be stored in PostgreSQL text/JSONB),
    and non-finite numbers (`NaN`, `Infinity`, `1e400`, which Python's JSON parser reads as
    inf/nan): JSON has no such values and JSONB refuses them. The error's type is
    `invalid_number` (Kafka ingest dead-letters the record under that reason)."""
    if isinstance(value, float):
        if not math.isfinite(value):
            raise PydanticCustomError(
                "invalid_number",
                "{where}: numbers must be finite (no NaN, Infinity or overflow)",
                {"where": where},
            )
    elif isinstance(value, str):
        if "\x00" in value:
            raise ValueError(f"{where}: NUL characters are not allowed")
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            raise ValueError(f"{where}: not valid Unicode (unpaired surrogate)") from None
    elif isinstance(value, dict):
        for k, v in value.items():
            check_text(k, where)
            check_text(v, f"{where}.{k}")
    elif isinstance(value, list):
        for i, v in enumerate(value):
            check_text(v, f"{where}[{i}]")
    return value


class ChatMessage(_Strict):
    """A prior message of the conversation, in OpenAI chat format."""

    role: Literal["system", "user", "assistant", "tool"]
    content: Annotated[str, StringConstraints(max_length=MAX_GOAL_CHARS)] | list[dict[str, Any]] | None = None
    tool_calls: list[dict[str, Any]] | None = None
    tool_call_id: Annotated[str, StringConstraints(max_length=128)] | None = None


class UploadedAttachment(_Strict):
    """An image or PDF uploaded before with `POST /v1/attachments`."""

    upload_id: Annotated[str, StringConstraints(min_length=1, max_length=36)]


class InlineAttachment(_Strict):
    """An image or PDF sent inline, base64-encoded (bounded by the body size limit)."""

    data: Annotated[
        str,
        StringConstraints(
            min_length=4, pattern=r"^(?:[A-Za-z0-9+/]{4})*(?:[A-Za-z0-9+/]{2}==|[A-Za-z0-9+/]{3}=)?$"
        ),
    ] = Field(description="standard base64, padded, no line breaks")
    media_type: Literal["image/png", "image/jpeg", "image/webp", "image/gif", "application/pdf"]
    filename: Annotated[str, StringConstraints(max_length=255)] | None = None


class Budget(_Strict):
    """Per-task limits; the server's defaults are the maximum. Numbers are JSON numbers: a string
    such as "5" is refused, not converted."""

    # the published schema says what `_policy_needs_a_cap` checks, so clients generated from it
    # (and the schema-driven tests) know a policy needs its cap
    model_config = ConfigDict(
        extra="forbid", json_schema_extra={"dependentRequired": {"context_policy": ["max_context_tokens"]}}
    )

    max_steps: Annotated[int | None, JsonNumber] = Field(None, ge=1, le=100_000)
    max_tokens: Annotated[int | None, JsonNumber] = Field(None, ge=1, le=1_000_000_000)
    deadline_s: Annotated[float | None, JsonNumber] = Field(None, gt=0, le=30 * 86400)
    # the context window: a cap on the prompt's tokens and what happens at it (`fail`: the task
    # fails `context_exceeded`; `trim_tool_results`: the oldest tool results are trimmed first)
    max_context_tokens: Annotated[int | None, JsonNumber] = Field(None, ge=256, le=100_000_000)
    context_policy: Literal["fail", "trim_tool_results"] | None = None

    @model_validator(mode="after")
    def _policy_needs_a_cap(self) -> Budget:
        # as the schema's dependentRequired: the field present (even null) needs the cap present
        if "context_policy" in self.model_fields_set and "max_context_tokens" not in self.model_fields_set:
            raise PydanticCustomError(
                "context_policy_without_cap", "budget.context_policy needs budget.max_context_tokens", {}
            )
        return self


class SamplingParams(_Strict):
    temperature: Annotated[float | None, JsonNumber] = Field(None, ge=0, le=2)
    top_p: Annotated[float | None, JsonNumber] = Field(None, gt=0, le=1)
    max_tokens: Annotated[int | None, JsonNumber] = Field(None, ge=1, le=1_000_000)
    # exact in every JSON number implementation
    seed: Annotated[int | None, JsonNumber] = Field(None, ge=0, le=2**53)


class TaskCreate(_Strict):
    """A task submission."""

    goal: Annotated[str, StringConstraints(min_length=1, max_length=MAX_GOAL_CHARS)]
    system_prompt: Annotated[str, StringConstraints(max_length=MAX_GOAL_CHARS)] | None = None
    messages: list[ChatMessage] = Field(default_factory=list, max_length=MAX_MESSAGES)
    attachments: list[UploadedAttachment | InlineAttachment] = Field(
        default_factory=list, max_length=MAX_ATTACHMENTS
    )
    allowed_tools: list[ShortStr] | None = Field(
        None,
        max_length=MAX_TOOLS,
        description="tools the model may call, each one this deployment knows; absent: all; []: none",
    )
    budget: Budget = Field(default_factory=Budget)
    sampling: SamplingParams | None = None
    metadata: dict[ShortStr, MetaValue] = Field(default_factory=dict, max_length=MAX_METADATA_KEYS)

    @model_validator(mode="before")
    @classmethod
    def _storable_text(cls, data: Any) -> Any:
        return check_text(data)

    @model_validator(mode="after")
    def _images_in_messages_are_attachments(self) -> TaskCreate:
        """Image parts in `messages` take the attachments' path: a `data:` image becomes an inline
        attachment (preprocessed and redacted by the workers like any other; the part then refers
        to it), a `dayzero://attachments/<id>` part may name one of the task's own attachments;
        processed references (`dayzero-processed:`) are minted by the system only, and image URLs
        elsewhere would reach the model unprocessed."""
        for i, m in enumerate(self.messages):
            for j, part in enumerate(m.content if isinstance(m.content, list) else ()):
                if not isinstance(part, dict) or part.get("type") != "image_url":
                    continue
                where = f"messages[{i}].content[{j}]"
                image = part.get("image_url")
                url = image.get("url") if isinstance(image, dict) else image
                if not isinstance(url, str):
                    raise PydanticCustomError(
                        "invalid_image_part", "{where}: image_url.url must be a string", {"where": where}
                    )
                if url.startswith(ATTACHMENT_URL_PREFIX):
                    continue
                if not url.startswith("data:"):
                    raise PydanticCustomError(
                        "image_url_not_allowed",
                        "{where}: images are sent inline (data: URLs) or as attachments, not by URL "
                        "or processed reference",
                        {"where": where},
                    )
                head, _, b64 = url.partition(",")
                media_type = head[len("data:") :].removesuffix(";base64")
                if not head.endswith(";base64") or media_type not in IMAGE_MEDIA_TYPES:
                    raise PydanticCustomError(
                        "invalid_image_part",
                        "{where}: a data: URL must be base64 of one of {types}",
                        {"where": where, "types": ", ".join(IMAGE_MEDIA_TYPES)},
                    )
                self.attachments.append(InlineAttachment(data=b64, media_type=media_type))  # type: ignore[arg-type]
                part["image_url"] = {"url": f"{INLINE_IMAGE_PREFIX}{len(self.attachments) - 1}"}
        if len(self.attachments) > MAX_ATTACHMENTS:
            raise PydanticCustomError(
                "too_many_attachments",
                "at most {n} attachments, images in messages included",
                {"n": MAX_ATTACHMENTS},
            )
        return self


def unknown_tools_problem(allowed: list[str] | None, known: Collection[str]) -> str | None:
    """What is wrong with `allowed_tools` for a deployment knowing the tools `known`, or None.

    Absent (None) means every tool. `[]` means no tool: the model is offered none and a call it
    makes anyway is refused, which is a plain chat task and valid. A name the deployment does not
    know would only be refused at execution, so it is refused at submission (REST 422, Kafka DLQ
    `invalid_task`)."""
    if allowed is None:
        return None
    unknown = sorted(set(allowed) - set(known))
    if not unknown:
        return None
    return (
        f"allowed_tools names unknown tool(s) {', '.join(unknown)}; "
        f"this deployment knows: {', '.join(sorted(known)) or '(none)'}"
    )


class KafkaTaskMessage(TaskCreate):
    """The value of a `dayzero.tasks` message: the REST body plus the tenant (key = idempotency key)."""

    tenant: ShortStr
