"""Structured-output conformance through the real server and the official `openai` SDK: each corpus
schema asked for as `response_format`, as a required tool's arguments, or as a named tool's, whole
or streamed; each answer validated with jsonschema (Draft 2020-12, formats checked). Used by the
test (a rotation over the corpus) and by `benchmarks/structured_outputs.py` (the whole matrix)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import jsonschema

from inference.structured.grammar import describes_object
from tests.inference.structured.corpus import CorpusEntry

MODES = ("response_format", "tool_required", "tool_named", "json_object")
PROMPT = "Answer with the JSON the request asks for."


@dataclass(frozen=True, slots=True)
class Case:
    entry: CorpusEntry
    mode: str
    stream: bool


@dataclass(frozen=True, slots=True)
class Outcome:
    case: Case
    error: str | None  # None: a valid answer
    finish_reason: str | None
    completion_tokens: int


def tool_mode_fits(schema: dict[str, Any]) -> bool:
    """A call's arguments are an object: only object schemas are asked as tool parameters."""
    return describes_object(schema) and "$ref" not in schema


def request(case: Case, max_tokens: int) -> dict[str, Any]:
    body: dict[str, Any] = {
        "messages": [{"role": "user", "content": PROMPT}],
        "temperature": 0,
        "max_tokens": max_tokens,
    }
    schema = case.entry.schema
    if case.mode == "response_format":
        body["response_format"] = {
            "type": "json_schema",
            "json_schema": {"name": "answer", "schema": schema, "strict": True},
        }
    elif case.mode == "json_object":
        body["response_format"] = {"type": "json_object"}
    else:
        tools = [
            {"type": "function", "function": {"name": "answer", "parameters": schema, "strict": True}},
            {"type": "function", "function": {"name": "other", "parameters": {"type": "object"}}},
        ]
        body["tools"] = tools
        body["tool_choice"] = (
            "required"
            if case.mode == "tool_required"
            else {"type": "function", "function": {"name": "answer"}}
        )
    return body


def _answer(client: Any, model: str, case: Case, max_tokens: int) -> tuple[str | None, str | None, int]:
    """(the JSON text answered, finish reason, completion tokens)."""
    body = request(case, max_tokens)
    if not case.stream:
        r = client.chat.completions.create(model=model, **body)
        msg, usage = r.choices[0].message, r.usage.completion_tokens
        if case.mode in ("response_format", "json_object"):
            return msg.content, r.choices[0].finish_reason, usage
        calls = msg.tool_calls or []
        return (calls[0].function.arguments if calls else None), r.choices[0].finish_reason, usage
    content, args, finish, tokens = "", None, None, 0
    for chunk in client.chat.completions.create(
        model=model, stream=True, stream_options={"include_usage": True}, **body
    ):
        if chunk.usage is not None:
            tokens = chunk.usage.completion_tokens
        for choice in chunk.choices:
            delta = choice.delta
            content += delta.content or ""
            for call in delta.tool_calls or []:
                if call.index == 0 and call.function is not None:
                    args = (args or "") + (call.function.arguments or "")
            finish = choice.finish_reason or finish
    return (content if case.mode in ("response_format", "json_object") else args), finish, tokens


def check(case: Case, text: str | None) -> str | None:
    if text is None:
        return "no answer"
    try:
        value = json.loads(text)
    except ValueError as exc:
        return f"not JSON: {exc}: {text[-80:]!r}"
    if case.mode == "json_object":
        return None if isinstance(value, dict) else "not a JSON object"
    validator = jsonschema.Draft202012Validator(
        case.entry.schema, format_checker=jsonschema.Draft202012Validator.FORMAT_CHECKER
    )
    err = jsonschema.exceptions.best_match(validator.iter_errors(value))
    return None if err is None else f"invalid: {err.message[:160]}"


def run(
    base_url: str, model: str, cases: Sequence[Case], *, max_tokens: int = 768, workers: int = 8
) -> list[Outcome]:
    import openai

    client = openai.OpenAI(base_url=f"{base_url}/v1", api_key="unused", max_retries=0, timeout=600)

    def one(case: Case) -> Outcome:
        try:
            text, finish, tokens = _answer(client, model, case, max_tokens)
        except openai.APIStatusError as exc:
            return Outcome(case, f"HTTP {exc.status_code}: {exc.message[:200]}", None, 0)
        return Outcome(case, check(case, text), finish, tokens)

    with ThreadPoolExecutor(workers) as pool:
        return list(pool.map(one, cases))
