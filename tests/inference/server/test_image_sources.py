"""Where a served image may come from: processed references (shared blob store), data URLs, and
http(s) URLs on an allow-list; each refusal is a clear error. Plus `dayzero infer serve` flags."""

from __future__ import annotations

import base64
import io
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import httpx
import numpy as np
import pytest
import torch
from PIL import Image

from inference.embedded import EmbeddedEngineClient
from inference.engine.factory import build_engine, small_vl_model_config
from inference.server.images import ImageSources
from preprocess import BlobStore, PreprocessConfig, ProcessedCache, process_image

REPO = Path(__file__).resolve().parents[3]


def _png(w: int = 56, h: int = 42) -> bytes:
    buf = io.BytesIO()
    Image.fromarray(np.random.default_rng(1).integers(0, 255, (h, w, 3), dtype=np.uint8)).save(buf, "PNG")
    return buf.getvalue()


PNG = _png()


class _Files(BaseHTTPRequestHandler):
    def log_message(self, *args) -> None:
        pass

    def do_GET(self) -> None:
        if self.path == "/redirect":
            self.send_response(302)
            self.send_header("Location", "/img.png")
            self.end_headers()
            return
        body = PNG if self.path == "/img.png" else b"missing"
        self.send_response(200 if self.path == "/img.png" else 404)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


@pytest.fixture(scope="module")
def files_url():
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), _Files)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()


@pytest.fixture(scope="module")
def blobs(tmp_path_factory):
    return str(tmp_path_factory.mktemp("blobs"))


def _client(**sources) -> EmbeddedEngineClient:
    from inference.server.images import make_image_handler

    engine = build_engine(config=small_vl_model_config())
    client = EmbeddedEngineClient(engine)
    client.images = client.serving.image_handler = make_image_handler(engine, ImageSources(**sources))
    return client


def ask(client, url: str) -> dict:
    content = [{"type": "text", "text": "hi"}, {"type": "image_url", "image_url": {"url": url}}]
    return client.chat({"messages": [{"role": "user", "content": content}], "max_tokens": 2})


def test_references_need_a_blob_store(blobs):
    sha = ProcessedCache(BlobStore(blobs)).process(PNG, PreprocessConfig()).processed_sha256
    client = _client()
    try:
        assert client.images_by_reference is False
        with pytest.raises(ValueError, match="no blob store"):
            ask(client, f"dayzero-processed:{sha}")
    finally:
        client.close()


def test_reference_errors_are_clear(blobs):
    store = BlobStore(blobs)
    other_patch = ProcessedCache(store).process(PNG, PreprocessConfig(patch_size=16)).processed_sha256
    not_processed = store.put(b"just some bytes")
    client = _client(blob_url=blobs)
    try:
        assert client.images_by_reference is True
        with pytest.raises(ValueError, match="no blob"):
            ask(client, "dayzero-processed:" + "0" * 64)
        with pytest.raises(ValueError, match="not a lowercase hex"):
            ask(client, "dayzero-processed:../../etc/passwd")
        with pytest.raises(ValueError, match="not a serialised ProcessedImage"):
            ask(client, f"dayzero-processed:{not_processed}")
        with pytest.raises(ValueError, match=r"this model needs \(3, 14, 14\)"):
            ask(client, f"dayzero-processed:{other_patch}")
    finally:
        client.close()


def test_urls_only_from_allowed_hosts(files_url):
    host_port = files_url.split("//", 1)[1]  # the allow-list names the port (bare hosts: 80/443)
    client = _client(url_allow_hosts=(host_port,), max_fetch_bytes=len(PNG))
    try:
        ok = ask(client, f"{files_url}/img.png")
        assert ok["usage"]["prompt_tokens"] > 6  # 56x42 -> 4x3 patches (padded 4x4) -> 4 tokens
        with pytest.raises(ValueError, match="HTTP 404"):
            ask(client, f"{files_url}/nothing.png")
        with pytest.raises(ValueError, match="HTTP 302"):  # redirects are not followed
            ask(client, f"{files_url}/redirect")
        with pytest.raises(ValueError, match="are not fetched"):
            ask(client, files_url.replace("127.0.0.1", "localhost") + "/img.png")
        client.serving.image_handler.sources = ImageSources(
            url_allow_hosts=(host_port,), max_fetch_bytes=len(PNG) - 1
        )
        with pytest.raises(ValueError, match="larger than"):
            ask(client, f"{files_url}/img.png")
    finally:
        client.close()


