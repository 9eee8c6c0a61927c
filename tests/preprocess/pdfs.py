"""A small PDF writer for tests: text pages (Helvetica), pages with a raster image (a 'scan'),
hostile variants (encrypted, flate bombs). Generated in the test; no files shipped."""

from __future__ import annotations

import zlib
from dataclasses import dataclass, field

import numpy as np


@dataclass
class Page:
    lines: list[str] = field(default_factory=list)
    image: np.ndarray | None = None  # HxWx3 uint8, drawn in the middle of the page
    raw_stream: bytes | None = None  # a content stream used as it is (FlateDecode'd), for bombs


def _escape(text: str) -> bytes:
    return text.replace("\\", "\\\\").replace("(", "\\(").replace(")", "\\)").encode("latin-1")


def make_pdf(pages: list[Page], *, encrypted: bool = False, size=(612, 792)) -> bytes:
    objects: list[bytes | None] = [None, None]  # 1: catalog, 2: page tree (written last)
    objects.append(b"<< /Type /Font /Subtype /Type1 /BaseFont /Helvetica >>")  # 3
    kids = []
    for page in pages:
        resources = b"/Font << /F1 3 0 R >>"
        ops = []
        if page.lines:
            ops.append(b"BT /F1 11 Tf 14 TL 50 %d Td" % (size[1] - 60))
            ops += [b"(" + _escape(line) + b") Tj T*" for line in page.lines]
            ops.append(b"ET")
        if page.image is not None:
            h, w = page.image.shape[:2]
            data = zlib.compress(np.ascontiguousarray(page.image, dtype=np.uint8).tobytes())
            head = b"<< /Type /XObject /Subtype /Image /Width %d /Height %d /ColorSpace /DeviceRGB " % (w, h)
            head += b"/BitsPerComponent 8 /Filter /FlateDecode /Length %d >>" % len(data)
            objects.append(head + b"\nstream\n" + data + b"\nendstream")
            resources += b" /XObject << /Im1 %d 0 R >>" % len(objects)
            ops.append(b"q %d 0 0 %d 56 200 cm /Im1 Do Q" % (size[0] - 112, (size[0] - 112) * h // w))
        if page.raw_stream is not None:
            content = page.raw_stream
            objects.append(
                b"<< /Filter /FlateDecode /Length %d >>\nstream\n" % len(content) + content + b"\nendstream"
            )
        else:
            content = b"\n".join(ops)
            objects.append(b"<< /Length %d >>\nstream\n" % len(content) + content + b"\nendstream")
        contents = len(objects)
        objects.append(
            b"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 %d %d] /Resources << %s >> /Contents %d 0 R >>"
            % (size[0], size[1], resources, contents)
        )
        kids.append(len(objects))
    objects[0] = b"<< /Type /Catalog /Pages 2 0 R >>"
    objects[1] = b"<< /Type /Pages /Kids [%s] /Count %d >>" % (
        b" ".join(b"%d 0 R" % k for k in kids),
        len(kids),
    )
    encrypt_ref = b""
    if encrypted:  # RC4-128 with a user password we never tell: PDFium cannot open it
        objects.append(
            b"<< /Filter /Standard /V 2 /R 3 /Length 128 /P -3904 "
            b"/O <" + b"ab" * 32 + b"> /U <" + b"cd" * 32 + b"> >>"
        )
        encrypt_ref = b" /Encrypt %d 0 R /ID [<%s> <%s>]" % (len(objects), b"01" * 16, b"01" * 16)
    out = bytearray(b"%PDF-1.7\n%\xe2\xe3\xcf\xd3\n")
    offsets = []
    for i, body in enumerate(objects, start=1):
        offsets.append(len(out))
        out += b"%d 0 obj\n" % i + body + b"\nendobj\n"
    xref = len(out)
    out += b"xref\n0 %d\n0000000000 65535 f \n" % (len(objects) + 1)
    out += b"".join(b"%010d 00000 n \n" % off for off in offsets)
    out += b"trailer\n<< /Size %d /Root 1 0 R%s >>\nstartxref\n%d\n%%%%EOF\n" % (
        len(objects) + 1,
        encrypt_ref,
        xref,
    )
    return bytes(out)


def long_contract(pages: int, scans: tuple[int, ...] = ()) -> bytes:
    """A numbered contract; the pages in `scans` carry a raster 'scan' and little text."""
    rng = np.random.default_rng(0)
    out = []
    for i in range(pages):
        if i in scans:
            img = (rng.integers(0, 40, (120, 160, 3)) + 200).astype(np.uint8)
            img[40:50, 20:140] = 30  # a dark bar, like a line of scanned text
            out.append(Page(lines=[f"p{i + 1}"], image=img))
        else:
            out.append(
                Page(
                    lines=[
                        f"Clause {i + 1}.1 marker-{i + 1:04d}: the parties agree.",
                        f"Clause {i + 1}.2 page {i + 1} ends.",
                    ]
                )
            )
    return make_pdf(out)
