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
from testing.structured.corpus import CorpusEntry

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
        text = json.dumps([[c.function.name, c.function.arguments] for c in calls]) if calls else None
        return text, r.choices[0].finish_reason, usage
    content, calls, finish, tokens = "", {}, None, 0
    for chunk in client.chat.completions.create(
        model=model, stream=True, stream_options={"include_usage": True}, **body
    ):
        if chunk.usage is not None:
            tokens = chunk.usage.completion_tokens
        for choice in chunk.choices:
            delta = choice.delta
            content += delta.content or ""
            for call in delta.tool_calls or []:
                if call.function is not None:
                    name, args = calls.get(call.index, ("", ""))
                    calls[call.index] = (
                        name + (call.function.name or ""),
                        args + (call.function.arguments or ""),
                    )
            finish = choice.finish_reason or finish
    if case.mode in ("response_format", "json_object"):
        return content, finish, tokens
    return (json.dumps([list(calls[i]) for i in sorted(calls)]) if calls else None), finish, tokens


def _invalid(schema: dict[str, Any], text: str) -> str | None:
    try:
        value = json.loads(text)
    except ValueError as exc:
        return f"not JSON: {exc}: {text[-80:]!r}"
    validator = jsonschema.Draft202012Validator(
        schema, format_checker=jsonschema.Draft202012Validator.FORMAT_CHECKER
    )
    err = jsonschema.exceptions.best_match(validator.iter_errors(value))
    return None if err is None else f"invalid: {err.message[:160]}"


def check(case: Case, text: str | None) -> str | None:
    """None when the answer is valid: the JSON (response_format) or every tool call's arguments
    against the schema of the tool it names (a named choice must name that tool)."""
    if text is None:
        return "no answer"
    if case.mode == "json_object":
        return _invalid({"type": "object"}, text)
    if case.mode == "response_format":
        return _invalid(case.entry.schema, text)
    schemas = {"answer": case.entry.schema, "other": {"type": "object"}}
    for name, args in json.loads(text):
        if name not in schemas or (case.mode == "tool_named" and name != "answer"):
            return f"call of {name!r}"
        if (err := _invalid(schemas[name], args)) is not None:
            return f"{name}: {err}"
    return None


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
