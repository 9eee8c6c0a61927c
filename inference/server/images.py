"""Images in chat messages -> vision-tower embeddings, for the chat template and the engine.

An image part (`{"type": "image_url", "image_url": {"url": ...}}`) may carry:
* `dayzero-processed:<sha256>`: a documented dayzero extension for deployments that share the
  workers' blob store. The blob is the preprocess workers' `ProcessedImage` (patches, grid, content
  hash, already redacted); it is loaded and verified (its SHA-256 is its name) and fed to the vision
  tower as it is: no second decode, no second preprocessing, the very pixels the workers produced.
* `data:image/...;base64,...` (or bare base64): preprocessed here (redacted first when the
  server was started with --redact-faces / --redact-documents).
* `http(s)://` URLs: fetched only from hosts on the server's allow-list (none by default), through
  the same SSRF guard as the `http_get` tool (`core.netguard`): the allow-list names host and port
  (a bare host means ports 80/443), the name is resolved once and every address vetted (private,
  loopback and link-local ranges refused unless the allow-list names that very address), the
  socket connects to the vetted address (no second DNS answer), no redirects; a byte limit and a
  deadline on the whole exchange. Then preprocessed here.

Rendering a prompt only reads each image and counts its placeholders (`ImageEncoder.__call__`);
`ImageEncoder.encode` then runs the vision tower once for all of the request's images that the
encoder cache (content hash -> embeddings, see `inference.model.multimodal`) does not hold.
"""

from __future__ import annotations

import base64
import binascii
import http.client
import threading
import urllib.parse
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

PROCESSED_URL_PREFIX = "dayzero-processed:"  # the orchestrator's attachments module writes these
DEFAULT_MAX_FETCH_BYTES = 32 * 1024 * 1024


@dataclass(frozen=True, slots=True)
class ImageSources:
    """Where image bytes may come from besides inline data URLs (the server's options)."""

    blob_url: str | None = None  # the shared blob store; None: references are refused
    url_allow_hosts: tuple[str, ...] = ()  # hosts whose http(s) image URLs are fetched
    max_fetch_bytes: int = DEFAULT_MAX_FETCH_BYTES
    fetch_timeout_s: float = 10.0
    # Redaction for the images this server preprocesses itself (data URLs, fetched URLs); images
    # by reference were redacted by the workers already.
    redact_faces: bool = False
    redact_documents: bool = False


@dataclass(frozen=True, slots=True)
class PendingImage:
    """An image read and preprocessed, not yet encoded (what the template carries per image)."""

    content_hash: str
    pixel_values: Any  # np.float32 [P, 3, p, p]
    grid_thw: Any  # np.int64 [1, 3]
    num_tokens: int


def fetch_image_url(url: str, sources: ImageSources) -> bytes:
    """GET an image URL through the SSRF guard; raises ValueError (the request's fault) for a
    refused, failed or oversize fetch."""
    import ssl
    import time

    from core import netguard

    parts = urllib.parse.urlsplit(url)
    try:
        port = parts.port or {"http": 80, "https": 443}.get(parts.scheme)
    except ValueError:
        raise ValueError(f"malformed image URL {url!r}") from None
    if port is None or parts.username is not None or parts.password is not None:
        raise ValueError(f"image URLs must be plain http(s) URLs without credentials, not {url!r}")
    host = (parts.hostname or "").lower()
    allow = netguard.AllowList(sources.url_allow_hosts)
    if not allow.allows(host, port):
        raise ValueError(
            f"image URLs from {host}:{port} are not fetched (allowed: {list(sources.url_allow_hosts) or 'none'}; "
            "a bare host means ports 80/443); send the image inline as a data: URL"
        )
    # An address the allow-list names literally may be private or loopback; nothing else may.
    policy = netguard.AddressPolicy([h for h, _ in allow.rules if netguard.is_ip(h)])
    address = netguard.vetted_addresses(host, port, policy)[0]  # AddressRefused is a ValueError
    timeout = sources.fetch_timeout_s
    deadline = time.monotonic() + timeout
    conn = (
        netguard.PinnedTLSConnection(host, port, address, timeout, ssl.create_default_context())
        if parts.scheme == "https"
        else netguard.PinnedConnection(host, port, address, timeout)
    )
    watchdog = threading.Timer(timeout, netguard.abort_connection, args=(conn,))  # the whole exchange
    watchdog.daemon = True
    watchdog.start()
    limit = sources.max_fetch_bytes
    try:
        target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
        conn.request("GET", target, headers={"Accept-Encoding": "identity", "Connection": "close"})
        resp = conn.getresponse()
        if resp.status != 200:  # redirects included: they are not followed
            raise ValueError(f"fetching the image at {url} gave HTTP {resp.status}")
        body = resp.read(limit + 1)
        if len(body) > limit:
            raise ValueError(f"the image at {url} is larger than {limit} bytes")
        if time.monotonic() >= deadline:
            raise ValueError(f"fetching the image at {url} took longer than {timeout:g} s")
        return body
    except (OSError, http.client.HTTPException) as exc:
        raise ValueError(f"fetching the image at {url} failed: {type(exc).__name__}: {exc}") from None
    finally:
        watchdog.cancel()
        conn.close()


