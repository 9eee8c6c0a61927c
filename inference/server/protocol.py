"""OpenAI request parsing and response building, shared by the HTTP server and the embedded client.

No web framework here: a request body (a dict) becomes token ids + `SamplingParams`, and engine
outputs become `chat.completion` / `text_completion` objects (and their streaming chunks).
Malformed input raises `OpenAIError` carrying the HTTP status and OpenAI's error fields.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import jsonschema

from inference.cache.records import PrefixLink
from inference.chat import ChatFrontend, RenderedPrompt
from inference.chat.conversations import Conversation, ConversationUnknown
from inference.chat.render import strings_of
from inference.engine.engine import RequestOutput
from inference.engine.request import SamplingParams, TokenLogprob
from inference.parsers import OutputContext, ParsedMessage, StreamParser, ToolSpec
from inference.server import openapi
from inference.server.images import ImageEncoder
from inference.structured import GrammarError, build_grammar
from inference.wire import CONVERSATION_UNKNOWN, EXTENDS_FIELD


class OpenAIError(Exception):
    def __init__(
        self,
        message: str,
        *,
        status: int = 400,
        type: str = "invalid_request_error",
        param: str | None = None,
        code: str | None = None,
    ) -> None:
        super().__init__(message)
        self.status, self.type, self.param, self.code = status, type, param, code

    def body(self) -> dict[str, Any]:
        return {"error": {"message": str(self), "type": self.type, "param": self.param, "code": self.code}}


def _num(body: Mapping[str, Any], key: str, kind: type, default: Any) -> Any:
    v = body.get(key, default)
    if v is None:
        return default
    if isinstance(v, bool) or not isinstance(v, kind if kind is not float else (int, float)):
        raise OpenAIError(f"'{key}' must be {'a number' if kind is float else 'an integer'}", param=key)
    return v


def parse_sampling(body: Mapping[str, Any], *, default_max_tokens: int, chat: bool) -> SamplingParams:
    stop = body.get("stop")
    if stop is None:
        stop = ()
    elif isinstance(stop, str):
        stop = (stop,)
    elif isinstance(stop, list) and all(isinstance(s, str) for s in stop):
        stop = tuple(stop)
    else:
        raise OpenAIError("'stop' must be a string or a list of strings", param="stop")
    max_key = (
        "max_completion_tokens" if chat and body.get("max_completion_tokens") is not None else "max_tokens"
    )
    logprobs: int | None = None
    if chat:
        if body.get("logprobs"):
            logprobs = _num(body, "top_logprobs", int, 0)
    elif body.get("logprobs") is not None:
        logprobs = _num(body, "logprobs", int, 0)
    n = _num(body, "n", int, 1)
    if n != 1:
        raise OpenAIError("only n=1 is supported", param="n")
    stop_ids = body.get("stop_token_ids") or ()
    if not isinstance(stop_ids, list | tuple) or not all(isinstance(t, int) for t in stop_ids):
        raise OpenAIError("'stop_token_ids' must be a list of integers", param="stop_token_ids")
    kw = dict(
        temperature=float(_num(body, "temperature", float, 1.0)),
        top_p=float(_num(body, "top_p", float, 1.0)),
        top_k=_num(body, "top_k", int, 0),
        seed=_num(body, "seed", int, None),
        max_tokens=_num(body, max_key, int, default_max_tokens),
        min_tokens=_num(body, "min_tokens", int, 0),
        stop=stop,
        stop_token_ids=tuple(stop_ids),
        ignore_eos=bool(body.get("ignore_eos", False)),
        logprobs=logprobs,
        skip_special_tokens=not chat,
    )
    if kw["temperature"] > 2.0:
        raise OpenAIError("'temperature' must be between 0 and 2", param="temperature")
    try:
        return SamplingParams(**kw)
    except ValueError as exc:
        param = str(exc).split(" ", 1)[0]
        raise OpenAIError(str(exc), param=param) from None


@dataclass(slots=True)
class PreparedChat:
    prompt_token_ids: list[int]
    sampling: SamplingParams
    stream: bool
    include_usage: bool
    output: OutputContext
    mm_spans: list = field(default_factory=list)
    mm_payloads: list = field(default_factory=list)
    message_ends: list[int] = field(default_factory=list)
    prompt_render: str | None = None  # keyed conversations: "incremental" or "full"
    kept_messages: int | None = None  # messages of the conversation kept under its key
    prefix_link: PrefixLink | None = None  # which kept prompt a keyed turn extends
    # host ms before the engine: body parse (set by the server), preparation, render + tokenize
    timings_ms: dict[str, float] = field(default_factory=dict)


def mm_inputs(p: PreparedChat) -> Any:
    """The engine's `MMInputs` for a prepared chat with images (None without)."""
    if not p.mm_payloads:
        return None
    import torch

    from inference.engine.model_runner import MMInputs

    positions = torch.cat([torch.arange(s.offset, s.offset + s.length) for s in p.mm_spans])
    return MMInputs(torch.cat(list(p.mm_payloads)), positions)