def test_server_side_redaction_of_inline_images():
    from tests.preprocess.images import cartoon_face, encode

    face = encode(Image.fromarray(cartoon_face(80)), "PNG")
    url = "data:image/png;base64," + base64.b64encode(face).decode()
    client = _client(redact_faces=True)
    seen = []
    client.images.model.vision_tower.register_forward_pre_hook(lambda _m, args: seen.append(args[0].clone()))
    try:
        ask(client, url)
    finally:
        client.close()
    redacted = process_image(face, PreprocessConfig(redact_faces=True))
    assert redacted.redaction.faces == 1
    assert torch.equal(seen[0], torch.from_numpy(redacted.pixel_values.copy()))
    assert not np.array_equal(redacted.pixel_values, process_image(face, PreprocessConfig()).pixel_values)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_infer_serve_takes_references_from_its_blob_store(tmp_path):
    blob_url = str(tmp_path / "blobs")
    sha = ProcessedCache(BlobStore(blob_url)).process(PNG, PreprocessConfig()).processed_sha256
    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps(small_vl_model_config()))
    port = _free_port()
    log = tmp_path / "serve.log"
    cmd = [sys.executable, "-m", "orchestrator.cli", "infer", "serve", "--dummy", str(cfg), "--device", "cpu"]
    cmd += [
        "--port",
        str(port),
        "--num-blocks",
        "256",
        "--max-model-len",
        "16384",
        "--max-num-seqs",
        "4",
        "--blob-url",
        blob_url,
    ]
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.Popen(
        cmd, cwd=REPO, env=env, stdout=log.open("wb"), stderr=subprocess.STDOUT, start_new_session=True
    )
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while True:
            assert proc.poll() is None, log.read_text()[-3000:]
            assert time.monotonic() < deadline, log.read_text()[-3000:]
            try:
                if httpx.get(f"{base}/health", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.2)

        def post(url: str) -> httpx.Response:
            content = [{"type": "text", "text": "hi"}, {"type": "image_url", "image_url": {"url": url}}]
            body = {"messages": [{"role": "user", "content": content}], "max_tokens": 2}
            return httpx.post(f"{base}/v1/chat/completions", json=body, timeout=60)

        ok = post(f"dayzero-processed:{sha}")
        assert ok.status_code == 200, ok.text
        missing = post("dayzero-processed:" + "1" * 64)
        assert missing.status_code == 400 and "no blob" in missing.json()["error"]["message"]
        remote = post("https://example.com/x.png")  # no --image-url-allow-hosts: nothing is fetched
        assert remote.status_code == 400 and "are not fetched" in remote.json()["error"]["message"]
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=30)


def test_image_urls_go_through_the_ssrf_guard(files_url):
    # Before: the allow-list matched host names only, so with `localhost,127.0.0.1` allowed a
    # request for http://127.0.0.1:5432/x.png connected to PostgreSQL.
    import socket

    from core.netguard import AddressRefused
    from inference.server.images import fetch_image_url

    other = socket.socket()
    other.bind(("127.0.0.1", 0))
    other.listen()
    other.setblocking(False)
    port = other.getsockname()[1]
    try:
        names = ImageSources(url_allow_hosts=("localhost", "127.0.0.1"))
        with pytest.raises(ValueError, match="not fetched"):  # not port 80/443
            fetch_image_url(f"http://127.0.0.1:{port}/x.png", names)
        with pytest.raises(ValueError, match="not fetched"):
            fetch_image_url(f"http://localhost:{port}/x.png", names)
        by_name = ImageSources(url_allow_hosts=(f"localhost:{port}",))
        with pytest.raises(AddressRefused, match=r"loopback|not allow-listed"):  # resolved, then vetted
            fetch_image_url(f"http://localhost:{port}/x.png", by_name)
        with pytest.raises(BlockingIOError):
            other.accept()  # nothing ever connected to the other service
    finally:
        other.close()
    host_port = files_url.split("//", 1)[1]
    assert fetch_image_url(f"{files_url}/img.png", ImageSources(url_allow_hosts=(host_port,))) == PNG
