"""`http_get`: SSRF attempts are refused before any connection; the allowed case hits 127.0.0.1.

Every test uses `no_outside_network`: a connection to a non-loopback address fails the test, and
DNS answers come from the test, so nothing leaves the machine.
"""

from __future__ import annotations

import contextlib
import shutil
import socket
import ssl
import subprocess
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

import pytest

from tools.base import InvalidArgumentsError, PermanentToolError, ToolContext, ToolTimeoutError
from tools.builtin.http_get import HostNotAllowedError, HttpGetTool
from tools.config import HttpConfig
from tools.netguard import AddressPolicy, AddressRefusedError
from tools.registry import ToolRegistry


class Handler(BaseHTTPRequestHandler):
    def log_message(self, *args: object) -> None:
        pass

    def do_GET(self) -> None:
        url = urlsplit(self.path)
        q = parse_qs(url.query)
        if url.path == "/ok":
            self._send(200, b"hello from loopback", "text/plain; charset=utf-8")
        elif url.path == "/host":
            self._send(200, self.headers["Host"].encode(), "text/plain")
        elif url.path == "/redirect":
            self.send_response(302)
            self.send_header("Location", q["to"][0])
            self.send_header("Content-Length", "0")
            self.end_headers()
        elif url.path == "/big":
            self._send(200, b"x" * 5_000_000, "application/octet-stream")
        elif url.path == "/slow":
            self.send_response(200)
            self.send_header("Content-Type", "text/plain")
            self.end_headers()
            for _ in range(30):
                time.sleep(0.1)
                try:
                    self.wfile.write(b"x")
                    self.wfile.flush()
                except OSError:
                    return
        elif url.path == "/slow-headers":
            self.send_response(200)
            self.flush_headers()  # the status line now, then one header line at a time
            for i in range(40):
                time.sleep(0.05)
                try:
                    self.wfile.write(f"X-Slow-{i}: y\r\n".encode())
                    self.wfile.flush()
                except OSError:
                    return
            self.end_headers()
        elif url.path in ("/short", "/stall"):
            self.send_response(200)
            self.send_header("Content-Type", "text/plain")
            self.send_header("Content-Length", "100")
            self.end_headers()
            self.wfile.write(b"x" * 10)
            self.wfile.flush()
            if url.path == "/stall":
                time.sleep(3)  # past the tool's deadline: the body stops at 10 of 100 bytes
        else:
            self._send(404, b"nope", "text/plain")

    def _send(self, status: int, body: bytes, ctype: str) -> None:
        self.send_response(status)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        with contextlib.suppress(OSError):  # the client stopped reading at its cap
            self.wfile.write(body)


@pytest.fixture(scope="module")
def server() -> Iterator[int]:
    srv = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    srv.daemon_threads = True
    t = threading.Thread(target=srv.serve_forever, daemon=True)
    t.start()
    yield srv.server_address[1]
    srv.shutdown()
    srv.server_close()


def tool(*hosts: str, networks: tuple[str, ...] = (), **kw: object) -> HttpGetTool:
    return HttpGetTool(HttpConfig(allow_hosts=hosts, allow_networks=networks, **kw))  # type: ignore[arg-type]


def test_allowed_local_server(no_outside_network, server: int, ctx: ToolContext) -> None:  # type: ignore[no-untyped-def]
    t = tool(f"127.0.0.1:{server}", networks=("127.0.0.1/32",))
    out = ToolRegistry([t]).execute("http_get", {"url": f"http://127.0.0.1:{server}/ok"}, ctx).content
    assert out["status"] == 200
    assert out["body"] == "hello from loopback"
    assert out["body_encoding"] == "text" and not out["truncated"]
    assert no_outside_network.connections == [("127.0.0.1", server)]


