"""fp32 layers routed to bf16 arithmetic: only where allowed, within bf16's error, the torch setting put back."""

import json

import pytest
import torch
import torch.nn.functional as F

from vriksha.engine import fast_linear, fp32_precision
from vriksha.engine.config import EngineConfig
from vriksha.engine.installation import ModuleInstallation
from vriksha.errors import ConfigError
from vriksha.timing_load import MachineLoad

needs_bf16 = pytest.mark.skipif(
    not fp32_precision.supported(),
    reason="needs oneDNN bf16 arithmetic (amx_bf16 or avx512_bf16, ISA not capped by ONEDNN_MAX_CPU_ISA)",
)


def test_resolve_allows_bf16_only_for_auto_fp32_on_a_capable_cpu():
    capable = fp32_precision.supported()
    assert fp32_precision.resolve("auto", torch.float32, dtype_measured=True, cpu=True) is capable
    assert fp32_precision.resolve("bf16", torch.float32, dtype_measured=False, cpu=True) is capable
    # an explicit or pinned fp32 is strict
    assert not fp32_precision.resolve("auto", torch.float32, dtype_measured=False, cpu=True)
    assert not fp32_precision.resolve("ieee", torch.float32, dtype_measured=True, cpu=True)
    assert not fp32_precision.resolve("bf16", torch.bfloat16, dtype_measured=True, cpu=True)
    assert not fp32_precision.resolve("bf16", torch.float32, dtype_measured=True, cpu=False)
    with pytest.raises(ConfigError, match="fp32_precision must be one of"):
        fp32_precision.resolve("tf32", torch.float32, dtype_measured=True, cpu=True)
    with pytest.raises(ConfigError, match="fp32_precision must be auto, ieee or bf16"):
        EngineConfig(fp32_precision="half")


def test_the_torch_setting_is_restored_after_each_call():
    matmul = torch.backends.mkldnn.matmul
    before = matmul.fp32_precision
    with pytest.raises(RuntimeError, match="inside"):
        with fp32_precision.bf16_arithmetic():
            assert matmul.fp32_precision == "bf16"
            raise RuntimeError("inside")
    assert matmul.fp32_precision == before


def _router_on_bf16(monkeypatch, tmp_path, bf16: bool):
    """A two-layer model whose router plan says bf16 at every bucket (written where the router reads it)."""
    monkeypatch.setenv("VRIKSHA_CACHE", str(tmp_path))
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.Linear(512, 128, bias=False))
    probe = fast_linear.FastLinear.__new__(fast_linear.FastLinear)
    probe.native, probe.bf16 = None, bf16
    quiet = MachineLoad(0.0, 0.0, 1).to_dict()  # timed on a quiet machine, so read back as it is
    plan = {
        probe.key(layer): {"timing": ["bf16"] * len(fast_linear.BUCKETS), "measured_at": 0.0, "load": quiet}
        for layer in model
    }
    (tmp_path / "fast_linear.json").write_text(json.dumps(plan))
    return model, fast_linear.FastLinear(model, ModuleInstallation(model), None, bf16)


@needs_bf16
def test_a_bf16_route_is_within_bf16_error_and_not_strict_fp32(monkeypatch, tmp_path):
    model, router = _router_on_bf16(monkeypatch, tmp_path, bf16=True)
    assert router.bf16_buckets() == list(fast_linear.BUCKETS)
    x = torch.randn(300, 256)
    strict = F.linear(F.linear(x, model[0].weight, model[0].bias), model[1].weight)
    with router.engaged(), torch.inference_mode():
        routed = model(x)
    assert torch.backends.mkldnn.matmul.fp32_precision != "bf16"
    assert routed.dtype == torch.float32
    torch.testing.assert_close(routed, strict, rtol=2e-2, atol=2e-2)
    assert not torch.equal(routed, strict)  # the bf16 arithmetic really ran
    with torch.inference_mode():  # outside the engine's forward: the layer's own fp32 forward
        assert torch.equal(model(x), strict)


def test_a_router_not_allowed_bf16_never_measures_or_takes_it(monkeypatch, tmp_path):
    monkeypatch.setenv("VRIKSHA_CACHE", str(tmp_path))
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 96))
    router = fast_linear.FastLinear(model, ModuleInstallation(model), None, bf16=False)
    plan = json.loads((tmp_path / "fast_linear.json").read_text())
    assert all("bf16" not in entry["timing"] for entry in plan.values())
    assert router.bf16_buckets() == []


def test_an_engine_decides_by_how_its_dtype_was_chosen(default_tokenizer):
    from tests.engine.conftest import ENGINE_TEST_OPTIONS, tiny_model
    from vriksha import LLM, SamplingParams

    model, tok = tiny_model("llama", len(default_tokenizer)), default_tokenizer
    greedy = SamplingParams(temperature=0, max_tokens=6)
    prompt = {"prompt_token_ids": list(range(3, 40))}
    with LLM.from_module(
        model, tok, **ENGINE_TEST_OPTIONS
    ) as llm:  # a module handed over (the trainer's rollouts): strict fp32
        assert not llm.engine.runner.bf16_matmuls
        assert llm.engine.runner.matmul_choice == "strict fp32 matmuls"
        strict = llm.generate(prompt, greedy)[0].outputs[0].token_ids
    if not fp32_precision.supported():
        pytest.skip("needs amx_bf16 or avx512_bf16 (oneDNN's bf16 arithmetic)")
    with LLM.from_module(model, tok, fp32_precision="bf16", **ENGINE_TEST_OPTIONS) as llm:
        assert llm.engine.runner.bf16_matmuls
        assert llm.engine.runner.matmul_choice.startswith("fp32 matmuls in bf16 arithmetic")
        assert len(llm.generate(prompt, greedy)[0].outputs[0].token_ids) == len(strict)


def test_the_kv_cache_dtype_follows_bf16_arithmetic_under_auto():
    from vriksha.engine.kv_pool import kv_cache_dtype

    assert kv_cache_dtype("auto", torch.float32, True, False) == torch.bfloat16
    assert kv_cache_dtype("auto", torch.float32, False, False) == torch.float32
    assert kv_cache_dtype("auto", torch.bfloat16, True, False) == torch.bfloat16
    assert kv_cache_dtype("bfloat16", torch.float32, False, False) == torch.bfloat16
    assert kv_cache_dtype("float32", torch.float32, True, False) == torch.float32
    with pytest.raises(ConfigError, match="tensor parallel"):
        kv_cache_dtype("bfloat16", torch.float32, False, True)
    with pytest.raises(ConfigError, match="kv_cache_dtype must be one of"):
        kv_cache_dtype("int4", torch.float32, False, False)
    with pytest.raises(ConfigError, match="kv_cache_dtype must be"):
        EngineConfig(kv_cache_dtype="fp8")
