"""The scripted side of an agent trace (`benchmarks.agent_traces`): what each task is asked
(`TraceSpec`), the documents its tools return, the model's scripted replies, and the proxy that
forwards each request to the real inference server (so rendering, tokenizing and the prefix cache
run for real) and answers with the script."""

from __future__ import annotations

import hashlib
import json
import random
import threading
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import httpx

WORDS = [
    "contract", "clause", "party", "liability", "payment", "invoice", "schedule", "termination",
    "notice", "warranty", "indemnity", "audit", "report", "revenue", "region", "quarter", "module",
    "function", "return", "value", "error", "retry", "cache", "block", "token", "layer", "state",
    "request", "server", "client", "budget", "policy",
]  # fmt: skip


TURN_OVERHEAD_BYTES = 160  # template tokens, call id, path and JSON of one tool-call turn


# -- the trace ---------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class TraceSpec:
    """One task's script: the sizes (KB) of the documents it writes and reads back, in order."""

    docs_kb: tuple[float, ...]  # (a fraction of a KB: a short document, for small CPU runs)

    @property
    def turns(self) -> int:
        return 2 * len(self.docs_kb) + 1  # write, read per document, then the answer

    @staticmethod
    def of_turns(turns: int, doc_kb: float) -> TraceSpec:
        """A task of `turns` model turns (odd: write and read per document, then the answer) over
        documents of `doc_kb` each."""
        return TraceSpec((doc_kb,) * max(0, (turns - 1) // 2))

    @staticmethod
    def growing_to(
        target_tokens: int, seed: int, bytes_per_token: float, max_turns: int, base_tokens: int = 0
    ) -> TraceSpec:
        """Documents of 1-50 KB whose write + read bring a transcript that starts at `base_tokens`
        (system prompt, goal) to about `target_tokens`: their sizes are drawn at random, then
        evened out so that they add up to the budget (rounding up each draw overshot it)."""
        rng = random.Random(seed)
        # each document is in the transcript twice (write arguments, read result), each turn adds
        # about TURN_OVERHEAD_BYTES of template, call ids and JSON around it
        free = max(0.0, (target_tokens - base_tokens) * bytes_per_token)
        n = max(1, min((max_turns - 1) // 2, int(free // (2048 + 2 * TURN_OVERHEAD_BYTES))))
        total_kb = max(n, min(50 * n, round((free - 2 * n * TURN_OVERHEAD_BYTES) / 2 / 1024)))
        mean_kb = total_kb / n
        docs = [max(1, min(50, round(rng.uniform(0.5, 1.5) * mean_kb))) for _ in range(n)]
        i = 0
        while sum(docs) != total_kb:  # even out the rounding: one KB at a time, round robin
            step = 1 if sum(docs) < total_kb else -1
            if 1 <= docs[i % n] + step <= 50:
                docs[i % n] += step
            i += 1
        return TraceSpec(tuple(docs))


def document(key: str, i: int, kb: float) -> str:
    rng = random.Random(f"{key}:{i}")
    words: list[str] = []
    size = 0
    nbytes = int(kb * 1024)
    while size < nbytes:
        w = rng.choice(WORDS) + (str(rng.randint(0, 999)) if rng.random() < 0.2 else "")
        words.append(w)
        size += len(w) + 1
    return " ".join(words)[:nbytes]


def scripted_reply(key: str, spec: TraceSpec, turn: int) -> tuple[dict[str, Any], str]:
    """The assistant message of `turn` (0-based) and its finish reason."""
    if turn >= 2 * len(spec.docs_kb):
        return {"role": "assistant", "content": f"done after {turn} turns"}, "stop"
    i = turn // 2
    if turn % 2 == 0:
        name, args = "workspace_write", {"path": f"doc{i}.txt", "content": document(key, i, spec.docs_kb[i])}
    else:
        name, args = "workspace_read", {"path": f"doc{i}.txt"}
    call = {
        "id": f"functions.{name}:{turn}",
        "type": "function",
        "function": {"name": name, "arguments": json.dumps(args)},
    }
    return {"role": "assistant", "content": None, "tool_calls": [call]}, "tool_calls"


def tool_result(key: str, spec: TraceSpec, turn: int) -> dict[str, Any]:
    """What the trace's tool call at `turn` returns, as the workspace tools return it: the write's
    path, size and digest; the read's document."""
    i = turn // 2
    text = document(key, i, spec.docs_kb[i])
    if turn % 2 == 0:
        data = text.encode()
        return {"path": f"doc{i}.txt", "size": len(data), "sha256": hashlib.sha256(data).hexdigest()}
    return {"content": text, "size": len(text.encode()), "offset": 0, "eof": True, "encoding": "utf-8"}


# -- the scripted proxy ------------------------------------------------------------------------
class ScriptedProxy:
    """Forwards chat requests to the inference server and answers with the trace's message."""

    def __init__(self, upstream: str, *, hide_conversation: bool = False) -> None:
        self.upstream = upstream.rstrip("/")
        self.hide_conversation = hide_conversation
        self.specs: dict[str, TraceSpec] = {}  # prompt_cache_key (task id) -> script
        self.turns: dict[str, int] = {}
        self._lock = threading.Lock()
        self._http = httpx.Client(timeout=3600)
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *a: Any) -> None:
                pass

            def do_GET(self) -> None:
                r = proxy._http.get(proxy.upstream + self.path)
                self._send(r.status_code, r.content)

            def do_POST(self) -> None:
                raw = self.rfile.read(int(self.headers.get("content-length") or 0))
                status, body = proxy.chat(
                    raw, {k: v for k, v in self.headers.items() if k.lower() == "traceparent"}
                )
                self._send(status, body)

            def _send(self, status: int, body: bytes) -> None:
                self.send_response(status)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    def __enter__(self) -> ScriptedProxy:
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._http.close()

    def chat(self, raw: bytes, headers: dict[str, str]) -> tuple[int, bytes]:
        req = json.loads(raw)
        key = req.get("prompt_cache_key") or ""
        with self._lock:
            if key not in self.specs:
                self.specs[key] = _spec_of(req["messages"])
        r = self._http.post(
            self.upstream + "/v1/chat/completions",
            content=raw,
            headers={"content-type": "application/json", **headers},
        )
        if r.status_code != 200:
            return r.status_code, r.content  # a 409 `conversation_unknown` included: resent whole
        resp = r.json()
        with self._lock:
            turn = self.turns.get(key, 0)
            self.turns[key] = turn + 1
        msg, finish = scripted_reply(key, self.specs[key], turn)
        resp["choices"][0]["message"] = msg
        resp["choices"][0]["finish_reason"] = finish
        if self.hide_conversation:
            resp.get("dayzero", {}).pop("conversation", None)
        return 200, json.dumps(resp).encode()


def _spec_of(messages: list[dict[str, Any]]) -> TraceSpec:
    for m in messages:
        content = m.get("content")
        if isinstance(content, str) and "trace:" in content:
            d = json.JSONDecoder().raw_decode(content.split("trace:", 1)[1])[0]
            return TraceSpec(tuple(d["docs_kb"]))
    raise ValueError("a trace task's first request carries its script ('trace:' in the goal)")
