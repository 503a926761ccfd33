"""rollout.engine is an EngineConfig: config files keep loading, unknown keys are named, flags override."""

from __future__ import annotations

from pathlib import Path

import pytest

from vriksha.cli import build_parser
from vriksha.engine.config import EngineConfig
from vriksha.errors import ConfigError
from vriksha.train.config import TrainConfig, engine_overrides, load_config

CONFIGS = sorted((Path(__file__).resolve().parents[2] / "configs").glob("*.yaml"))


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.name)
def test_shipped_configs_give_an_engine_config(path):
    cfg = load_config(path)
    assert isinstance(cfg.rollout.engine, EngineConfig)
    again = TrainConfig.from_dict(cfg.to_dict())
    assert again.rollout.engine == cfg.rollout.engine


def test_engine_section_values_and_errors(tmp_path):
    cfg = load_config(None, ["rollout.engine.kv_cache_memory_gb=0.1", "rollout.engine.max_num_seqs=8"])
    assert (cfg.rollout.engine.kv_cache_memory_gb, cfg.rollout.engine.max_num_seqs) == (0.1, 8)
    assert cfg.to_dict()["rollout"]["engine"] == {"kv_cache_memory_gb": 0.1, "max_num_seqs": 8}
    with pytest.raises(ConfigError, match=r"rollout\.engine: .*unknown engine option kv_cache_gb"):
        load_config(None, ["rollout.engine.kv_cache_gb=0.1"])
    with pytest.raises(ConfigError, match=r"rollout\.engine.*model\.dtype"):
        load_config(None, ["rollout.engine.dtype=bfloat16"])


def test_train_engine_flags_override_the_file(tmp_path):
    y = tmp_path / "a.yaml"
    y.write_text("rollout:\n  engine: {kv_cache_memory_gb: 0.2, max_num_seqs: 16}\n")
    args = build_parser().parse_args(["train", str(y), "--kv-cache-memory-gb", "0.05", "--no-prefix-caching"])
    cfg = load_config(args.config, args.overrides + engine_overrides(EngineConfig.given_args(args)))
    engine = cfg.rollout.engine
    assert (engine.kv_cache_memory_gb, engine.max_num_seqs, engine.enable_prefix_caching) == (0.05, 16, False)


def test_train_engine_flags_override_the_files_platform_section(tmp_path):
    y = tmp_path / "a.yaml"
    y.write_text("rollout:\n  engine: {platform: {native_decode: 'off', fast_linear: true}}\n")
    args = build_parser().parse_args(["train", str(y), "--no-fast-linear"])
    cfg = load_config(args.config, args.overrides + engine_overrides(EngineConfig.given_args(args)))
    platform = cfg.rollout.engine.platform
    assert (platform.native_decode, platform.fast_linear) == ("off", False)
