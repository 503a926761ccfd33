"""EngineConfig declares each option once and builds the flags of every command that makes an engine."""

from __future__ import annotations

import argparse

import pytest
import torch

from vriksha.cli import build_parser
from vriksha.engine.config import EngineConfig
from vriksha.errors import ConfigError

FIELDS = EngineConfig.option_names()  # the serving options and the platform section's


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser()
    EngineConfig.add_arguments(p)
    return p


def engine_dests(p: argparse.ArgumentParser) -> dict[str, argparse.Action]:
    return {a.dest.removeprefix("engine_"): a for a in p._actions if a.dest.removeprefix("engine_") in FIELDS}


def test_every_option_has_one_flag_with_help():
    actions = engine_dests(parser())
    assert sorted(actions) == sorted(FIELDS)
    for name, action in actions.items():
        assert action.help and len(action.help) > 10, f"{name} has no help text"
    flags = {a.option_strings[0] for a in actions.values()}
    assert {"--model", "--kv-cache-memory-gb", "--prefix-caching", "--engine-seed"} <= flags
    assert "--no-prefix-caching" in actions["enable_prefix_caching"].option_strings


def test_only_given_flags_reach_the_config():
    p = parser()
    assert EngineConfig.given_args(p.parse_args([])) == {}
    assert EngineConfig.from_args(p.parse_args([])) == EngineConfig()
    args = p.parse_args(
        ["--kv-cache-memory-gb", "0.5", "--no-prefix-caching", "--max-num-seqs", "4", "--dtype", "bfloat16"]
    )
    cfg = EngineConfig.from_args(args, max_num_seqs=99, fast_linear=False)
    assert (cfg.kv_cache_memory_gb, cfg.enable_prefix_caching, cfg.max_num_seqs, cfg.dtype) == (
        0.5,
        False,
        4,
        "bfloat16",
    )
    assert cfg.platform.fast_linear is False  # a default the caller chose, where no flag was given
    with pytest.raises(SystemExit):
        p.parse_args(["--dtype", "int8"])


@pytest.mark.parametrize(
    "command", [["generate", "--prompt", "x"], ["serve"], ["env", "eval", "arithmetic"], ["train"]]
)
def test_commands_take_the_engine_flags(command):
    args = build_parser().parse_args([*command, "--max-num-batched-tokens", "64", "--no-native-kernels"])
    assert EngineConfig.given_args(args) == {"max_num_batched_tokens": 64, "native_kernels": False}


def test_train_leaves_the_policys_own_options_to_the_model_section():
    with pytest.raises(SystemExit):
        build_parser().parse_args(["train", "--dtype", "bfloat16"])


def test_from_dict_names_unknown_keys_and_wrong_types():
    assert EngineConfig.from_dict({"kv_cache_memory_gb": 1, "max_model_len": None}).kv_cache_memory_gb == 1.0
    with pytest.raises(ConfigError, match="unknown engine option kv_cache_gb; the options are model, "):
        EngineConfig.from_dict({"kv_cache_gb": 1})
    with pytest.raises(ConfigError, match="max_num_seqs must be a int, got 'many'"):
        EngineConfig.from_dict({"max_num_seqs": "many"})
    with pytest.raises(ConfigError, match="fast_linear must be a bool"):
        EngineConfig.from_dict({"fast_linear": 1})


def test_the_platform_section_nested_or_flat_in_files_and_by_name_in_code():
    nested = EngineConfig.from_dict({"platform": {"native_decode": "off"}, "max_num_seqs": 4})
    flat = EngineConfig.from_dict({"native_decode": "off", "max_num_seqs": 4})
    assert nested == flat == EngineConfig.from_flat(native_decode="off", max_num_seqs=4)
    assert nested.platform.native_decode == "off"
    assert nested.to_dict(changed_only=True) == {"max_num_seqs": 4, "platform": {"native_decode": "off"}}
    with pytest.raises(ConfigError, match="native_decode is given twice"):
        EngineConfig.from_dict({"native_decode": "on", "platform": {"native_decode": "off"}})
    with pytest.raises(ConfigError, match="unknown engine option fast;"):
        EngineConfig.from_dict({"platform": {"fast": True}})
    with pytest.raises(ConfigError, match="platform is a section"):
        EngineConfig.from_dict({"platform": "fast"})
    changed = nested.replace(fast_linear=False, max_num_seqs=8)
    assert (changed.platform.native_decode, changed.platform.fast_linear, changed.max_num_seqs) == (
        "off",
        False,
        8,
    )


def test_flags_of_the_platform_section_keep_their_names_and_round_trip():
    p = parser()
    cfg = EngineConfig.from_args(
        p.parse_args(["--native-decode", "off", "--no-fast-linear", "--max-num-seqs", "4"])
    )
    assert (cfg.platform.native_decode, cfg.platform.fast_linear, cfg.max_num_seqs) == ("off", False, 4)
    assert EngineConfig.from_args(p.parse_args(cfg.to_args())) == cfg
    assert EngineConfig.option_path("native_decode") == "platform.native_decode"
    assert EngineConfig.option_path("max_num_seqs") == "max_num_seqs"


def test_to_dict_round_trips_and_lists_only_changes():
    cfg = EngineConfig(kv_cache_memory_gb=0.1, enable_prefix_caching=False)
    assert cfg.to_dict(changed_only=True) == {"kv_cache_memory_gb": 0.1, "enable_prefix_caching": False}
    assert EngineConfig.from_dict(cfg.to_dict()) == cfg


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_kv_cache_tokens_sizes_the_pool_in_tokens_whatever_the_dtype(dtype):
    from tests.tiny_llama import embedded_tokenizer, tiny_llama
    from vriksha.engine.core.llm_engine import LLMEngine

    tok = embedded_tokenizer()
    model = tiny_llama(tok, max_position_embeddings=128).to(dtype).eval()
    engine = LLMEngine(EngineConfig(kv_cache_tokens=300, kv_cache_memory_gb=0.5), model=model, tokenizer=tok)
    assert engine.pool.num_slots == 300
    by_memory = LLMEngine(EngineConfig(kv_cache_memory_gb=0.001), model=model, tokenizer=tok)
    per_token = by_memory.pool.layout.bytes_per_token(by_memory.kv_dtype)
    assert by_memory.pool.num_slots == int(0.001 * 2**30) // per_token


def test_kv_cache_tokens_below_two_is_refused():
    with pytest.raises(ConfigError, match="kv_cache_tokens must be >= 2"):
        EngineConfig(kv_cache_tokens=1)