def test_loopback_refused_unless_allow_listed(no_outside_network, server: int, ctx: ToolContext) -> None:  # type: ignore[no-untyped-def]
    t = tool(f"127.0.0.1:{server}")  # host on the list, but loopback not opened by allow_networks
    with pytest.raises(AddressRefusedError, match="loopback"):
        t.run({"url": f"http://127.0.0.1:{server}/ok"}, ctx)
    assert no_outside_network.connections == []


@pytest.mark.parametrize(
    "host",
    [
        pytest.param("10.0.0.1", id="rfc1918-10"),
        pytest.param("172.16.5.4", id="rfc1918-172"),
        pytest.param("192.168.1.1", id="rfc1918-192"),
        pytest.param("169.254.169.254", id="metadata"),
        pytest.param("100.100.100.200", id="alibaba-metadata"),
        pytest.param("100.64.0.1", id="cgnat"),
        pytest.param("127.0.0.1", id="loopback"),
        pytest.param("127.1.2.3", id="loopback-range"),
        pytest.param("0.0.0.0", id="unspecified"),
        pytest.param("224.0.0.1", id="multicast"),
        pytest.param("240.0.0.1", id="reserved"),
        pytest.param("255.255.255.255", id="broadcast"),
        pytest.param("[::1]", id="ipv6-loopback"),
        pytest.param("[::]", id="ipv6-unspecified"),
        pytest.param("[fe80::1]", id="ipv6-link-local"),
        pytest.param("[fc00::1]", id="ipv6-ula"),
        pytest.param("[fd00:ec2::254]", id="aws-ipv6-metadata"),
        pytest.param("[::ffff:127.0.0.1]", id="ipv4-mapped-loopback"),
        pytest.param("[::ffff:169.254.169.254]", id="ipv4-mapped-metadata"),
        pytest.param("[::ffff:a00:1]", id="ipv4-mapped-hex"),
        pytest.param("[::127.0.0.1]", id="ipv4-compatible"),
        pytest.param("[64:ff9b::a9fe:a9fe]", id="nat64-metadata"),
        pytest.param("[2002:a9fe:a9fe::1]", id="6to4-metadata"),
        pytest.param("[2001:0:4136:e378:8000:63bf:f5ff:fffe]", id="teredo-to-10.0.0.1"),
    ],
)
def test_private_and_special_addresses_refused(no_outside_network, ctx: ToolContext, host: str) -> None:  # type: ignore[no-untyped-def]
    bare = host.strip("[]")
    t = tool(host if host.startswith("[") else bare)
    with pytest.raises(AddressRefusedError) as ei:
        t.run({"url": f"http://{host}/latest/meta-data/"}, ctx)
    assert ei.value.to_dict()["kind"] == "permanent"
    assert no_outside_network.connections == []


def test_metadata_refused_even_when_private_networks_are_open(no_outside_network, ctx: ToolContext) -> None:  # type: ignore[no-untyped-def]
    t = tool("169.254.169.254", networks=("10.0.0.0/8", "127.0.0.0/8"))
    with pytest.raises(AddressRefusedError, match="link-local"):
        t.run({"url": "http://169.254.169.254/latest/meta-data/"}, ctx)
    with pytest.raises(ValueError, match="link-local"):
        AddressPolicy(("0.0.0.0/0",))  # cannot be opened by configuration
    assert no_outside_network.connections == []


@pytest.mark.parametrize(
    "answers",
    [
        pytest.param(["10.1.2.3"], id="private"),
        pytest.param(["169.254.169.254"], id="metadata"),
        pytest.param(["127.0.0.1"], id="loopback"),
        pytest.param(["::1"], id="ipv6-loopback"),
        pytest.param(["::ffff:192.168.0.1"], id="ipv4-mapped"),
        pytest.param(["93.184.216.34", "10.0.0.7"], id="mixed-answer"),
    ],
)
def test_dns_names_resolving_to_refused_addresses(
    no_outside_network, ctx: ToolContext, answers: list[str]
) -> None:  # type: ignore[no-untyped-def]
    no_outside_network.dns["evil.example.com"] = answers
    t = tool("evil.example.com")
    with pytest.raises(AddressRefusedError, match="refused to connect"):
        t.run({"url": "https://evil.example.com/"}, ctx)
    assert no_outside_network.lookups == ["evil.example.com"]
    assert no_outside_network.connections == []


