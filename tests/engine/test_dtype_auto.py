"""The engine's dtype: `auto` (the default) is the model's own numbers, float32 on the CPU, never measured;
`fastest` measures fp32 against bf16 (and fp16 where sensible) on the model's own shapes, keeps the faster,
caches the measurement per machine, and reports what it chose and the CPU flags it saw."""

from __future__ import annotations

import json
import math

import pytest
import torch

import vriksha.device as devices
from vriksha import fast_dtype
from vriksha.cpu_features import _read_cpuinfo, cpu_features, hidden_above
from vriksha.engine.config import EngineConfig
from vriksha.errors import ConfigError

SHAPES = [
    fast_dtype.LinearShape(96, 64, 4),
    fast_dtype.LinearShape(64, 160, 2),
    fast_dtype.LinearShape(512, 64, 1, prefill=False),
]


pytestmark = pytest.mark.usefixtures("measured_auto")


@pytest.fixture
def measured_auto(monkeypatch):
    """auto and fastest resolve here as for a user (the suite pins them to fp32 elsewhere, tests/conftest.py)."""
    monkeypatch.delenv("VRIKSHA_DTYPE", raising=False)


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("VRIKSHA_CACHE", str(tmp_path))
    return tmp_path / fast_dtype.CACHE_FILE


def test_the_choice_is_the_faster_dtype_as_measured(cache):
    choice = fast_dtype.choose_dtype(SHAPES, devices.host())
    assert choice.how == "measured" and choice.requested == "fastest"
    timings = choice.timings
    assert set(timings) == set(fast_dtype.candidates(devices.host())) >= {"float32", "bfloat16"}
    for t in timings.values():
        assert t["decode_s"] > 0 and t["prefill_s"] > 0 and math.isfinite(t["decode_s"] + t["prefill_s"])
    rel = fast_dtype.relative_times(timings)
    assert rel["float32"] == pytest.approx(1.0)
    if choice.dtype == torch.float32:  # nothing else saved the margin
        assert all(v >= 1.0 - fast_dtype.MARGIN for v in rel.values())
    else:  # the chosen one was measured faster than fp32, by the margin
        assert rel[choice.name] < 1.0 - fast_dtype.MARGIN
        assert rel[choice.name] == min(rel.values())


def test_the_measurement_is_cached_per_machine_and_shapes(cache):
    first = fast_dtype.choose_dtype(SHAPES, devices.host())
    stamp = cache.stat().st_mtime_ns
    again = fast_dtype.choose_dtype(SHAPES, devices.host())
    assert again.how == "cached" and (again.dtype, again.timings) == (first.dtype, first.timings)
    assert cache.stat().st_mtime_ns == stamp  # read, not rewritten
    (key,) = json.loads(cache.read_text())
    assert cpu_features().signature in key and torch.__version__ in key
    other = fast_dtype.choose_dtype(SHAPES[:1], devices.host())  # other shapes: measured anew
    assert other.how == "measured" and len(json.loads(cache.read_text())) == 2
    assert fast_dtype.choose_dtype(SHAPES, devices.host(), refresh=True).how == "measured"


def test_the_choice_follows_the_cached_measurement(cache):
    """The dtype comes from the measured times: a record whose times favour bf16 gives bf16."""
    fast_dtype.choose_dtype(SHAPES, devices.host())
    known = json.loads(cache.read_text())
    (key,) = known
    known[key]["timings"] = {
        "float32": {"decode_s": 1.0, "prefill_s": 1.0},
        "bfloat16": {"decode_s": 0.5, "prefill_s": 0.2},
    }
    known[key]["dtype"] = fast_dtype.pick(known[key]["timings"])
    cache.write_text(json.dumps(known))
    choice = fast_dtype.choose_dtype(SHAPES, devices.host())
    assert choice.how == "cached" and choice.dtype == torch.bfloat16
    assert (
        fast_dtype.pick(
            {"float32": {"decode_s": 1, "prefill_s": 1}, "bfloat16": {"decode_s": 0.95, "prefill_s": 0.97}}
        )
        == "float32"
    )


def test_linear_shapes_of_a_model_on_the_meta_device(default_tokenizer):
    from tests.tiny_llama import tiny_llama

    with torch.device("meta"):
        model = tiny_llama(default_tokenizer)
    shapes = {(s.out_features, s.in_features): s for s in fast_dtype.linear_shapes(model)}
    assert shapes[(64, 64)].count == 4  # q and o of two layers
    assert shapes[(32, 64)].count == 4  # k and v (2 KV heads x 16)
    assert shapes[(128, 64)].count == 4 and shapes[(64, 128)].count == 2
    head = shapes[(len(default_tokenizer), 64)]
    assert head.count == 1 and head.prefill is False


