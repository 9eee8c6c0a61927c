"""A minimal PDF writer for the demo corpus and eval: one page of Helvetica text lines."""

from __future__ import annotations

from collections.abc import Sequence

__all__ = ["text_pdf"]


def _literal(text: str) -> bytes:
    return b"(" + text.replace("\\", "\\\\").replace("(", "\\(").replace(")", "\\)").encode("latin-1") + b")"


def text_pdf(lines: Sequence[str], *, width: int = 612, height: int = 792) -> bytes:
    """A valid one-page PDF showing `lines` top to bottom (Latin-1 text)."""
    ops = [b"BT /F1 11 Tf 14 TL 50 %d Td" % (height - 60)]
    ops += [_literal(line) + b" Tj T*" for line in lines]
    ops.append(b"ET")
    content = b"\n".join(ops)
    objects = [
        b"<< /Type /Catalog /Pages 2 0 R >>",
        b"<< /Type /Pages /Kids [4 0 R] /Count 1 >>",
        b"<< /Type /Font /Subtype /Type1 /BaseFont /Helvetica >>",
        b"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 %d %d] /Resources << /Font << /F1 3 0 R >> >> "
        b"/Contents 5 0 R >>" % (width, height),
        b"<< /Length %d >>\nstream\n" % len(content) + content + b"\nendstream",
    ]
    out = bytearray(b"%PDF-1.4\n")
    offsets = []
    for i, body in enumerate(objects, start=1):
        offsets.append(len(out))
        out += b"%d 0 obj\n" % i + body + b"\nendobj\n"
    xref = len(out)
    out += b"xref\n0 %d\n0000000000 65535 f \n" % (len(objects) + 1)
    out += b"".join(b"%010d 00000 n \n" % o for o in offsets)
    out += b"trailer\n<< /Size %d /Root 1 0 R >>\nstartxref\n%d\n%%%%EOF\n" % (len(objects) + 1, xref)
    return bytes(out)