def test_decimal_ip_host_is_judged_by_its_address(no_outside_network, ctx: ToolContext) -> None:  # type: ignore[no-untyped-def]
    no_outside_network.dns["2130706433"] = ["127.0.0.1"]  # what libc makes of http://2130706433/
    with pytest.raises(AddressRefusedError, match="loopback"):
        tool("2130706433").run({"url": "http://2130706433/"}, ctx)
    assert no_outside_network.connections == []


def test_public_address_passes_vetting_without_connecting(no_outside_network) -> None:  # type: ignore[no-untyped-def]
    no_outside_network.dns["example.org"] = ["93.184.216.34", "2606:2800:220:1:248:1893:25c8:1946"]
    scheme, host, port, target, addrs = tool("example.org").check_url("https://example.org/a?b=1")
    assert (scheme, host, port, target) == ("https", "example.org", 443, "/a?b=1")
    assert [str(a) for a in addrs] == ["93.184.216.34", "2606:2800:220:1:248:1893:25c8:1946"]
    assert no_outside_network.connections == []


def test_host_not_on_allow_list_refused_before_dns(no_outside_network, ctx: ToolContext) -> None:  # type: ignore[no-untyped-def]
    t = tool("example.org", "*.docs.example.org")
    for url in (
        "http://example.com/",
        "http://example.org:8080/",  # bare entries allow 80/443 only
        "http://docs.example.org/",  # "*." matches subdomains, not the apex
        "http://example.org.evil.com/",
    ):
        with pytest.raises(HostNotAllowedError):
            t.run({"url": url}, ctx)
    assert no_outside_network.lookups == [] and no_outside_network.connections == []
    assert t.allow.allows("api.docs.example.org", 443)


def test_schemes_and_credentials_refused(no_outside_network, ctx: ToolContext) -> None:  # type: ignore[no-untyped-def]
    t = tool("example.org")
    reg = ToolRegistry([t])
    for url in ("file:///etc/passwd", "gopher://example.org/", "ftp://example.org/"):
        with pytest.raises(InvalidArgumentsError):
            reg.execute("http_get", {"url": url}, ctx)
    with pytest.raises(InvalidArgumentsError, match="control characters"):
        t.run({"url": "http://example.org/a\r\nX-Injected: 1"}, ctx)
    with pytest.raises(AddressRefusedError, match="credentials"):
        t.run({"url": "http://user:pw@example.org/"}, ctx)
    assert no_outside_network.connections == []


def test_redirects_are_rechecked_each_hop(no_outside_network, server: int, ctx: ToolContext) -> None:  # type: ignore[no-untyped-def]
    no_outside_network.dns["internal.example.com"] = ["10.0.0.5"]
    t = tool(f"127.0.0.1:{server}", "169.254.169.254", "internal.example.com", networks=("127.0.0.1/32",))
    base = f"http://127.0.0.1:{server}"
    for target, err in (
        ("http://169.254.169.254/latest/meta-data/", AddressRefusedError),
        ("http://internal.example.com/admin", AddressRefusedError),
        ("http://not-listed.example.net/", HostNotAllowedError),
        ("file:///etc/passwd", AddressRefusedError),
        ("http://[::ffff:10.0.0.1]/", HostNotAllowedError),
    ):
        no_outside_network.connections.clear()
        with pytest.raises(err):
            t.run({"url": f"{base}/redirect?to={target}"}, ctx)
        assert no_outside_network.connections == [("127.0.0.1", server)]  # only the first hop connected