def test_cpuinfo_flags_are_read_on_x86_and_arm():
    x86 = "processor : 0\nmodel name : Some Xeon\nflags : fpu avx2 fma avx512f amx_bf16\n\nprocessor : 1\n"
    assert _read_cpuinfo(x86) == ("Some Xeon", frozenset({"fpu", "avx2", "fma", "avx512f", "amx_bf16"}))
    arm = "processor : 0\nFeatures : fp asimd bf16 i8mm\nCPU part : 0xd4f\n"
    assert _read_cpuinfo(arm)[1] == frozenset({"fp", "asimd", "bf16", "i8mm"})
    here = cpu_features()
    assert here.model and here.summary().startswith(here.model)
    assert set(here.notable) <= here.flags


def test_cpu_as_a_narrower_level_hides_the_wider_flags(monkeypatch):
    amx = {"amx_tile", "amx_bf16", "amx_int8"}
    v3 = {"sse4_2", "avx", "avx2", "fma", "f16c"}
    v4 = {"avx_vnni", "avx512f", "avx512bw", "avx512_vnni"}
    xeon = frozenset(v3 | v4 | amx | {"avx512_bf16", "avx512_fp16"})
    assert hidden_above("avx2", xeon) == v3
    assert hidden_above("avx512", xeon) == v3 | v4
    assert hidden_above("avx512_bf16", xeon) == v3 | v4 | {"avx512_bf16"}
    assert hidden_above("generic", xeon) == {"sse4_2"}
    with pytest.raises(ConfigError, match="VRIKSHA_CPU_AS='avx3'.*avx2"):
        hidden_above("avx3", xeon)

    real = cpu_features()
    monkeypatch.setenv("VRIKSHA_CPU_AS", "generic")
    cpu_features.cache_clear()
    try:
        generic = cpu_features()
        assert generic.model.endswith(" as generic") and not any(f.startswith("avx") for f in generic.flags)
        assert generic.flags <= real.flags
        assert generic.signature != real.signature  # what was measured for the real CPU is not taken for it
    finally:
        cpu_features.cache_clear()


def test_auto_is_float32_on_the_cpu_without_measuring(cache):
    """The default computes the model's own numbers: float32 on the CPU whatever bf16 would measure, for a
    GGUF file (dequantized) as for a Transformers directory; nothing is timed or cached."""
    for model in (None, "tests-do-not-read-this"):
        choice = fast_dtype.resolve("auto", model, devices.host())
        assert (choice.dtype, choice.requested) == (torch.float32, "auto")
        assert "own numbers" in choice.how and choice.timings is None
    assert not cache.exists()


def test_vriksha_dtype_pins_auto_and_fastest_without_measuring(cache, monkeypatch):
    monkeypatch.setenv("VRIKSHA_DTYPE", "bfloat16")
    pin = fast_dtype.resolve("auto", None, devices.host())
    assert (pin.dtype, pin.requested, pin.how) == (torch.bfloat16, "auto", "pinned by VRIKSHA_DTYPE")
    fastest = fast_dtype.resolve("fastest", None, devices.host())
    assert (fastest.dtype, fastest.requested, fastest.how) == (
        torch.bfloat16,
        "fastest",
        "pinned by VRIKSHA_DTYPE",
    )
    assert fast_dtype.resolve("float32", None, devices.host()).dtype == torch.float32  # --dtype still wins
    assert not cache.exists()
    monkeypatch.setenv("VRIKSHA_DTYPE", "int4")
    with pytest.raises(ConfigError, match="VRIKSHA_DTYPE='int4'"):
        fast_dtype.resolve("auto", None, devices.host())


def test_auto_is_the_default_and_dtype_overrides():
    assert EngineConfig().dtype == "auto"
    assert EngineConfig(dtype="bfloat16").dtype == "bfloat16"
    assert EngineConfig(dtype="fastest").dtype == "fastest"
    with pytest.raises(ConfigError, match="dtype must be one of auto, fastest, float32"):
        EngineConfig(dtype="int8")


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory, default_tokenizer):
    from tests.tiny_llama import save_model_dir, tiny_llama

    return save_model_dir(tiny_llama(default_tokenizer), default_tokenizer, tmp_path_factory.mktemp("tiny"))