_CHAT_SCHEMA = jsonschema.Draft202012Validator(openapi.CHAT_REQUEST)
_TOKENIZE_SCHEMA = jsonschema.Draft202012Validator(openapi.TOKENIZE_REQUEST)
_DETOKENIZE_SCHEMA = jsonschema.Draft202012Validator(openapi.DETOKENIZE_REQUEST)


def _validate(body: Any, schema: jsonschema.Draft202012Validator) -> Mapping[str, Any]:
    """The documented request schema is the contract: what it refuses is refused here (400)."""
    if not isinstance(body, Mapping):
        raise OpenAIError("the request body must be a JSON object")
    error = jsonschema.exceptions.best_match(schema.iter_errors(body))
    if error is not None:
        where = "/".join(str(p) for p in error.absolute_path) or "body"
        raise OpenAIError(
            f"{where}: {error.message}", param=str(error.absolute_path[0]) if error.absolute_path else None
        )
    return body


class OpenAIServing:
    """Turns OpenAI bodies into engine calls and engine outputs into OpenAI objects."""

    def __init__(
        self,
        frontend: ChatFrontend,
        model_name: str,
        max_model_len: int,
        image_handler: ImageEncoder | None = None,
        default_max_tokens: int = 1024,
    ) -> None:
        self.frontend = frontend
        self.tok = frontend.tokenizer
        self.model_name = model_name
        self.max_model_len = max_model_len
        self.image_handler = image_handler
        self.default_max_tokens = default_max_tokens

    def check_model(self, body: Mapping[str, Any]) -> None:
        model = body.get("model")
        if model is not None and model != self.model_name:
            raise OpenAIError(
                f"The model `{model}` does not exist", status=404, param="model", code="model_not_found"
            )

    def _check_len(self, n: int) -> None:
        if n >= self.max_model_len:
            raise OpenAIError(
                f"This model's maximum context length is {self.max_model_len} tokens; the prompt has {n} tokens.",
                param="messages",
                code="context_length_exceeded",
            )

    # -- chat ------------------------------------------------------------------------------
    def render(
        self, body: Mapping[str, Any], *, add_generation_prompt: bool = True, images: bool = True
    ) -> RenderedPrompt:
        """The prompt of a (validated) chat body: its messages and tools through the checkpoint's
        template."""
        tools = body.get("tools") or None
        kwargs = body.get("chat_template_kwargs") or None
        key = body.get("prompt_cache_key")
        messages, base = self._messages(body, key)
        try:
            return self.frontend.renderer.render(
                messages,
                tools,
                add_generation_prompt=add_generation_prompt,
                kwargs=kwargs,
                image_handler=self.image_handler if images else None,
                conversation=key,
                base=base,
            )
        except ValueError as exc:
            raise OpenAIError(str(exc), param="messages") from None

    def _messages(self, body: Mapping[str, Any], key: str | None) -> tuple[list[Any], Conversation | None]:
        """The request's whole transcript: its `messages`, or, with `dayzero_extends`, the kept
        conversation it names followed by them (409 `conversation_unknown` when that exact base
        is not here: the client sends the whole transcript instead)."""
        ext = body.get(EXTENDS_FIELD)
        if ext is None:
            return list(body["messages"]), None
        if key is None:
            raise OpenAIError("'dayzero_extends' needs 'prompt_cache_key'", param="dayzero_extends")
        try:
            base = self.frontend.renderer.conversations.resolve(key, ext["messages"], ext["digest"])
        except ConversationUnknown:
            self.frontend.renderer.count_fallback(CONVERSATION_UNKNOWN)
            raise OpenAIError(
                f"no conversation {key!r} of {ext['messages']} messages with that digest is kept "
                "here (evicted, restarted, or another replica): send the whole transcript without "
                "'dayzero_extends'",
                status=409,
                param="dayzero_extends",
                code=CONVERSATION_UNKNOWN,
            ) from None
        return [*base.messages, *body["messages"]], base

    def kept_messages(self, body: Mapping[str, Any]) -> int | None:
        """How many messages of this request's conversation the server now keeps under its key
        (the client may extend exactly that many next time), or None."""
        key = body.get("prompt_cache_key")
        conv = self.frontend.renderer.conversations.get(key) if key is not None else None
        if conv is None or not conv.messages or conv.messages[-1] is not body["messages"][-1]:
            return None  # not kept (images, a template that cannot extend), or kept by another request
        return conv.num_messages

    def _check_text_bound(self, body: Mapping[str, Any]) -> None:
        """Refuse a chat whose text alone needs more tokens than the context holds, before any
        rendering or tokenizing: no token holds more bytes than the vocabulary's longest."""
        nbytes = sum(len(s.encode("utf-8", "replace")) for s in _message_text(body["messages"]))
        least = nbytes // self.frontend.max_token_bytes
        if least >= self.max_model_len:
            raise OpenAIError(
                f"This model's maximum context length is {self.max_model_len} tokens; the messages "
                f"hold {nbytes} bytes of text, at least {least} tokens.",
                param="messages",
                code="context_length_exceeded",
            )

    def prepare_chat(self, body: Any) -> PreparedChat:
        t0 = time.perf_counter()
        p = self._prepare_chat(body)
        p.timings_ms["prepare_ms"] = (time.perf_counter() - t0) * 1000.0
        return p

    def _prepare_chat(self, body: Any) -> PreparedChat:
        body = _validate(body, _CHAT_SCHEMA)
        self.check_model(body)
        self._check_text_bound(body)
        tools = ToolSpec.from_openai(body.get("tools"))
        tool_choice = body.get("tool_choice") or "auto"
        if tool_choice != "none" and tool_choice != "auto" and not tools:
            raise OpenAIError("tool_choice needs 'tools'", param="tool_choice")
        t_render = time.perf_counter()
        rendered = self.render(body)
        render_ms = (time.perf_counter() - t_render) * 1000.0
        self._check_len(len(rendered.token_ids))
        parser = self.frontend.parser
        inside = parser.reasoning is not None and parser.reasoning.starts_inside(rendered.text)
        try:
            grammar = build_grammar(
                parser,
                response_format=body.get("response_format"),
                tools=tools,
                tool_choice=tool_choice,
                parallel_tool_calls=body.get("parallel_tool_calls", True) is not False,
                inside_reasoning=inside,
            )
        except GrammarError as exc:
            raise OpenAIError(str(exc), param=exc.param) from None
        if rendered.mm_payloads:  # all of the request's images through the vision tower at once
            rendered.mm_payloads = self.image_handler.encode(rendered.mm_payloads)
        sampling = replace(
            parse_sampling(body, default_max_tokens=self.default_max_tokens, chat=True), grammar=grammar
        )
        opts = body.get("stream_options") or {}
        output = OutputContext(
            tools={t.name: t for t in tools} if tools else None,
            parse_tools=bool(tools) and tool_choice != "none",
            inside_reasoning=inside,
        )
        return PreparedChat(
            rendered.token_ids,
            sampling,
            bool(body.get("stream", False)),
            bool(isinstance(opts, Mapping) and opts.get("include_usage")),
            output,
            rendered.mm_spans,
            rendered.mm_payloads,
            rendered.message_ends,
            ("incremental" if rendered.incremental else "full") if body.get("prompt_cache_key") else None,
            self.kept_messages(body),
            prefix_link=rendered.prefix_link,
            timings_ms={"render_ms": render_ms},
        )

    def chat_message(self, text: str, p: PreparedChat) -> tuple[dict[str, Any], list[str]]:
        return message_of(self.frontend.parser.parse(text, p.output))

    def chat_response(self, rid: str, outs: Sequence[RequestOutput], p: PreparedChat) -> dict[str, Any]:
        last = outs[-1]
        text = "".join(o.new_text for o in outs)
        msg, errors = self.chat_message(text, p)
        choice: dict[str, Any] = {"index": 0, "message": msg, "finish_reason": finish_reason(msg, last)}
        if p.sampling.logprobs is not None:
            choice["logprobs"] = {"content": self._chat_logprobs([lp for o in outs for lp in o.new_logprobs])}
        resp = {
            "id": f"chatcmpl-{rid}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": self.model_name,
            "choices": [choice],
            "usage": usage(last),
            "dayzero": {"ttft_ms": (last.ttft_s or 0.0) * 1000.0},
        }
        if p.prompt_render is not None:
            resp["dayzero"]["prompt_render"] = p.prompt_render
        if p.kept_messages is not None:  # the client may send only newer messages next time
            resp["dayzero"]["conversation"] = {"messages": p.kept_messages}
        if p.timings_ms:
            resp["dayzero"]["timings_ms"] = {k: round(v, 3) for k, v in p.timings_ms.items()}
        if errors:
            resp["dayzero"]["tool_call_errors"] = errors
        return resp

    def _tok_str(self, t: int) -> str:
        return self.tok.decode([t])

    def _chat_logprobs(self, lps: Sequence[TokenLogprob]) -> list[dict[str, Any]]:
        return [
            {
                "token": self._tok_str(lp.token_id),
                "logprob": lp.logprob,
                "top_logprobs": [{"token": self._tok_str(t), "logprob": v} for t, v in lp.top],
            }
            for lp in lps
        ]

    def chat_chunk(
        self,
        rid: str,
        created: int,
        delta: dict[str, Any],
        finish: str | None = None,
        usage_: dict | None = None,
    ) -> str:
        obj: dict[str, Any] = {
            "id": f"chatcmpl-{rid}",
            "object": "chat.completion.chunk",
            "created": created,
            "model": self.model_name,
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish}] if delta is not None else [],
        }
        if usage_ is not None:
            obj["usage"] = usage_
        return "data: " + json.dumps(obj, ensure_ascii=False) + "\n\n"

    def stream_parser(self, p: PreparedChat) -> StreamParser:
        return StreamParser(self.frontend.parser, p.output)

    # -- tokenize --------------------------------------------------------------------------
    def tokenize(self, body: Any) -> dict[str, Any]:
        """vLLM's `/tokenize`: `{prompt}` (text, `add_special_tokens` adds BOS) or a chat
        `{messages, tools?, add_generation_prompt?, chat_template_kwargs?}` -> its ids."""
        body = _validate(body, _TOKENIZE_SCHEMA)
        self.check_model(body)
        if "messages" in body:
            ids = self.render(
                body, add_generation_prompt=body.get("add_generation_prompt", True) is not False, images=False
            ).token_ids
        else:
            ids = self.tok.encode(body["prompt"])
            if body.get("add_special_tokens") and self.tok.bos_token_id is not None:
                ids = [self.tok.bos_token_id, *ids]
        out: dict[str, Any] = {"count": len(ids), "max_model_len": self.max_model_len, "tokens": ids}
        if body.get("return_token_strs"):
            out["token_strs"] = [self._tok_str(t) for t in ids]
        return out

    def detokenize(self, body: Any) -> dict[str, Any]:
        body = _validate(body, _DETOKENIZE_SCHEMA)
        self.check_model(body)
        ids = [int(t) for t in body["tokens"]]  # JSON Schema's integer admits 1.0
        if any(t >= self.tok.vocab_size for t in ids):
            raise OpenAIError("token ids are outside the vocabulary", param="tokens")
        return {"prompt": self.tok.decode(ids)}

    # -- completions -----------------------------------------------------------------------
    def prepare_completion(self, body: Any) -> tuple[list[int], SamplingParams, bool]:
        if not isinstance(body, Mapping):
            raise OpenAIError("the request body must be a JSON object")
        self.check_model(body)
        prompt = body.get("prompt")
        if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str | list):
            prompt = prompt[0]
        if isinstance(prompt, str):
            ids = self.tok.encode(prompt)
        elif (
            isinstance(prompt, list)
            and prompt
            and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt)
        ):
            ids = list(prompt)
            if any(not 0 <= t < self.tok.vocab_size for t in ids):
                raise OpenAIError("prompt token ids are outside the vocabulary", param="prompt")
        else:
            raise OpenAIError("'prompt' must be a string or a list of token ids (one prompt)", param="prompt")
        if not ids:
            raise OpenAIError("the prompt is empty", param="prompt")
        self._check_len(len(ids))
        return ids, parse_sampling(body, default_max_tokens=16, chat=False), bool(body.get("stream", False))

    def completion_response(
        self, rid: str, outs: Sequence[RequestOutput], sampling: SamplingParams
    ) -> dict[str, Any]:
        last = outs[-1]
        choice: dict[str, Any] = {
            "index": 0,
            "text": "".join(o.new_text for o in outs),
            "finish_reason": last.finish_reason or "stop",
            "logprobs": None,
        }
        if sampling.logprobs is not None:
            lps = [lp for o in outs for lp in o.new_logprobs]
            choice["logprobs"] = {
                "tokens": [self._tok_str(lp.token_id) for lp in lps],
                "token_logprobs": [lp.logprob for lp in lps],
                "top_logprobs": [{self._tok_str(t): v for t, v in lp.top} for lp in lps],
            }
        return {
            "id": f"cmpl-{rid}",
            "object": "text_completion",
            "created": int(time.time()),
            "model": self.model_name,
            "choices": [choice],
            "usage": usage(last),
            "dayzero": {"ttft_ms": (last.ttft_s or 0.0) * 1000.0},
        }

    def completion_chunk(self, rid: str, created: int, text: str, finish: str | None) -> str:
        obj = {
            "id": f"cmpl-{rid}",
            "object": "text_completion",
            "created": created,
            "model": self.model_name,
            "choices": [{"index": 0, "text": text, "finish_reason": finish, "logprobs": None}],
        }
        return "data: " + json.dumps(obj, ensure_ascii=False) + "\n\n"


