"""Conversations as the product builds them: the user turn, attachments, real tool runs.

A `Conv` collects one conversation in OpenAI message form. Its first user message is made by the
product's own code: `NewTask.transcript()` (the goal, then one `dayzero://attachments/<id>` part per
attached file, as `dayzero run --image` and `POST /v1/tasks` make it) and then
`orchestrator.attachments.resolve_images` (a PDF becomes its parsed text, a text file its text, an
image a processed-image reference followed by its label), so the model is trained on the very
content the runner sends. Tool calls run the real built-in tools on the attached files, and a tool
error reaches the model as the runner writes it (`ToolError.to_dict()`).
"""

from __future__ import annotations

import json
import mimetypes
import random
import tempfile
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = ["Conv", "Family", "File", "Task", "ToolBox", "Turn", "tool_result_text"]


@dataclass(frozen=True, slots=True)
class File:
    """A file the user attaches (`dayzero run --image NAME`)."""

    name: str
    data: bytes

    @property
    def media_type(self) -> str:
        return mimetypes.guess_type(self.name)[0] or "application/octet-stream"


@dataclass
class Turn:
    """One user turn and what a correct agent ends it with."""

    user: str
    expected: str  # the final answer a correct run gives (as trained)
    needles: tuple[str, ...] = ()  # strings the answer must hold; none: it must equal `expected`
    tool: str | None = None  # the tool a correct run calls (None: it answers without one)
    files: tuple[File, ...] = ()


@dataclass
class Task:
    category: str
    family: str
    turns: list[Turn]
    messages: list[dict[str, Any]] = field(default_factory=list)  # the reference conversation
    image_tokens: dict[str, int] = field(default_factory=dict)  # image part url -> placeholder tokens


def tool_result_text(content: Any) -> str:
    """A tool result as the runner appends it (JSON, non-ASCII kept)."""
    return content if isinstance(content, str) else json.dumps(content, ensure_ascii=False, default=str)


class ToolBox:
    """The default tool registry, a scratch folder for attached files and a local blob store."""

    def __init__(self, workdir: str | Path | None = None) -> None:
        from preprocess.store import BlobStore
        from workers.tool_jobs import build_registry

        self.registry = build_registry()
        self.tools = self.registry.openai_tools(None)
        self._tmp = None
        if workdir is None:
            self._tmp = tempfile.TemporaryDirectory(prefix="dayzero-demo-")
            workdir = self._tmp.name
        self.workdir = Path(workdir)
        self.blob_url = str(self.workdir / "blobs")
        self.store = BlobStore(self.blob_url)

    def run(self, name: str, arguments: str, attachments: Sequence[Mapping[str, Any]]) -> str:
        """Run one call as a tool worker does; an error becomes the object the model reads."""
        from tools.base import Attachment, ToolContext, ToolError

        atts = tuple(
            Attachment(id=a["id"], media_type=a["media_type"], path=Path(a["path"]), text=None)
            for a in attachments
        )
        ctx = ToolContext("demo", "0", 1, "demo:0:1", attachments=atts)
        try:
            return tool_result_text(self.registry.execute(name, arguments, ctx).content)
        except ToolError as exc:
            return tool_result_text(exc.to_dict())


class Conv:
    """One conversation: `user` (with files), `call` (runs the real tool), `answer`."""

    def __init__(self, box: ToolBox, rng: random.Random) -> None:
        self.box, self.rng = box, rng
        self.messages: list[dict[str, Any]] = []
        self.attachments: list[dict[str, Any]] = []
        self.image_tokens: dict[str, int] = {}
        self.num_calls = 0

    def _attach(self, f: File) -> dict[str, Any]:
        from preprocess.config import PreprocessConfig
        from preprocess.store import sha256_hex

        att_id = str(uuid.UUID(int=self.rng.getrandbits(128), version=4))
        path = self.box.workdir / f"{att_id}{Path(f.name).suffix}"
        path.write_bytes(f.data)
        att = {"id": att_id, "media_type": f.media_type, "filename": f.name, "path": str(path)}
        if f.media_type == "application/pdf":
            from preprocess.pdf import process_document
            from preprocess.pipeline import ProcessedCache

            result = process_document(ProcessedCache(self.box.store), f.data, PreprocessConfig())
            att["processed_sha256"] = result["processed_sha256"]
        elif f.media_type.startswith("text/"):
            att["sha256"] = self.box.store.put(f.data)
        else:  # an image: its placeholder count is the preprocess pipeline's (no pixels needed)
            from PIL import Image

            from preprocess.patchify import target_size

            with Image.open(path) as im:
                w, h = im.size
            cfg = PreprocessConfig()
            _, (ph, pw) = target_size(h, w, cfg)
            unit = cfg.patch_size * cfg.merge_size
            att["processed_sha256"] = sha256_hex(f.data)
            self.image_tokens[f"dayzero-processed:{att['processed_sha256']}"] = (ph // unit) * (pw // unit)
        return att

    def user(self, goal: str, files: Sequence[File] = ()) -> None:
        from orchestrator.attachments import resolve_images
        from orchestrator.tasks.create import NewTask

        atts = [self._attach(f) for f in files]
        self.attachments += atts
        msgs = NewTask(tenant="demo", goal=goal, attachment_ids=[a["id"] for a in atts]).transcript()
        if atts:
            msgs = resolve_images(msgs, atts, self.box.blob_url, by_reference=True)
        self.messages += msgs

    def call(self, name: str, args: Mapping[str, Any], *, learn: bool = True) -> Any:
        """Append the model's call and the real tool's result; `learn=False` marks a mistaken call
        the model is shown (to recover from) but not trained to make."""
        call_id = f"functions.{name}:{self.num_calls}"
        self.num_calls += 1
        raw = json.dumps(dict(args), ensure_ascii=False, separators=(", ", ": "))
        msg: dict[str, Any] = {
            "role": "assistant",
            "content": None,
            "tool_calls": [{"id": call_id, "type": "function", "function": {"name": name, "arguments": raw}}],
        }
        if not learn:
            msg["learn"] = False
        self.messages.append(msg)
        result = self.box.run(name, raw, self.attachments)
        self.messages.append({"role": "tool", "tool_call_id": call_id, "content": result})
        return json.loads(result)

    def answer(self, text: str) -> None:
        self.messages.append({"role": "assistant", "content": text})


@dataclass(frozen=True, slots=True)
class Family:
    """A paraphrase family: one generator of tasks. Held-out families are only ever evaluated."""

    name: str
    category: str
    make: Callable[[Conv, random.Random], Turn]
    held_out: bool = False
    weight: float = 1.0
