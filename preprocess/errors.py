"""Typed image errors. Each message says what went wrong and what the sender can do about it.

Every error is permanent for the same bytes (retrying cannot help), carries a stable `code`, and
round-trips through JSON: `to_dict()` for APIs and events; `(message, details)` are its only
constructor arguments so Celery's JSON result backend can rebuild it on the calling side.
"""

from __future__ import annotations

from typing import Any


class ImageError(Exception):
    """Base class of every input-image error raised by `preprocess`."""

    code: str = "image_error"

    def __init__(self, message: str, details: dict[str, Any] | None = None) -> None:
        super().__init__(message, dict(details or {}))
        self.message = message
        self.details: dict[str, Any] = dict(details or {})

    def __str__(self) -> str:
        return self.message

    def to_dict(self) -> dict[str, Any]:
        return {
            "type": type(self).__name__,
            "code": self.code,
            "message": self.message,
            "details": self.details,
            "retryable": False,
        }


class ImageTooLargeError(ImageError):
    """Too many bytes or too many pixels (a decompression bomb lands here, before any pixel is decoded)."""

    code = "image_too_large"


class TruncatedImageError(ImageError):
    """The header was readable but the pixel data ends early or is corrupt."""

    code = "image_truncated"


class UnsupportedFormatError(ImageError):
    """A real image, but in a format (or pixel mode) outside the allow-list."""

    code = "unsupported_format"


class ZeroSizeImageError(ImageError):
    """Empty upload, or an image whose width or height is zero."""

    code = "zero_size_image"


class NotAnImageError(ImageError):
    """The bytes are not an image at all (whatever the file name says)."""

    code = "not_an_image"


class RedactionUnavailableError(ImageError):
    """Redaction was requested but its detector cannot run here; fails closed, never skips silently."""

    code = "redaction_unavailable"


class DocumentError(ImageError):
    """A document attachment (PDF) that cannot be parsed; subclasses say why."""

    code = "document_error"


class EncryptedDocumentError(DocumentError):
    """The PDF needs a password: send it decrypted."""

    code = "document_encrypted"


class MalformedDocumentError(DocumentError):
    """Not a readable PDF (truncated, corrupt, or not a PDF at all)."""

    code = "document_malformed"


class DocumentTooLargeError(DocumentError):
    """Too many bytes or pages, or a page whose content would not fit the limits."""

    code = "document_too_large"


ERROR_TYPES: dict[str, type[ImageError]] = {
    cls.__name__: cls
    for cls in (
        ImageError,
        ImageTooLargeError,
        TruncatedImageError,
        UnsupportedFormatError,
        ZeroSizeImageError,
        NotAnImageError,
        RedactionUnavailableError,
        DocumentError,
        EncryptedDocumentError,
        MalformedDocumentError,
        DocumentTooLargeError,
    )
}


def error_from_dict(data: dict[str, Any]) -> ImageError:
    """Rebuild an error from `ImageError.to_dict()` output (unknown types become the base class)."""
    cls = ERROR_TYPES.get(str(data.get("type")), ImageError)
    return cls(str(data.get("message", "")), data.get("details") or {})
