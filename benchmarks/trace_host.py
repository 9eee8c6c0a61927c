"""`benchmarks.agent_traces --host-only`: a trace's host path alone, in process (no engine, no
network): the client's choice of messages and JSON body, the server's JSON parse and its
preparation (render + tokenize), one task after another."""

from __future__ import annotations

import json
import sys
import time
from typing import Any

from benchmarks.trace_script import TraceSpec, scripted_reply, tool_result


def host_only(
    specs: list[TraceSpec], system_prompt: str, model: str | None, wire: str
) -> list[dict[str, Any]]:
    """The same traces through the host path alone, in this process (no engine, no network):
    the client's choice of messages and JSON body, the server's JSON parse and its preparation
    (render + tokenize), one task after another. For sizes whose prefill this machine cannot run."""
    from inference.chat import load_frontend
    from inference.server.protocol import OpenAIError, OpenAIServing
    from inference.tokenizer import ByteTokenizer, load_tokenizer
    from orchestrator.inference_client import Sampling, chat_request_body
    from orchestrator.inference_wire import ConversationMemo

    front = load_frontend(load_tokenizer(model), model) if model else load_frontend(ByteTokenizer(), None)
    serving = OpenAIServing(front, "trace", 1 << 30)
    tools = [
        {"type": "function", "function": {"name": n, "parameters": {"type": "object"}}}
        for n in ("workspace_write", "workspace_read")
    ]
    out = []
    for k, spec in enumerate(specs):
        key, memo = f"host-{k}", ConversationMemo()
        msgs: list[dict[str, Any]] = [
            {"role": "system", "content": system_prompt},
            {"role": "user", "content": "trace:" + json.dumps({"docs_kb": list(spec.docs_kb)})},
        ]
        rows: list[dict[str, Any]] = []
        for turn in range(spec.turns):
            t0 = time.perf_counter()
            plan = memo.plan(key, msgs) if wire == "incremental" else memo.plan(None, msgs)
            raw = json.dumps(
                chat_request_body("trace", plan.messages, tools, Sampling(cache_key=key), plan.extends)
            ).encode()
            t1 = time.perf_counter()
            try:
                p = serving.prepare_chat(json.loads(raw))
            except OpenAIError:
                raise SystemExit("host-only trace: the server lost a conversation it keeps") from None
            t2 = time.perf_counter()
            if wire == "incremental" and p.kept_messages == len(msgs):
                memo.kept(key, msgs, len(msgs))
            rows.append({
                "turn": turn, "prompt_tokens": len(p.prompt_token_ids), "request_bytes": len(raw),
                "client_ms": round((t1 - t0) * 1000, 3), "server_ms": round((t2 - t1) * 1000, 3),
                "server_render_ms": round(p.timings_ms["render_ms"], 3), "host_ms": round((t2 - t0) * 1000, 3),
                "wire": "incremental" if plan.extends else "full",
            })  # fmt: skip
            msg, _ = scripted_reply(key, spec, turn)
            msgs = [*msgs, msg]
            if msg.get("tool_calls"):
                call = msg["tool_calls"][0]
                result = json.dumps(tool_result(key, spec, turn))
                msgs = [*msgs, {"role": "tool", "tool_call_id": call["id"], "content": result}]
        print(
            f"host-only task {k + 1}/{len(specs)}: {rows[-1]['prompt_tokens']} tokens",
            file=sys.stderr,
            flush=True,
        )
        out.append({"task": key, "turns": rows})
    return out
