"""The OpenAPI description of the request bodies the server takes (it parses them by hand, so
FastAPI cannot derive them). The subset of OpenAI's API this server implements, with the ranges
it checks: what `tests/inference/server/test_fuzz.py` fuzzes with schemathesis."""

from __future__ import annotations

from typing import Any

_INT64_MIN, _UINT64_MAX = -(2**63), 2**64 - 1

_ERROR = {
    "type": "object",
    "required": ["error"],
    "properties": {
        "error": {
            "type": "object",
            "required": ["message", "type"],
            "properties": {
                "message": {"type": "string"},
                "type": {"type": "string"},
                "param": {"type": ["string", "null"]},
                "code": {"type": ["string", "null"]},
            },
        }
    },
}

_SAMPLING: dict[str, Any] = {
    "model": {"type": ["string", "null"]},
    "max_tokens": {"type": ["integer", "null"], "minimum": 1, "maximum": 2**31 - 1},
    "temperature": {"type": ["number", "null"], "minimum": 0, "maximum": 2},
    "top_p": {"type": ["number", "null"], "exclusiveMinimum": 0, "maximum": 1},
    "top_k": {"type": ["integer", "null"], "minimum": 0, "maximum": 2**31 - 1},
    "seed": {"type": ["integer", "null"], "minimum": _INT64_MIN, "maximum": _UINT64_MAX},
    "min_tokens": {"type": ["integer", "null"], "minimum": 0},
    "n": {"type": ["integer", "null"], "minimum": 1, "maximum": 1},
    "stop": {
        "oneOf": [
            {"type": "string", "minLength": 1},
            {"type": "array", "maxItems": 16, "items": {"type": "string", "minLength": 1}},
            {"type": "null"},
        ]
    },
    "stop_token_ids": {
        "type": ["array", "null"],
        "maxItems": 64,
        "items": {"type": "integer", "minimum": 0, "maximum": 2**31 - 1},
    },
    "ignore_eos": {"type": "boolean"},
    "stream": {"type": ["boolean", "null"]},
}

_CONTENT_PART = {
    "type": "object",
    "required": ["type"],
    "properties": {
        "type": {"enum": ["text", "image_url"]},
        "text": {"type": "string"},
        "image_url": {"type": "object", "required": ["url"], "properties": {"url": {"type": "string"}}},
    },
}

_MESSAGE = {
    "type": "object",
    "required": ["role"],
    "properties": {
        "role": {"enum": ["system", "user", "assistant", "tool"]},
        "content": {
            "oneOf": [{"type": "string"}, {"type": "null"}, {"type": "array", "items": _CONTENT_PART}]
        },
        "name": {"type": "string"},
        "reasoning_content": {"type": ["string", "null"]},
        "tool_call_id": {"type": "string"},
        "tool_calls": {
            "type": "array",
            "items": {
                "type": "object",
                "required": ["id", "type", "function"],
                "properties": {
                    "id": {"type": "string"},
                    "type": {"enum": ["function"]},
                    "function": {
                        "type": "object",
                        "required": ["name", "arguments"],
                        "properties": {"name": {"type": "string"}, "arguments": {"type": "string"}},
                    },
                },
            },
        },
    },
}

_TOOL = {
    "type": "object",
    "required": ["type", "function"],
    "properties": {
        "type": {"enum": ["function"]},
        "function": {
            "type": "object",
            "required": ["name"],
            "properties": {
                "name": {"type": "string", "pattern": "^[A-Za-z0-9_.-]{1,64}$"},
                "description": {"type": "string"},
                "parameters": {"type": "object"},
                "strict": {"type": ["boolean", "null"]},
            },
        },
    },
}