def _data_bytes(src: str) -> bytes:
    if src.startswith("data:"):
        head, _, src = src.partition(",")
        if ";base64" not in head:
            raise ValueError("image data URLs must be base64-encoded")
    try:
        return base64.b64decode(src, validate=True)
    except (binascii.Error, ValueError):
        raise ValueError("the image is not valid base64") from None


def _image_url(part: Mapping[str, Any]) -> str:
    src = part.get("image_url", part.get("image"))
    if isinstance(src, Mapping):
        src = src.get("url")
    if not isinstance(src, str) or not src:
        raise ValueError("an image part needs image_url.url (a data: URL)")
    return src


class ImageEncoder:
    """The chat template's image handler for one vision-language engine (thread-safe)."""

    def __init__(self, engine: Any, sources: ImageSources | None = None) -> None:
        from preprocess import PreprocessConfig

        self.model = engine.runner.model
        self.spec = self.model.spec
        self.sources = sources or ImageSources()
        self.config = PreprocessConfig(
            patch_size=self.spec.vision.patch_size,
            merge_size=self.spec.vision.merge_kernel[0],
            redact_faces=self.sources.redact_faces,
            redact_documents=self.sources.redact_documents,
        )
        self.device = engine.runner.device
        self.dtype = next(self.model.vision_tower.parameters()).dtype
        self._store = None
        self._lock = threading.Lock()

    @property
    def accepts_references(self) -> bool:
        return self.sources.blob_url is not None

    # -- reading one part (while the prompt is rendered) -------------------------------------
    def __call__(self, part: Mapping[str, Any]) -> tuple[int, str, PendingImage]:
        src = _image_url(part)
        if src.startswith(PROCESSED_URL_PREFIX):
            img = self._processed(src[len(PROCESSED_URL_PREFIX) :])
        else:
            img = self._preprocess(
                self._fetch(src) if src.startswith(("http://", "https://")) else _data_bytes(src)
            )
        n = self._tokens(img.grid_thw)
        return n, img.content_hash, PendingImage(img.content_hash, img.pixel_values, img.grid_thw, n)

    def _tokens(self, grid_thw: Any) -> int:
        kh, kw = self.spec.vision.merge_kernel
        return int(sum((h // kh) * (w // kw) for _, h, w in grid_thw.tolist()))

    def _preprocess(self, data: bytes) -> Any:
        from preprocess import ImageError, process_image

        try:
            return process_image(data, self.config)
        except ImageError as exc:
            raise ValueError(f"image rejected: {exc}") from None

    def _processed(self, sha: str) -> Any:
        from preprocess import BlobCorruptError, BlobNotFoundError, BlobStore, ProcessedImage

        if self.sources.blob_url is None:
            raise ValueError(
                "this server has no blob store: processed-image references are not accepted "
                "(start it with --blob-url, or send the image as a data: URL)"
            )
        with self._lock:
            if self._store is None:
                self._store = BlobStore(self.sources.blob_url)
        try:
            img = ProcessedImage.from_bytes(self._store.get(sha))
        except (BlobNotFoundError, BlobCorruptError, ValueError) as exc:
            raise ValueError(f"processed image {sha!r}: {exc}") from None
        p = self.config.patch_size
        shape = tuple(img.pixel_values.shape)
        if len(shape) != 4 or shape[1:] != (3, p, p):
            raise ValueError(f"processed image {sha} has patches {shape[1:]}, this model needs (3, {p}, {p})")
        kh, kw = self.spec.vision.merge_kernel
        if any(h % kh or w % kw for _, h, w in img.grid_thw.tolist()):
            raise ValueError(
                f"processed image {sha}: its grid is not divisible by the merge kernel {kh}x{kw}"
            )
        return img

    def _fetch(self, url: str) -> bytes:
        return fetch_image_url(url, self.sources)

    # -- encoding (after rendering: one tower call for the request) ---------------------------
    def encode(self, pending: Sequence[PendingImage]) -> list[torch.Tensor]:
        from inference.model.multimodal import ImageInput

        inputs = [
            ImageInput(
                p.content_hash,
                torch.as_tensor(p.pixel_values.copy()).to(device=self.device, dtype=self.dtype),
                torch.as_tensor(p.grid_thw).to(self.device),
            )
            for p in pending
        ]
        with torch.inference_mode():
            return self.model.encode_images_cached(inputs)


def make_image_handler(engine: Any, sources: ImageSources | None = None) -> ImageEncoder | None:
    """The handler for this engine's model, or None if the model has no vision tower."""
    model = engine.runner.model
    spec = getattr(model, "spec", None)
    if spec is None or spec.vision is None or not hasattr(model, "encode_images_cached"):
        return None
    return ImageEncoder(engine, sources)  # the image token is checked where the engine is built
