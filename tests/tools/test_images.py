"""image_info / image_crop_zoom on the task's image attachments; hostile images are clear errors."""

from __future__ import annotations

import base64
import io
from pathlib import Path

import pytest
from PIL import Image

from tools.base import Attachment, InvalidArgumentsError, PermanentToolError
from tools.builtin.images import ImageCropZoomTool, ImageInfoTool
from tools.config import ImageConfig
from tools.imaging import ImageDecodeError
from tools.registry import ToolRegistry

from .conftest import make_context


@pytest.fixture
def image(tmp_path: Path) -> Path:
    img = Image.new("RGB", (200, 100), "white")
    img.paste((255, 0, 0), (50, 25, 100, 75))  # a red square
    p = tmp_path / "img.png"
    img.save(p)
    return p


def registry(**cfg: object) -> ToolRegistry:
    c = ImageConfig(**cfg)  # type: ignore[arg-type]
    return ToolRegistry([ImageInfoTool(c), ImageCropZoomTool(c)])


def test_info(tmp_path: Path, image: Path) -> None:
    ctx = make_context(tmp_path, (Attachment(id="i1", media_type="image/png", path=image),))
    out = registry().execute("image_info", {"attachment_id": "i1"}, ctx).content
    assert out == {
        "attachment_id": "i1",
        "format": "PNG",
        "width": 200,
        "height": 100,
        "mode": "RGB",
        "frames": 1,
    }


def test_crop_zoom(tmp_path: Path, image: Path) -> None:
    ctx = make_context(tmp_path, (Attachment(id="i1", media_type="image/png", path=image),))
    res = registry().execute(
        "image_crop_zoom", {"attachment_id": "i1", "box": [50, 25, 100, 75], "zoom": 3}, ctx
    )
    assert (res.content["width"], res.content["height"]) == (150, 150)
    png = base64.b64decode(res.metadata["images"][0]["data_base64"])
    crop = Image.open(io.BytesIO(png))
    assert crop.size == (150, 150) and crop.convert("RGB").getpixel((75, 75)) == (255, 0, 0)
    assert ctx.workspace is not None and (ctx.workspace / res.content["workspace_path"]).read_bytes() == png


def test_crop_output_is_bounded_and_box_clipped(tmp_path: Path, image: Path) -> None:
    ctx = make_context(tmp_path, (Attachment(id="i1", media_type="image/png", path=image),))
    reg = registry(max_output_side=64)
    out = reg.execute(
        "image_crop_zoom", {"attachment_id": "i1", "box": [0, 0, 5000, 5000], "zoom": 8}, ctx
    ).content
    assert out["box"] == [0, 0, 200, 100] and max(out["width"], out["height"]) == 64
    with pytest.raises(InvalidArgumentsError, match="left < right"):
        reg.execute("image_crop_zoom", {"attachment_id": "i1", "box": [100, 0, 50, 10]}, ctx)
    with pytest.raises(InvalidArgumentsError):
        reg.execute("image_crop_zoom", {"attachment_id": "i1", "box": [0, 0, 10, 10], "zoom": 100}, ctx)


def test_unknown_and_non_image_attachments(tmp_path: Path, image: Path) -> None:
    ctx = make_context(
        tmp_path,
        (
            Attachment(id="i1", media_type="image/png", path=image),
            Attachment(id="t", media_type="text/plain", text="hi"),
        ),
    )
    with pytest.raises(PermanentToolError, match="image attachments: i1"):
        registry().execute("image_info", {"attachment_id": "nope"}, ctx)
    with pytest.raises(PermanentToolError, match="not an image"):
        registry().execute("image_info", {"attachment_id": "t"}, ctx)


def test_decompression_bomb_is_a_clear_error(tmp_path: Path) -> None:
    big = tmp_path / "big.png"
    Image.new("1", (4_000, 4_000)).save(big)  # 16 Mpx in a few KiB: over our configured limit
    bomb = tmp_path / "bomb.png"
    Image.new("1", (10_000, 10_000)).save(bomb)  # 100 Mpx: over Pillow's own bomb threshold too
    atts = (
        Attachment(id="big", media_type="image/png", path=big),
        Attachment(id="bomb", media_type="image/png", path=bomb),
    )
    ctx = make_context(tmp_path, atts)
    reg = registry(max_pixels=10_000_000)
    for tool, args in (("image_info", {}), ("image_crop_zoom", {"box": [0, 0, 10, 10]})):
        with pytest.raises(ImageDecodeError, match=r"16000000 pixels.*10000000"):
            reg.execute(tool, {"attachment_id": "big", **args}, ctx)
        with pytest.raises(ImageDecodeError, match="pixel"):
            reg.execute(tool, {"attachment_id": "bomb", **args}, ctx)


def test_corrupt_and_disallowed_formats(tmp_path: Path, image: Path) -> None:
    truncated = tmp_path / "trunc.png"
    truncated.write_bytes(image.read_bytes()[:200])
    garbage = tmp_path / "garbage.png"
    garbage.write_bytes(b"\x89PNG not really")
    svg = tmp_path / "x.svg"
    svg.write_text("<svg xmlns='http://www.w3.org/2000/svg'/>")
    atts = tuple(Attachment(id=p.stem, media_type="image/png", path=p) for p in (truncated, garbage, svg))
    ctx = make_context(tmp_path, atts)
    for a in atts:
        with pytest.raises(ImageDecodeError):
            registry().execute("image_crop_zoom", {"attachment_id": a.id, "box": [0, 0, 10, 10]}, ctx)
