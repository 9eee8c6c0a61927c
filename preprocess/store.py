"""Content-addressed blobs on any fsspec filesystem (a local directory by default).

Layout under the root URL:
  sha256/ab/cd/<sha256>        immutable blobs, named by the SHA-256 of their bytes
  refs/<namespace>/<key>       small text files holding a blob's sha256 (the processed-result index)

Writes go to a temporary name and are renamed into place, so a reader never sees half a blob and
two workers writing the same content race harmlessly (same name, same bytes). Reads verify the hash.
"""

from __future__ import annotations

import hashlib
import re
import uuid

import fsspec

DEFAULT_BLOB_URL = "./.dayzero/blobs"  # the orchestrator's DAYZERO_BLOB_DIR default
_HEX64 = re.compile(r"^[0-9a-f]{64}$")
_REF_KEY = re.compile(r"^[A-Za-z0-9._-]{1,200}$")


class BlobNotFoundError(KeyError):
    """No blob with that hash under this store's root."""


class BlobCorruptError(RuntimeError):
    """A stored blob's bytes no longer hash to its name."""


def sha256_hex(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


class BlobStore:
    """`put(bytes) -> sha256`, `get(sha256) -> bytes`, plus named refs for indexes."""

    def __init__(self, url: str = DEFAULT_BLOB_URL, **storage_options: object) -> None:
        self.url = url
        self.fs, root = fsspec.core.url_to_fs(url, **storage_options)
        self.root = root.rstrip("/")
        self._local = "file" in (
            self.fs.protocol if isinstance(self.fs.protocol, tuple) else (self.fs.protocol,)
        )
        self.fs.makedirs(self.root, exist_ok=True)

    def _blob_path(self, sha: str) -> str:
        if not _HEX64.match(sha):
            raise ValueError(f"not a lowercase hex SHA-256: {sha!r}")
        return f"{self.root}/sha256/{sha[:2]}/{sha[2:4]}/{sha}"

    def _ref_path(self, namespace: str, key: str) -> str:
        for part in (namespace, key):
            if not _REF_KEY.match(part):
                raise ValueError(f"ref names use [A-Za-z0-9._-] only, got {part!r}")
        return f"{self.root}/refs/{namespace}/{key}"

    def _write_atomic(self, path: str, data: bytes) -> None:
        parent = path.rsplit("/", 1)[0]
        self.fs.makedirs(parent, exist_ok=True)
        if not self._local:
            self.fs.pipe_file(path, data)  # object stores: a PUT is atomic already
            return
        tmp = f"{path}.tmp-{uuid.uuid4().hex}"
        self.fs.pipe_file(tmp, data)
        self.fs.mv(tmp, path)

    def put(self, data: bytes) -> str:
        sha = sha256_hex(data)
        path = self._blob_path(sha)
        if not self.fs.exists(path):
            self._write_atomic(path, bytes(data))
        return sha

    def get(self, sha: str) -> bytes:
        path = self._blob_path(sha)
        try:
            data = self.fs.cat_file(path)
        except FileNotFoundError:
            raise BlobNotFoundError(f"no blob {sha} under {self.url}") from None
        if sha256_hex(data) != sha:
            raise BlobCorruptError(f"blob {sha} under {self.url} is corrupt (its bytes hash differently)")
        return data

    def exists(self, sha: str) -> bool:
        return self.fs.exists(self._blob_path(sha))

    def set_ref(self, namespace: str, key: str, sha: str) -> None:
        self._blob_path(sha)  # validates
        self._write_atomic(self._ref_path(namespace, key), sha.encode())

    def get_ref(self, namespace: str, key: str) -> str | None:
        try:
            sha = self.fs.cat_file(self._ref_path(namespace, key)).decode().strip()
        except FileNotFoundError:
            return None
        return sha if _HEX64.match(sha) else None