def test_allowed_redirect_is_followed(no_outside_network, server: int, ctx: ToolContext) -> None:  # type: ignore[no-untyped-def]
    t = tool(f"127.0.0.1:{server}", networks=("127.0.0.1/32",))
    out = t.run({"url": f"http://127.0.0.1:{server}/redirect?to=/ok"}, ctx).content
    assert out["status"] == 200 and out["body"] == "hello from loopback"
    assert out["redirects"] == [f"http://127.0.0.1:{server}/redirect?to=/ok"]
    assert out["url"] == f"http://127.0.0.1:{server}/ok"


def test_redirect_loop_is_capped(no_outside_network, server: int, ctx: ToolContext) -> None:  # type: ignore[no-untyped-def]
    t = tool(f"127.0.0.1:{server}", networks=("127.0.0.1/32",), max_redirects=2)
    loop = "/redirect?to=/redirect%3Fto%3D/redirect%253Fto%253D/ok"
    with pytest.raises(Exception, match="more than 2 redirects"):
        t.run({"url": f"http://127.0.0.1:{server}{loop}"}, ctx)


def test_dns_is_resolved_once_per_hop_no_rebinding(no_outside_network, server: int, ctx: ToolContext) -> None:  # type: ignore[no-untyped-def]
    answers = iter([["127.0.0.1"], ["10.0.0.1"], ["10.0.0.1"]])
    real = no_outside_network.dns

    class Rebinding(dict):
        def __contains__(self, key: object) -> bool:
            return key == "svc.test"

        def __getitem__(self, key: str) -> list[str]:
            return next(answers)

    no_outside_network.dns = Rebinding()
    t = tool(f"svc.test:{server}", networks=("127.0.0.1/32",))
    out = t.run({"url": f"http://svc.test:{server}/host"}, ctx).content
    assert out["body"] == f"svc.test:{server}"  # the Host header names the host, the socket the vetted IP
    assert no_outside_network.lookups == ["svc.test"]
    assert no_outside_network.connections == [("127.0.0.1", server)]
    no_outside_network.dns = real


def test_response_size_is_capped(no_outside_network, server: int, ctx: ToolContext) -> None:  # type: ignore[no-untyped-def]
    t = tool(f"127.0.0.1:{server}", networks=("127.0.0.1/32",), max_bytes=1000)
    out = t.run({"url": f"http://127.0.0.1:{server}/big"}, ctx).content
    assert out["truncated"] is True and out["body_encoding"] == "base64"
    import base64

    assert len(base64.b64decode(out["body"])) == 1000


def test_response_time_is_capped(no_outside_network, server: int, ctx: ToolContext) -> None:  # type: ignore[no-untyped-def]
    t = tool(f"127.0.0.1:{server}", networks=("127.0.0.1/32",), timeout_s=0.5)
    t0 = time.monotonic()
    with pytest.raises(ToolTimeoutError):
        t.run({"url": f"http://127.0.0.1:{server}/slow"}, ctx)  # trickles a byte every 0.1 s
    assert time.monotonic() - t0 < 2.0


def test_trickled_headers_hit_the_deadline(no_outside_network, server: int, ctx: ToolContext) -> None:  # type: ignore[no-untyped-def]
    t = tool(f"127.0.0.1:{server}", networks=("127.0.0.1/32",), timeout_s=0.5)
    t0 = time.monotonic()
    with pytest.raises(ToolTimeoutError):
        t.run({"url": f"http://127.0.0.1:{server}/slow-headers"}, ctx)  # a header line every 0.05 s
    assert time.monotonic() - t0 < 1.5


def test_the_guard_itself_fails_outside_traffic() -> None:
    """The autouse guard is what makes 'refused before any connection' observable."""
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        with pytest.raises(pytest.fail.Exception, match="non-loopback"):
            s.sendto(b"x", ("192.0.2.1", 9))  # TEST-NET-1; never actually sent
    finally:
        s.close()
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        with pytest.raises(pytest.fail.Exception, match="non-loopback"):
            s.connect(("192.0.2.1", 80))
    finally:
        s.close()


