"""Start the server: build the engine, wrap it, run uvicorn (on a given socket or host/port)."""

from __future__ import annotations

import socket
import threading
from typing import Any

from inference.chat import ChatOptions, engine_frontend
from inference.engine.async_engine import AsyncEngine
from inference.engine.engine import Engine
from inference.server.app import build_app
from inference.server.guard import ServerLimits
from inference.server.images import ImageSources, make_image_handler
from inference.server.protocol import OpenAIServing
from inference.server.telemetry import install_tracer_provider


def make_app(
    engine: Engine,
    *,
    model_name: str,
    chat: ChatOptions | None = None,
    limits: ServerLimits | None = None,
    images: ImageSources | None = None,
) -> tuple[Any, AsyncEngine]:
    install_tracer_provider()  # a no-op where the process already has one (tests, embedded use)
    serving = OpenAIServing(
        engine_frontend(engine, chat),
        model_name,
        engine.config.scheduler.max_model_len,
        image_handler=make_image_handler(engine, images),
    )
    aeng = AsyncEngine(engine).start()
    return build_app(aeng, serving, limits), aeng


def run_server(
    engine: Engine,
    *,
    host: str,
    port: int,
    model_name: str,
    chat: ChatOptions | None = None,
    limits: ServerLimits | None = None,
    images: ImageSources | None = None,
) -> None:
    import uvicorn

    app, aeng = make_app(engine, model_name=model_name, chat=chat, limits=limits, images=images)
    try:
        uvicorn.run(app, host=host, port=port, log_level="info")
    finally:
        aeng.shutdown()


class BackgroundServer:
    """The server in a thread on an OS-chosen port (tests, the embedded default's own use)."""

    def __init__(
        self,
        engine: Engine,
        *,
        model_name: str,
        host: str = "127.0.0.1",
        chat: ChatOptions | None = None,
        limits: ServerLimits | None = None,
        images: ImageSources | None = None,
    ) -> None:
        import uvicorn

        self.app, self.engine = make_app(
            engine, model_name=model_name, chat=chat, limits=limits, images=images
        )
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind((host, 0))
        self.url = f"http://{host}:{self.sock.getsockname()[1]}"
        self.server = uvicorn.Server(uvicorn.Config(self.app, log_level="warning", lifespan="off"))
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self.sock]}, daemon=True)

    def __enter__(self) -> BackgroundServer:
        self.thread.start()
        import time

        for _ in range(200):
            if self.server.started:
                break
            time.sleep(0.02)
        return self

    def __exit__(self, *exc: Any) -> None:
        self.server.should_exit = True
        self.thread.join(10)
        self.engine.shutdown()
        self.sock.close()
