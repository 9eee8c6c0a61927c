"""Attachment bytes go to the content-addressed `preprocess.store.BlobStore` under
`settings.blob_dir` (any fsspec URL), the store the preprocess workers read from."""

from __future__ import annotations

from orchestrator.tasks.attachments import put_blob


class TooLarge(Exception):
    pass


class BlobWriter:
    """Collects a streamed upload up to `limit` bytes (413 beyond), then stores it by its SHA-256.

    Bounded by the upload limit, the bytes are buffered in memory: `BlobStore.put` takes bytes and
    writes them atomically (temp name + rename), so a blob is never seen half-written.
    """

    def __init__(self, blob_dir: str, limit: int):
        self.blob_dir = blob_dir
        self.limit = limit
        self._buf = bytearray()

    @property
    def size(self) -> int:
        return len(self._buf)

    def write(self, chunk: bytes) -> None:
        if len(self._buf) + len(chunk) > self.limit:
            raise TooLarge(f"more than {self.limit} bytes")
        self._buf += chunk

    def commit(self) -> str:
        return put_blob(self.blob_dir, bytes(self._buf))

    def discard(self) -> None:
        self._buf = bytearray()