CHAT_REQUEST = {
    "type": "object",
    "required": ["messages"],
    "properties": {
        **_SAMPLING,
        "messages": {"type": "array", "minItems": 1, "maxItems": 1024, "items": _MESSAGE},
        "max_completion_tokens": {"type": ["integer", "null"], "minimum": 1, "maximum": 2**31 - 1},
        "tools": {"type": ["array", "null"], "maxItems": 128, "items": _TOOL},
        "tool_choice": {
            "oneOf": [
                {"enum": ["none", "auto", "required"]},
                {
                    "type": "object",
                    "required": ["type", "function"],
                    "properties": {
                        "type": {"enum": ["function"]},
                        "function": {
                            "type": "object",
                            "required": ["name"],
                            "properties": {"name": {"type": "string"}},
                        },
                    },
                },
            ]
        },
        "parallel_tool_calls": {"type": ["boolean", "null"]},
        "response_format": {
            "type": ["object", "null"],
            "required": ["type"],
            "properties": {
                "type": {"enum": ["text", "json_object", "json_schema"]},
                "json_schema": {
                    "type": "object",
                    "properties": {
                        "name": {"type": "string"},
                        "schema": {"type": "object"},
                        "strict": {"type": ["boolean", "null"]},
                    },
                },
            },
        },
        "chat_template_kwargs": {"type": ["object", "null"]},
        "prompt_cache_key": {"type": ["string", "null"], "maxLength": 256},
        # dayzero's incremental form: `messages` extends the conversation kept under
        # `prompt_cache_key`, of `messages` messages whose chained digest is `digest`
        "dayzero_extends": {
            "type": ["object", "null"],
            "required": ["messages", "digest"],
            "additionalProperties": False,
            "properties": {
                "messages": {"type": "integer", "minimum": 1},
                "digest": {"type": "string", "pattern": "^[0-9a-f]{64}$"},
            },
        },
        "logprobs": {"type": ["boolean", "null"]},
        "top_logprobs": {"type": ["integer", "null"], "minimum": 0, "maximum": 20},
        "stream_options": {"type": ["object", "null"], "properties": {"include_usage": {"type": "boolean"}}},
    },
}

COMPLETION_REQUEST = {
    "type": "object",
    "required": ["prompt"],
    "properties": {
        **_SAMPLING,
        "prompt": {
            "oneOf": [
                {"type": "string", "minLength": 1},
                {"type": "array", "minItems": 1, "items": {"type": "integer", "minimum": 0}},
            ]
        },
        "logprobs": {"type": ["integer", "null"], "minimum": 0, "maximum": 20},
    },
}


TOKENIZE_REQUEST = {
    "oneOf": [
        {
            "type": "object",
            "required": ["prompt"],
            "properties": {
                "model": {"type": ["string", "null"]},
                "prompt": {"type": "string"},
                "add_special_tokens": {"type": "boolean"},
                "return_token_strs": {"type": ["boolean", "null"]},
            },
        },
        {
            "type": "object",
            "required": ["messages"],
            "properties": {
                "model": {"type": ["string", "null"]},
                "messages": CHAT_REQUEST["properties"]["messages"],
                "tools": CHAT_REQUEST["properties"]["tools"],
                "add_generation_prompt": {"type": "boolean"},
                "chat_template_kwargs": {"type": ["object", "null"]},
                "return_token_strs": {"type": ["boolean", "null"]},
            },
        },
    ]
}

DETOKENIZE_REQUEST = {
    "type": "object",
    "required": ["tokens"],
    "properties": {
        "model": {"type": ["string", "null"]},
        "tokens": {
            "type": "array",
            "maxItems": 1 << 22,
            "items": {"type": "integer", "minimum": 0, "maximum": 2**31 - 1},
        },
    },
}


def operation(request_schema: dict[str, Any]) -> dict[str, Any]:
    """`openapi_extra` of a POST route taking `request_schema` (JSON; SSE when `stream` is true)."""
    errors = {
        str(code): {"description": desc, "content": {"application/json": {"schema": _ERROR}}}
        for code, desc in (
            (400, "invalid request"),
            (401, "missing or wrong API key"),
            (404, "unknown model"),
            (413, "request body too large"),
            (503, "engine not running"),
        )
    }
    return {
        "requestBody": {"required": True, "content": {"application/json": {"schema": request_schema}}},
        "responses": {
            "200": {
                "description": "the completion (a JSON object), or its chunks as Server-Sent Events",
                "content": {
                    "application/json": {"schema": {"type": "object"}},
                    "text/event-stream": {"schema": {"type": "string"}},
                },
            },
            **errors,
        },
    }
