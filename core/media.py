"""Media types decided by content: what a client declares is checked against the bytes' magic
numbers, and the bytes win (an upload declared image/png that is a JPEG is a JPEG)."""

from __future__ import annotations

_MAGIC: tuple[tuple[bytes, int, str], ...] = (
    (b"\x89PNG\r\n\x1a\n", 0, "image/png"),
    (b"\xff\xd8\xff", 0, "image/jpeg"),
    (b"GIF87a", 0, "image/gif"),
    (b"GIF89a", 0, "image/gif"),
    (b"WEBP", 8, "image/webp"),  # after b"RIFF" and the size
    (b"%PDF-", 0, "application/pdf"),
)

SNIFF_BYTES = 16  # enough of the head for every signature above


def sniff_media_type(head: bytes) -> str | None:
    """The media type the first bytes of a file show, or None if they match no known format."""
    for magic, at, media_type in _MAGIC:
        if head[at : at + len(magic)] == magic and (at == 0 or head[:4] == b"RIFF"):
            return media_type
    return None