def usage(o: RequestOutput) -> dict[str, Any]:
    return {
        "prompt_tokens": o.num_prompt_tokens,
        "completion_tokens": o.num_output_tokens,
        "total_tokens": o.num_prompt_tokens + o.num_output_tokens,
        "prompt_tokens_details": {"cached_tokens": o.num_cached_tokens},
    }


def new_request_id() -> str:
    return uuid.uuid4().hex[:24]


def _message_text(messages: Sequence[Mapping[str, Any]]) -> list[str]:
    """The text of messages: strings everywhere but inside image parts (their data is not text)."""
    out: list[str] = []
    for m in messages:
        for key, value in m.items():
            if key == "content" and isinstance(value, list):
                out += [p["text"] for p in value if isinstance(p, Mapping) and isinstance(p.get("text"), str)]
            else:
                out += strings_of(value)
    return out


def message_of(parsed: ParsedMessage) -> tuple[dict[str, Any], list[str]]:
    """An OpenAI assistant message from a parse (and the parse's errors)."""
    msg: dict[str, Any] = {"role": "assistant", "content": parsed.content}
    if parsed.reasoning is not None:
        msg["reasoning_content"] = parsed.reasoning
    if parsed.tool_calls:
        msg["tool_calls"] = parsed.tool_calls
    return msg, parsed.errors


def finish_reason(msg: Mapping[str, Any], last: RequestOutput) -> str:
    return "tool_calls" if msg.get("tool_calls") else (last.finish_reason or "stop")
