"""EngineConfig nests the cache and scheduler configs: each setting lives in one of them and
`of`/`evolve` route a setting by name to the config that owns it."""

import pytest

from inference.cache.coordinator import CacheConfig
from inference.cache.tiers import TierConfig
from inference.engine.engine import EngineConfig
from inference.engine.scheduler import SchedulerConfig


def test_settings_route_to_their_owner():
    cfg = EngineConfig.of(
        block_size=32, max_num_seqs=7, enable_cuda_graphs=False, tiers=TierConfig(host_bytes=1)
    )
    assert cfg.cache == CacheConfig(block_size=32, tiers=TierConfig(host_bytes=1))
    assert cfg.scheduler == SchedulerConfig(max_num_seqs=7)
    assert cfg.enable_cuda_graphs is False
    again = cfg.evolve(max_model_len=1000)
    assert (
        again.scheduler.max_model_len == 1000
        and again.cache == cfg.cache
        and cfg.scheduler.max_model_len == 8192
    )


def test_no_setting_is_restated():
    own = set(EngineConfig.__dataclass_fields__)
    nested = set(CacheConfig.__dataclass_fields__) | set(SchedulerConfig.__dataclass_fields__)
    assert not own & nested


def test_unknown_setting_and_bad_kv_dtype_are_refused():
    with pytest.raises(TypeError, match="no engine, cache or scheduler setting named 'blok_size'"):
        EngineConfig.of(blok_size=8)
    with pytest.raises(ValueError, match="kv_cache_dtype"):
        EngineConfig.of(kv_cache_dtype="int4")
