"""Content-addressed blob writes: `<blob_dir>/<sha256>`.

`preprocess` has no blob store yet; this is the one place that writes original upload bytes, so
switching to it later is a change here only. Writes go to a temp file and are renamed into
place, so a blob path either holds the full content or does not exist.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
from pathlib import Path


class TooLarge(Exception):
    pass


class BlobWriter:
    """Streamed write with a size limit; `commit()` moves the bytes to their content address."""

    def __init__(self, blob_dir: str, limit: int):
        self.dir = Path(blob_dir)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.limit = limit
        self.size = 0
        self._sha = hashlib.sha256()
        fd, self._tmp = tempfile.mkstemp(dir=self.dir, prefix=".upload-")
        self._f = os.fdopen(fd, "wb")

    def write(self, chunk: bytes) -> None:
        self.size += len(chunk)
        if self.size > self.limit:
            raise TooLarge(f"more than {self.limit} bytes")
        self._sha.update(chunk)
        self._f.write(chunk)

    def commit(self) -> str:
        self._f.close()
        digest = self._sha.hexdigest()
        os.replace(self._tmp, self.dir / digest)
        return digest

    def discard(self) -> None:
        self._f.close()
        Path(self._tmp).unlink(missing_ok=True)


def put_blob(blob_dir: str, data: bytes) -> str:
    """Store `data` under its SHA-256 (a no-op if present); returns the digest."""
    digest = hashlib.sha256(data).hexdigest()
    path = Path(blob_dir) / digest
    if not path.exists():
        w = BlobWriter(blob_dir, len(data) + 1)
        try:
            w.write(data)
            w.commit()
        except BaseException:
            w.discard()
            raise
    return digest
