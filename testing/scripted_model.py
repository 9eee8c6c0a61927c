"""A real OpenAI-compatible HTTP server that plays a scripted agent (tests and benchmarks only).

The first system or user message with `script:` carries the script as JSON after it. With `{"cycles": N}` the model
calls a tool N times (one call per turn), then answers. Other keys shape the tool calls:
`tool` (name), `args` (arguments object, `{i}` in string values becomes the cycle number),
`raw_args` (arguments text sent verbatim: malformed JSON), `parallel` (calls per turn),
`pad` (bytes of filler in the final answer), `sleep_s` (the server waits that long before each
answer: a request in flight to kill the server under), `bad_output` (`markup`, `errors` or `empty`:
every answer is unusable: tool-call markup in the content, `dayzero.tool_call_errors`, or
nothing at all) with `fix_on_feedback` (answer properly once the last message is the runner's
feedback on an unusable reply). The reply is a pure function of the transcript, so a
repeated call returns the same thing.
"""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


def _script(messages: list[dict[str, Any]]) -> dict[str, Any]:
    for m in messages:
        if m.get("role") in ("system", "user"):  # a system prompt can carry it, under a plain goal
            content = m.get("content")
            texts = [content] if isinstance(content, str) else [p.get("text", "") for p in content or []]
            for text in texts:  # the goal's own part (an image's label is a part of its own)
                if "script:" in text:
                    # raw_decode: text after the script (an attachment's extracted text) is not part of it
                    return json.JSONDecoder().raw_decode(text.split("script:", 1)[1])[0]
    return {"cycles": 0}


def _fill(value: Any, i: int) -> Any:
    if isinstance(value, str):
        return value.replace("{i}", str(i))
    if isinstance(value, dict):
        return {k: _fill(v, i) for k, v in value.items()}
    return value


def _unusable(script: dict[str, Any], messages: list[dict[str, Any]]) -> str | None:
    bad = script.get("bad_output")
    last = messages[-1] if messages else {}
    told = last.get("role") == "user" and "could not be used" in str(last.get("content"))
    if bad is None or (told and script.get("fix_on_feedback")):
        return None
    return str(bad)


def reply(messages: list[dict[str, Any]]) -> dict[str, Any]:
    script = _script(messages)
    bad = _unusable(script, messages)
    done = sum(1 for m in messages if m.get("role") == "tool")
    per_turn = int(script.get("parallel", 1))
    cycles = int(script.get("cycles", 0))
    prompt_tokens = sum(len(json.dumps(m)) // 4 for m in messages)
    if done >= cycles * per_turn:
        message: dict[str, Any] = {"role": "assistant", "content": f"done after {done} tool calls"}
        finish = "stop"
    else:
        calls = []
        for j in range(per_turn):
            i = done + j
            args = script.get("raw_args")
            if args is None:
                args = json.dumps(_fill(script.get("args", {"i": i}), i))
            calls.append(
                {
                    "id": f"call_{i}",
                    "type": "function",
                    "function": {"name": script.get("tool", "echo"), "arguments": args},
                }
            )
        message = {"role": "assistant", "content": None, "tool_calls": calls}
        finish = "tool_calls"
    ext: dict[str, Any] = {}
    if bad == "markup":
        message = {"role": "assistant", "content": '<tool_call>{"name": "echo", "arguments": {"i": 0'}
    elif bad == "errors":
        message = {"role": "assistant", "content": ""}
        ext["tool_call_errors"] = ["unclosed tool-call section"]
    elif bad == "empty":
        message = {"role": "assistant", "content": None}
    return {
        "id": "chatcmpl-scripted",
        "object": "chat.completion",
        "model": "scripted",
        "choices": [{"index": 0, "message": message, "finish_reason": finish}],
        "usage": {
            "prompt_tokens": prompt_tokens,
            "completion_tokens": 12,
            "total_tokens": prompt_tokens + 12,
            "prompt_tokens_details": {"cached_tokens": max(0, prompt_tokens - 40)},
        },
        **({"dayzero": ext} if ext else {}),
    }


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args: Any) -> None:
        pass

    def do_POST(self) -> None:
        self.server.traceparents.append(self.headers.get("traceparent"))  # type: ignore[attr-defined]
        length = int(self.headers.get("Content-Length", 0))
        try:
            body = json.loads(self.rfile.read(length))
            self.server.requests.append(body)  # type: ignore[attr-defined]
            delay = float(_script(body["messages"]).get("sleep_s", 0))
            if delay:
                time.sleep(delay)
            out = json.dumps(reply(body["messages"])).encode()
            code = 200
        except (ValueError, KeyError) as exc:
            out, code = json.dumps({"error": {"message": str(exc)}}).encode(), 400
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(out)))
        self.end_headers()
        self.wfile.write(out)


class _QuietServer(ThreadingHTTPServer):
    traceparents: list[str | None]
    requests: list[dict[str, Any]]

    def handle_error(self, request: Any, client_address: Any) -> None:
        pass  # clients killed mid-request (crash tests) are expected


class ScriptedModelServer:
    """Serve on 127.0.0.1 on a free port in a background thread."""

    def __init__(self, port: int = 0) -> None:
        self._httpd = _QuietServer(("127.0.0.1", port), _Handler)
        self._httpd.daemon_threads = True
        self._httpd.traceparents = []
        self._httpd.requests = []
        self.url = f"http://127.0.0.1:{self._httpd.server_address[1]}"
        self._thread = threading.Thread(target=self._httpd.serve_forever, daemon=True)

    @property
    def traceparents(self) -> list[str | None]:
        """The `traceparent` header of every request received, in order."""
        return self._httpd.traceparents

    @property
    def requests(self) -> list[dict[str, Any]]:
        """The body of every request received, in order."""
        return self._httpd.requests

    def __enter__(self) -> ScriptedModelServer:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()


if __name__ == "__main__":
    import sys

    with ScriptedModelServer(int(sys.argv[1]) if len(sys.argv) > 1 else 0) as srv:
        print(srv.url, flush=True)
        sys.stdout.flush()
        while True:
            time.sleep(3600)