def test_the_engine_loads_at_the_measured_dtype_and_reports_it(cache, model_dir, capsys):
    from vriksha.cli import main

    options = [
        "--kv-cache-memory-gb",
        "0.01",
        "--max-model-len",
        "64",
        "--no-native-kernels",
        "--no-fast-linear",
    ]
    assert (
        main(
            [
                "generate",
                "--model",
                str(model_dir),
                "--prompt",
                "hi",
                "--max-tokens",
                "2",
                "--verbose",
                "--dtype",
                "fastest",
                *options,
            ]
        )
        == 0
    )
    err = capsys.readouterr().err
    measured = fast_dtype.choose_dtype(fast_dtype.model_shapes(model_dir), devices.host())
    assert measured.how == "cached"  # the engine measured it and stored it
    assert f"dtype {measured.name} (fastest: measured" in err
    assert "CPU flags: " + " ".join(cpu_features().notable) in err

    from vriksha import LLM

    small = dict(kv_cache_memory_gb=0.01, max_model_len=64, native_kernels=False, fast_linear=False)
    with LLM(model=str(model_dir), dtype="fastest", **small) as llm:
        assert llm.engine.dtype == measured.dtype and llm.engine.dtype_choice.how == "cached"
    with LLM(model=str(model_dir), **small) as llm:  # the default: the model's own numbers
        assert llm.engine.dtype == torch.float32 and llm.engine.dtype_choice.requested == "auto"
    with LLM(model=str(model_dir), dtype="float32", **small) as llm:
        assert llm.engine.dtype == torch.float32 and llm.engine.dtype_choice.how == "given"


def test_a_gguf_model_runs_float32_where_its_packed_decode_is_faster(model_dir):
    """Under fastest, the embedded GGUF's packed decode step (measured on its shapes) is weighed against each
    dense dtype's decode step: float32 where it is faster than all of them, the dense choice elsewhere."""
    from vriksha.engine.native.quant import quant_kernels
    from vriksha.engine.quantization import packed_dtype

    if quant_kernels() is None:
        pytest.skip("no C compiler: the quantized kernels cannot be built")
    cpu = devices.host()

    def dense(bf16_decode_s: float) -> fast_dtype.DtypeChoice:
        timings = {
            "float32": {"decode_s": 2 * bf16_decode_s, "prefill_s": 1.0},
            "bfloat16": {"decode_s": bf16_decode_s, "prefill_s": 0.3},
        }
        return fast_dtype.DtypeChoice(torch.bfloat16, "fastest", "measured", "cpu", timings=timings)

    embedded = EngineConfig()  # the embedded Q4_1 GGUF, quantization auto
    chosen = packed_dtype(dense(10.0), embedded, cpu)  # a dense step of 10 s: any packed step beats it
    assert chosen is not None and chosen.dtype == torch.float32 and chosen.requested == "fastest"
    assert "packed blocks" in chosen.how and "dense bf16" in chosen.describe()
    assert packed_dtype(dense(1e-9), embedded, cpu) is None  # no packed step beats a nanosecond
    assert packed_dtype(dense(10.0), EngineConfig(quantization="none"), cpu) is None
    assert packed_dtype(fast_dtype.given("bfloat16", cpu), embedded, cpu) is None  # --dtype stands
    assert packed_dtype(dense(10.0), EngineConfig(model=str(model_dir)), cpu) is None  # not a GGUF file


def test_a_burst_of_load_during_one_dtypes_turn_does_not_decide(monkeypatch):
    """Each dtype is timed in two rounds in opposite orders and keeps its best: a slow first turn of fp32
    (another job on the machine) does not make the lower precision look faster."""
    calls: dict[torch.dtype, int] = {}

    def timed(shape, dtype, device, min_s, reps):
        calls[dtype] = calls.get(dtype, 0) + 1
        slow = dtype == torch.float32 and calls[dtype] <= 2  # the first round's fp32 turn, under load
        return (20e-3 if slow else 1e-3), (20e-3 if slow else 1e-3)

    monkeypatch.setattr(fast_dtype, "_shape_times", timed)
    shapes = [fast_dtype.LinearShape(64, 64, 3, True), fast_dtype.LinearShape(128, 64, 1, False)]
    timings = fast_dtype.measure(shapes, torch.device("cpu"), ("float32", "bfloat16"))
    assert calls == {torch.float32: 4, torch.bfloat16: 4}
    for name in ("float32", "bfloat16"):
        assert timings[name] == pytest.approx({"decode_s": 4e-3, "prefill_s": 4e-3})
    assert fast_dtype.pick(timings) == "float32"
