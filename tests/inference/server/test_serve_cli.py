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
    assert parser(monkeypatch, port=1234).parse_args(["infer", "serve", "--dummy"]).port == 1234
    assert parser(monkeypatch).parse_args(["infer", "serve", "--dummy", "--port", "9"]).dummy == ""


def test_port_required_and_sources_exclusive(monkeypatch, capsys):
    with pytest.raises(SystemExit):
        parser(monkeypatch).parse_args(["infer", "serve", "--dummy"])
    with pytest.raises(SystemExit):  # random weights only when asked for
        parser(monkeypatch).parse_args(["infer", "serve", "--port", "1"])
    with pytest.raises(SystemExit):
        parser(monkeypatch).parse_args(["infer", "serve", "--port", "1", "--model", "a", "--dummy", "b"])


def test_flags_become_the_nested_engine_config(monkeypatch, tmp_path):
    from inference.server.cli import engine_config

    a = parser(monkeypatch).parse_args(
        ["infer", "serve", "--dummy", "--port", "9", "--block-size", "32", "--max-num-seqs", "8", "--kv-cache-dtype", "fp8",
         "--kv-offload-host-gb", "2", "--kv-offload-disk-gb", "0.5", "--kv-offload-disk-url", f"file://{tmp_path}",
         "--kv-offload-min-tokens", "32768", "--enforce-eager"]
    )  # fmt: skip
    cfg = engine_config(a)
    assert cfg.cache.block_size == 32 and cfg.scheduler.max_num_seqs == 8 and cfg.cache.num_state_slots == 32
    assert cfg.kv_cache_dtype == "fp8" and not cfg.enable_cuda_graphs
    t = cfg.cache.tiers
    assert (t.host_bytes, t.disk_bytes, t.disk_url, t.offload_min_tokens) == (
        2 << 30,
        1 << 29,
        f"file://{tmp_path}",
        32768,
    )
    plain = engine_config(parser(monkeypatch).parse_args(["infer", "serve", "--dummy", "--port", "9"]))
    assert not plain.cache.tiers.enabled and plain.kv_cache_dtype == "auto"
