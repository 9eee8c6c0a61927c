"""The in-process inference client: the orchestrator's `chat(request) -> response` served by this
engine, with OpenAI chat-completions dicts in and out (the same parsing and response building as
the HTTP server), plus a `dayzero` extension `{"ttft_ms": float}`.

`EmbeddedEngineClient.default()` builds the bundled small random-weight vision-language model on
the CPU (seeded, so every run is the same model; images in messages work); `from_engine` wraps any
engine.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

from inference.engine.async_engine import AsyncEngine
from inference.engine.engine import Engine, EngineConfig
from inference.server.images import make_image_handler
from inference.server.protocol import OpenAIError, OpenAIServing, mm_inputs, new_request_id
from inference.server.telemetry import record_request
from inference.toolparse import get_tool_parser

DEFAULT_MODEL_NAME = "dayzero-small-random"

# The embedded default: a small model on a CPU. Prefix caching matters here as much as on a GPU:
# each agent turn re-sends the transcript.
EMBEDDED_ENGINE_CONFIG = EngineConfig(
    block_size=16,
    num_blocks=4096,
    num_state_slots=256,
    max_num_seqs=16,
    max_num_batched_tokens=2048,
    max_model_len=32768,
    enable_chunked_prefill=True,
    enable_prefix_caching=True,
    checkpoint_interval=256,
)


class EmbeddedEngineClient:
    """Thread-safe: concurrent `chat` calls are batched by the engine thread."""

    def __init__(
        self,
        engine: Engine,
        *,
        model_name: str = DEFAULT_MODEL_NAME,
        tool_parser: str = "kimi",
        default_max_tokens: int = 256,
    ) -> None:
        self.engine = AsyncEngine(engine).start()
        self.serving = OpenAIServing(
            engine.tokenizer,
            get_tool_parser(tool_parser),
            model_name,
            engine.config.max_model_len,
            image_handler=make_image_handler(engine),
            default_max_tokens=default_max_tokens,
        )

    @classmethod
    def default(cls, *, seed: int = 0) -> EmbeddedEngineClient:
        import torch

        from inference.engine.factory import build_engine, small_vl_model_config

        # a model this small runs fastest on one thread; more only add synchronisation
        torch.set_num_threads(1)
        engine = build_engine(
            config=small_vl_model_config(),
            engine_config=EMBEDDED_ENGINE_CONFIG,
            device="cpu",
            dtype="float32",
            seed=seed,
        )
        return cls(engine)

    def chat(self, request: Mapping[str, Any]) -> dict[str, Any]:
        """An OpenAI chat-completions body -> a `chat.completion` object. Raises ValueError for a
        malformed request (the message says what is wrong) and RuntimeError if the engine failed."""
        started_ns = time.time_ns()
        body = dict(request)
        body.pop("model", None)  # one model in process: any name addresses it
        if body.get("stream"):
            raise ValueError("the embedded client does not stream; leave 'stream' unset")
        try:
            p = self.serving.prepare_chat(body)
        except OpenAIError as exc:
            raise ValueError(str(exc)) from None
        rid, outs = self.engine.generate_sync(
            p.prompt_token_ids,
            p.sampling,
            request_id=new_request_id(),
            mm_spans=p.mm_spans,
            mm_inputs=mm_inputs(p),
        )
        # the engine's phases as spans below the caller's current (GenAI client) span
        record_request({}, "embedded", started_ns, outs[-1], self.serving.model_name)
        return self.serving.chat_response(rid, outs, p)

    def stats(self) -> dict[str, float]:
        return self.engine.stats()

    def close(self) -> None:
        self.engine.shutdown()