def test_disabled_without_allow_list() -> None:
    with pytest.raises(ValueError, match="allow-list"):
        HttpGetTool(HttpConfig())


def _make_certs(d: Path) -> tuple[Path, Path, Path]:
    """A throw-away CA and a server certificate for svc.test, made with the openssl CLI."""
    ca_key, ca_crt, key, csr, crt, ext = (
        d / n for n in ("ca.key", "ca.crt", "s.key", "s.csr", "s.crt", "ext")
    )
    ext.write_text("subjectAltName=DNS:svc.test\nbasicConstraints=CA:FALSE\n")
    ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]
    for cmd in (
        [
            "req",
            "-x509",
            *ec,
            "-keyout",
            ca_key,
            "-out",
            ca_crt,
            "-days",
            "2",
            "-subj",
            "/CN=dayzero test CA",
        ],
        ["req", *ec, "-keyout", key, "-out", csr, "-subj", "/CN=svc.test"],
        [
            "x509",
            "-req",
            "-in",
            csr,
            "-CA",
            ca_crt,
            "-CAkey",
            ca_key,
            "-CAcreateserial",
            "-out",
            crt,
            "-days",
            "2",
        ],
    ):
        extra = ["-extfile", str(ext)] if cmd[0] == "x509" else []
        subprocess.run(["openssl", *map(str, cmd), *extra], check=True, capture_output=True, timeout=30)
    return ca_crt, crt, key


@pytest.fixture(scope="module")
def tls_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[int, Path]]:
    if not shutil.which("openssl"):
        pytest.skip("the openssl CLI is needed to make test certificates")
    ca, crt, key = _make_certs(tmp_path_factory.mktemp("certs"))
    srv = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    srv.daemon_threads = True
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.load_cert_chain(crt, key)
    srv.socket = ctx.wrap_socket(srv.socket, server_side=True)
    t = threading.Thread(target=srv.serve_forever, daemon=True)
    t.start()
    yield srv.server_address[1], ca
    srv.shutdown()
    srv.server_close()


def test_https_to_the_vetted_address_verifies_the_host_name(
    no_outside_network, tls_server, ctx: ToolContext
) -> None:  # type: ignore[no-untyped-def]
    port, ca = tls_server
    no_outside_network.dns["svc.test"] = ["127.0.0.1"]
    no_outside_network.dns["other.test"] = ["127.0.0.1"]
    t = tool(f"svc.test:{port}", f"other.test:{port}", networks=("127.0.0.1/32",), ca_file=str(ca))
    out = t.run({"url": f"https://svc.test:{port}/ok"}, ctx).content
    assert out["status"] == 200 and out["body"] == "hello from loopback"
    # same vetted address, a name the certificate does not carry: refused, and not retryable
    with pytest.raises(PermanentToolError, match="certificate"):
        t.run({"url": f"https://other.test:{port}/ok"}, ctx)
    # without the test CA the system store does not trust it either
    with pytest.raises(PermanentToolError, match="certificate"):
        tool(f"svc.test:{port}", networks=("127.0.0.1/32",)).run({"url": f"https://svc.test:{port}/ok"}, ctx)


def test_a_body_cut_short_is_never_reported_whole(no_outside_network, server: int, ctx: ToolContext) -> None:  # type: ignore[no-untyped-def]
    # Before: a body cut by the deadline (or by the server) came back as `truncated: false`.
    t = tool(f"127.0.0.1:{server}", networks=("127.0.0.1/32",), timeout_s=0.5)
    out = t.run({"url": f"http://127.0.0.1:{server}/short"}, ctx).content
    assert (out["body"], out["truncated"]) == ("x" * 10, True)
    with pytest.raises(ToolTimeoutError):
        t.run({"url": f"http://127.0.0.1:{server}/stall"}, ctx)
