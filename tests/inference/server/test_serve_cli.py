"""`infer serve` argument parsing (the server itself is exercised in test_server_http)."""

import argparse

import pytest

from inference.server.cli import register_infer


def parser(monkeypatch, port=None):
    if port is None:
        monkeypatch.delenv("DAYZERO_INFERENCE_PORT", raising=False)
    else:
        monkeypatch.setenv("DAYZERO_INFERENCE_PORT", str(port))
    p = argparse.ArgumentParser()
    register_infer(p.add_subparsers(dest="command", required=True))
    return p


def test_serve_args(monkeypatch):
    a = parser(monkeypatch).parse_args(
        ["infer", "serve", "--dummy", "cfg.json", "--port", "9", "--no-prefix-caching"]
    )
    assert a.dummy == "cfg.json" and a.port == 9 and a.no_prefix_caching and a.func.__name__ == "_serve"
    assert parser(monkeypatch, port=1234).parse_args(["infer", "serve"]).port == 1234


def test_port_required_and_sources_exclusive(monkeypatch, capsys):
    with pytest.raises(SystemExit):
        parser(monkeypatch).parse_args(["infer", "serve"])
    with pytest.raises(SystemExit):
        parser(monkeypatch).parse_args(["infer", "serve", "--port", "1", "--model", "a", "--dummy", "b"])
