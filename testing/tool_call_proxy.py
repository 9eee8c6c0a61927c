"""An HTTP proxy in front of a real inference server that makes its first answer a tool call.

The bundled model has random weights: it computes real prefill and decode steps (and spans), but
it never decides to call a tool. To drive a task through a tool step the proxy forwards every
request unchanged (trace headers included), and replaces the message of a reply to a transcript
without a tool result by a call of `tool` — keeping the server's usage figures.
"""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import httpx


class ToolCallProxy:
    def __init__(self, upstream: str, tool: str, arguments: dict[str, Any]) -> None:
        self.upstream = upstream.rstrip("/")
        self.calls = 0
        proxy = self
        client = httpx.Client(timeout=120)
        self._client = client

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("content-length") or 0))
                fwd = {
                    k: v
                    for k, v in self.headers.items()
                    if k.lower() in ("traceparent", "tracestate", "content-type")
                }
                r = client.post(proxy.upstream + self.path, content=body, headers=fwd)
                out = r.content
                req = json.loads(body)
                if r.status_code == 200 and not any(m.get("role") == "tool" for m in req.get("messages", [])):
                    data = r.json()
                    data["choices"][0]["message"] = {
                        "role": "assistant",
                        "content": None,
                        "tool_calls": [
                            {
                                "id": f"call_{proxy.calls}",
                                "type": "function",
                                "function": {"name": tool, "arguments": json.dumps(arguments)},
                            }
                        ],
                    }
                    data["choices"][0]["finish_reason"] = "tool_calls"
                    out = json.dumps(data).encode()
                proxy.calls += 1
                self.send_response(r.status_code)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(out)))
                self.end_headers()
                self.wfile.write(out)

            def log_message(self, *_: Any) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    def __enter__(self) -> ToolCallProxy:
        self._thread.start()
        return self

    def __exit__(self, *_: Any) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._client.close()
