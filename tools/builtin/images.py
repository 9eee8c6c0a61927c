"""`image_info` and `image_crop_zoom` over the task's image attachments (decode via `tools.imaging`).

`image_crop_zoom` returns the crop as a PNG in `ToolResult.metadata["images"]` (base64, for the
runner to hand to the model as an image input) and describes it in `content`; when the task has a
workspace the PNG is also saved there so later tools can use it.
"""

from __future__ import annotations

import base64
import hashlib
import io
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from PIL import Image

from tools.base import (
    Attachment,
    InvalidArgumentsError,
    PermanentToolError,
    RetryPolicy,
    ToolContext,
    ToolResult,
    ToolSpec,
)
from tools.config import ImageConfig
from tools.imaging import image_header, open_image

_ID = {"type": "string", "minLength": 1, "maxLength": 200}


def _find_image(context: ToolContext, attachment_id: str) -> tuple[Attachment, Path]:
    for a in context.attachments:
        if a.id == attachment_id:
            if a.path is None or not a.media_type.startswith("image/"):
                raise PermanentToolError(f"attachment {attachment_id!r} is not an image")
            return a, a.path
    images = [a.id for a in context.attachments if a.media_type.startswith("image/")]
    raise PermanentToolError(
        f"unknown attachment {attachment_id!r}; image attachments: {', '.join(images) or '(none)'}"
    )


class ImageInfoTool:
    def __init__(self, config: ImageConfig | None = None) -> None:
        self.config = config or ImageConfig()
        self.spec = ToolSpec(
            name="image_info",
            description="Size, format, colour mode and frame count of one of this task's image attachments.",
            parameters={
                "type": "object",
                "properties": {"attachment_id": _ID},
                "required": ["attachment_id"],
                "additionalProperties": False,
            },
            result_schema={
                "type": "object",
                "properties": {
                    "attachment_id": {"type": "string"},
                    "format": {"type": "string"},
                    "width": {"type": "integer"},
                    "height": {"type": "integer"},
                    "mode": {"type": "string"},
                    "frames": {"type": "integer"},
                },
                "required": ["attachment_id", "format", "width", "height", "mode", "frames"],
            },
            retry=RetryPolicy(max_attempts=2, timeout_s=10.0),
            idempotent=True,
            resources=("attachments",),
        )

    def run(self, arguments: Mapping[str, Any], context: ToolContext) -> ToolResult:
        a, path = _find_image(context, arguments["attachment_id"])
        fmt, w, h, mode, frames = image_header(path, max_pixels=self.config.max_pixels)
        return ToolResult(
            content={
                "attachment_id": a.id,
                "format": fmt,
                "width": w,
                "height": h,
                "mode": mode,
                "frames": frames,
            }
        )


class ImageCropZoomTool:
    def __init__(self, config: ImageConfig | None = None) -> None:
        self.config = config or ImageConfig()
        cfg = self.config
        self.spec = ToolSpec(
            name="image_crop_zoom",
            description=(
                "Crop a region of one of this task's images and enlarge it to look closer. box is "
                "[left, top, right, bottom] in pixels of the original (see image_info); zoom scales the "
                f"crop (at most {cfg.max_zoom:g}x, output at most {cfg.max_output_side}px a side). "
                "The crop is returned as an image."
            ),
            parameters={
                "type": "object",
                "properties": {
                    "attachment_id": _ID,
                    "box": {
                        "type": "array",
                        "items": {"type": "integer", "minimum": 0},
                        "minItems": 4,
                        "maxItems": 4,
                    },
                    "zoom": {"type": "number", "exclusiveMinimum": 0, "maximum": cfg.max_zoom, "default": 2},
                },
                "required": ["attachment_id", "box"],
                "additionalProperties": False,
            },
            result_schema={
                "type": "object",
                "properties": {
                    "attachment_id": {"type": "string"},
                    "box": {"type": "array", "items": {"type": "integer"}},
                    "width": {"type": "integer"},
                    "height": {"type": "integer"},
                    "sha256": {"type": "string"},
                    "workspace_path": {"type": ["string", "null"]},
                },
                "required": ["attachment_id", "box", "width", "height", "sha256"],
            },
            retry=RetryPolicy(max_attempts=2, timeout_s=20.0),
            # Writes a file named by its content hash into the workspace: repeating it is harmless.
            idempotent=True,
            resources=("attachments", "workspace"),
        )

    def run(self, arguments: Mapping[str, Any], context: ToolContext) -> ToolResult:
        a, path = _find_image(context, arguments["attachment_id"])
        left, top, right, bottom = arguments["box"]
        img = open_image(path, max_pixels=self.config.max_pixels)
        right, bottom = min(right, img.width), min(bottom, img.height)
        if left >= right or top >= bottom:
            raise InvalidArgumentsError(
                f"box must satisfy left < right <= {img.width} and top < bottom <= {img.height} "
                f"(the image is {img.width}x{img.height})"
            )
        crop = img.crop((left, top, right, bottom))
        zoom = float(arguments.get("zoom", 2))
        w, h = max(1, round(crop.width * zoom)), max(1, round(crop.height * zoom))
        fit = min(1.0, self.config.max_output_side / max(w, h))
        w, h = max(1, int(w * fit)), max(1, int(h * fit))
        out = crop.resize((w, h), Image.Resampling.LANCZOS)
        buf = io.BytesIO()
        out.save(buf, format="PNG")
        png = buf.getvalue()
        digest = hashlib.sha256(png).hexdigest()
        saved = _save_to_workspace(context, f"crops/{digest[:16]}.png", png)
        return ToolResult(
            content={
                "attachment_id": a.id,
                "box": [left, top, right, bottom],
                "width": w,
                "height": h,
                "sha256": digest,
                "workspace_path": saved,
            },
            metadata={"images": [{"media_type": "image/png", "data_base64": base64.b64encode(png).decode()}]},
        )


def _save_to_workspace(context: ToolContext, rel: str, data: bytes) -> str | None:
    if context.workspace is None:
        return None
    from tools.builtin.workspace import _atomic_write, _open_dir, split_path

    parts = split_path(rel)
    with _open_dir(context.workspace, parts[:-1], create=True) as dfd:
        _atomic_write(dfd, parts[-1], data)
    return rel
