"""The rules written at the top of `vriksha/engine/__init__.py`: the core imports no backend, platform decisions
are made once at load, CPU tuning lives in the platform section of the engine's config."""

import ast
import dataclasses
import json
import subprocess
import sys
from pathlib import Path

import pytest

import vriksha.engine.core
from tests.engine.conftest import ENGINE_TEST_OPTIONS, tiny_model
from vriksha import LLM, EngineConfig, SamplingParams
from vriksha.engine.config import PlatformConfig
from vriksha.engine.core.structured_outputs import StructuredOutputsParams

CORE = Path(vriksha.engine.core.__file__).parent
BACKENDS = ("vriksha.engine.platform", "vriksha.engine.attention.paged", "triton", "ctypes")
THE_DOOR = "vriksha.engine.runner.load"  # the one way from the engine loop to the model
LOOP = ("llm_engine", "llm", "async_engine")  # the engine loop and the APIs over it, which load a model


def _imports(path: Path) -> list[str]:
    """Every module `path` imports, at module level or inside a function."""
    names = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module:
            names += [node.module] + [f"{node.module}.{a.name}" for a in node.names]
    return names


def test_no_core_module_imports_a_backend():
    seen = {}
    for path in sorted(CORE.glob("*.py")):
        for name in _imports(path):
            if name.startswith(BACKENDS) or (
                name.startswith("vriksha.engine.runner") and not name.startswith(THE_DOOR)
            ):
                seen.setdefault(path.name, []).append(name)
            if name.startswith(THE_DOOR) and path.stem != "llm_engine":
                seen.setdefault(path.name, []).append(name)
    assert seen == {}, f"core modules import backends: {seen}"


def test_core_modules_load_no_backend_when_imported():
    """In a fresh interpreter, the core's modules (all but the engine loop, which loads a model through the
    runner) bring no platform, attention or runner module and no triton with them."""
    modules = [
        f"vriksha.engine.core.{p.stem}" for p in CORE.glob("*.py") if p.stem not in (*LOOP, "__init__")
    ]
    code = (
        "import importlib, json, sys\n"
        f"for m in {modules!r}: importlib.import_module(m)\n"
        "print(json.dumps(sorted(sys.modules)))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    loaded = json.loads(out.strip().splitlines()[-1])
    assert len(modules) > 10
    backends = [m for m in loaded if m.startswith((*BACKENDS[:3], "vriksha.engine.runner"))]
    assert backends == []


def test_no_platform_decision_is_taken_after_load(default_tokenizer, monkeypatch):
    """Once loaded, steps of every kind (prefill chunks, decodes, prompt log-probs, grammar masks) run without
    asking any platform decision again."""
    from vriksha.engine.attention.paged import backend
    from vriksha.engine.platform import (
        compute_dtype,
        fp32_precision,
        host_malloc,
        kernel_sets,
        plan,
        quantization,
    )
    from vriksha.engine.runner import native_decode_choice

    vocab = len(default_tokenizer)  # the grammar's tokenizer covers the whole vocabulary
    llm = LLM.from_module(tiny_model("llama", vocab), default_tokenizer, **ENGINE_TEST_OPTIONS)

    def decided_again(*args, **kwargs):
        raise AssertionError("a platform decision taken after load")

    for module, name in (
        (compute_dtype, "resolve"),
        (fp32_precision, "resolve"),
        (host_malloc, "keep_freed_memory"),
        (kernel_sets, "select"),
        (plan, "resolve"),
        (plan, "kv_cache_dtype"),
        (quantization, "apply"),
        (quantization, "packed_activations"),
        (backend, "select_backend"),
        (native_decode_choice, "set_up"),
    ):
        monkeypatch.setattr(module, name, decided_again)
    prompts = [{"prompt_token_ids": list(range(1, 1 + n))} for n in (3, 30)]
    params = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True, prompt_logprobs=1)
    outs = llm.generate(prompts, params)
    assert [len(o.outputs[0].token_ids) for o in outs] == [6, 6]
    structured = SamplingParams(max_tokens=4, structured_outputs=StructuredOutputsParams(regex="[0-9]+"))
    assert llm.generate([{"prompt_token_ids": [1, 2, 3]}], structured)[0].outputs[0].token_ids


def test_the_plan_is_one_frozen_record_with_the_runners_choices(default_tokenizer):
    llm = LLM.from_module(tiny_model("qwen3", 512), default_tokenizer, **ENGINE_TEST_OPTIONS)
    plan = llm.engine.plan
    with pytest.raises(dataclasses.FrozenInstanceError):
        plan.kv_dtype = None
    assert plan.runner is not None and plan.runner.forward_paths == tuple(
        p.name for p in llm.engine.runner.paths
    )
    assert plan.runner.forward_paths[-1] == "transformers forward"
    lines = plan.lines()
    assert any(line.startswith("dtype ") for line in lines) and any("native decode" in line for line in lines)


def test_cpu_tuning_options_live_in_the_platform_section():
    platform = {f.name for f in dataclasses.fields(PlatformConfig)}
    top = {f.name for f in dataclasses.fields(EngineConfig)}
    tuning = {"fast_linear", "fast_forward", "native_decode", "native_kernels", "kernels", "fp32_precision",
              "packed_activations", "host_malloc_tuning", "front_end_core", "cuda_graphs"}  # fmt: skip
    assert tuning <= platform and not tuning & top
    assert "platform" in top
