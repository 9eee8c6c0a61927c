"""The in-process inference client: the orchestrator's `chat(request) -> response` served by this
engine, with OpenAI chat-completions dicts in and out (the same parsing and response building as
the HTTP server), plus a `dayzero` extension `{"ttft_ms": float}`.

With `blob_url` (the orchestrator's blob store) it takes the preprocess workers' results by
reference (`dayzero-processed:<sha256>`, see `inference.server.images`).

`EmbeddedEngineClient.default(model)` builds one of the bundled models on the CPU, chosen by name
(`EMBEDDED_MODELS`): `dayzero-demo` (also `dayzero-small`, the orchestrator's default name) is the
trained demo model of `inference/demo_model` (it really calls tools); `dayzero-small-random` is the
seeded random-weight vision-language model that tests and benchmarks use (same model every run;
images in messages work). `from_model_dir` serves any checkpoint folder; the constructor wraps any
engine.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from inference.chat import ChatOptions, engine_frontend
from inference.engine.async_engine import AsyncEngine
from inference.engine.engine import Engine, EngineConfig
from inference.server.images import ImageSources, make_image_handler
from inference.server.protocol import OpenAIError, OpenAIServing, mm_inputs, new_request_id
from inference.server.telemetry import record_request

DEFAULT_MODEL_NAME = "dayzero-demo"
RANDOM_MODEL_NAME = "dayzero-small-random"
# name -> what `default` builds: "demo" (the trained checkpoint) or "random" (seeded weights)
EMBEDDED_MODELS: dict[str, str] = {
    DEFAULT_MODEL_NAME: "demo",
    "dayzero-small": "demo",
    RANDOM_MODEL_NAME: "random",
}

# The embedded default: a small model on a CPU. Prefix caching matters here as much as on a GPU:
# each agent turn re-sends the transcript.
EMBEDDED_ENGINE_CONFIG = EngineConfig.of(
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


class ChatAborted(RuntimeError):
    """`chat` ended because `abort(request_id)` aborted its request (no answer)."""


class EmbeddedEngineClient:
    """Thread-safe: concurrent `chat` calls are batched by the engine thread."""

    def __init__(
        self,
        engine: Engine,
        *,
        model_name: str = DEFAULT_MODEL_NAME,
        chat: ChatOptions | None = None,
        default_max_tokens: int = 256,
        blob_url: str | None = None,
    ) -> None:
        self.images = make_image_handler(engine, ImageSources(blob_url=blob_url))
        frontend = engine_frontend(engine, chat)
        self.engine = AsyncEngine(engine).start()
        self.serving = OpenAIServing(
            frontend,
            model_name,
            engine.config.scheduler.max_model_len,
            image_handler=self.images,
            default_max_tokens=default_max_tokens,
        )

    @property
    def images_by_reference(self) -> bool:
        """Whether processed-image references (`dayzero-processed:<sha256>`) can be served."""
        return self.images is not None and self.images.accepts_references

    @classmethod
    def default(
        cls, model: str | None = None, *, seed: int = 0, blob_url: str | None = None
    ) -> EmbeddedEngineClient:
        """The bundled model named `model` (default `DEFAULT_MODEL_NAME`) on the CPU; `seed` is for
        the random-weight model. Raises ValueError for a name that is not in `EMBEDDED_MODELS`."""
        name = model or DEFAULT_MODEL_NAME
        kind = EMBEDDED_MODELS.get(name)
        if kind is None:
            raise ValueError(f"unknown embedded model {name!r}; known: {', '.join(sorted(EMBEDDED_MODELS))}")
        if kind == "demo":
            from inference.demo_model.spec import DEMO_DIR

            return cls.from_model_dir(DEMO_DIR, model_name=name, blob_url=blob_url)
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
        return cls(engine, model_name=name, blob_url=blob_url)

    @classmethod
    def from_model_dir(
        cls, model_dir: str | Path, *, model_name: str | None = None, blob_url: str | None = None
    ) -> EmbeddedEngineClient:
        """A checkpoint folder (config.json, tokenizer.json, safetensors + manifest, checked) on the CPU."""
        import torch

        from inference.engine.factory import build_engine

        torch.set_num_threads(1)
        engine = build_engine(
            model_dir=model_dir, engine_config=EMBEDDED_ENGINE_CONFIG, device="cpu", dtype="float32"
        )
        return cls(engine, model_name=model_name or Path(model_dir).name, blob_url=blob_url)

    def chat(self, request: Mapping[str, Any], *, request_id: str | None = None) -> dict[str, Any]:
        """An OpenAI chat-completions body -> a `chat.completion` object. Raises ValueError for a
        malformed request (the message says what is wrong), `ChatAborted` if `abort` ended it and
        RuntimeError if the engine failed. `request_id`: the engine's id for it (the handle of
        `abort`; default: a new one)."""
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
            request_id=request_id or new_request_id(),
            mm_spans=p.mm_spans,
            mm_inputs=mm_inputs(p),
            message_ends=p.message_ends,
            prefix_link=p.prefix_link,
            handover=True,  # the prompt list is the engine's from here on (`Request`)
        )
        # the engine's phases as spans below the caller's current (GenAI client) span
        record_request({}, "embedded", started_ns, outs[-1], self.serving.model_name)
        if outs[-1].finish_reason == "abort":
            raise ChatAborted(f"request {rid} was aborted")
        return self.serving.chat_response(rid, outs, p)

    def abort(self, request_id: str) -> None:
        """Abort a `chat` in flight (from another thread): the engine drops the request at its next
        step (its blocks and state slot freed) and that `chat` raises `ChatAborted`. An id not in
        flight is ignored."""
        self.engine.abort(request_id)

    def stats(self) -> dict[str, float]:
        return self.engine.stats()

    def close(self) -> None:
        self.engine.shutdown()
