"""Layers from a local kernel repository (the `kernels` package's format), made in the test, bound in the
engine in place of the model's RMSNorm: outputs equal torch's, the layer is really called, and closing the
engine hands the model back."""

from __future__ import annotations

import json
import textwrap

import pytest
import torch

from tests.engine.conftest import ENGINE_TEST_OPTIONS, tiny_model
from vriksha import LLM, SamplingParams
from vriksha.engine.platform import hub_layers
from vriksha.errors import ConfigError

kernels = pytest.importorskip("kernels", reason="needs the kernels package (pip install kernels)")

LAYER = '''
import torch
from torch import nn

CALLS = [0]


class RMSNorm(nn.Module):
    """Stateless: uses the weight and epsilon of the module it is bound to."""

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        CALLS[0] += 1
        x = hidden_states.float()
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.variance_epsilon)
        return self.weight * x.to(hidden_states.dtype)


class layers:
    RMSNorm = RMSNorm
'''


@pytest.fixture
def repo(tmp_path, monkeypatch):
    """A kernel repository on disk: metadata.json and the package, as the `kernels` package loads them."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    path = tmp_path / "rmsnorm"
    path.mkdir()
    metadata = {"id": "vriksha-test-rmsnorm", "name": "test-rmsnorm", "version": 1, "license": "Apache-2.0",
                "backend": {"type": "cpu"}, "python-depends": []}  # fmt: skip
    (path / "metadata.json").write_text(json.dumps(metadata))
    (path / "__init__.py").write_text(textwrap.dedent(LAYER))
    return path


def _calls(repo_path) -> int:
    module = kernels.LocalLayerRepository(repo_path=repo_path, layer_name="RMSNorm").load()
    return __import__("sys").modules[module.__module__].CALLS[0]


@pytest.mark.parametrize("fast_forward", [True, False])
def test_engine_uses_the_local_layer_with_outputs_equal_to_torch(repo, default_tokenizer, fast_forward):
    model = tiny_model("llama", 512)
    prompts = [{"prompt_token_ids": [5, 4, 3, 2, 1, 0, 7]}, {"prompt_token_ids": [11]}]
    params = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True, logprobs=1)
    options = {**ENGINE_TEST_OPTIONS, "fast_forward": fast_forward}
    with LLM.from_module(model, default_tokenizer, kernels="torch", **options) as plain:
        want = plain.generate(prompts, params)
    before = _calls(repo)
    llm = LLM.from_module(model, default_tokenizer, kernel_layers=f"RMSNorm={repo}", **options)
    assert "kernel layers RMSNorm" in llm.engine.runner.kernels.describe()
    got = llm.generate(prompts, params)
    assert _calls(repo) > before
    llm.close()
    assert "forward" not in vars(model.model.norm)  # the model's own forward is back
    for a, b in zip(got, want, strict=True):
        assert a.outputs[0].token_ids == b.outputs[0].token_ids
        for x, y in zip(a.outputs[0].logprobs, b.outputs[0].logprobs, strict=True):
            assert x.keys() == y.keys()
            for token in x:
                assert abs(x[token] - y[token]) < 1e-4


def test_the_packages_own_mapping_format_is_accepted(repo):
    model = tiny_model("qwen3", 512)
    mapping = {"RMSNorm": {"cpu": kernels.LocalLayerRepository(repo_path=repo, layer_name="RMSNorm")}}
    from vriksha.engine.platform.kernel_sets import TorchKernels
    from vriksha.engine.platform.module_installation import ModuleInstallation

    with ModuleInstallation(model) as installation:
        bound = hub_layers.bind_mapping(model, mapping, installation, TorchKernels())
        norms = [m for m in model.modules() if type(m).__name__.endswith("RMSNorm")]
        assert len(bound.bound) == len(norms) > 4  # layer norms, q/k norms, the final norm
        x = torch.randn(2, 64)
        assert torch.allclose(model.model.norm(x), TorchKernels().rms_norm(x.clone(), model.model.norm))
    assert all("forward" not in vars(m) for m in norms)


def test_bad_mappings_are_refused_with_what_to_do(repo, default_tokenizer, tmp_path):
    model = tiny_model("llama", 512)
    cases = {
        "RMSNorm": "must read NAME=DIR",
        f"RMSNorm={tmp_path / 'missing'}": "is not a directory",
        f"LayerNorm={repo}:RMSNorm": "no layer of this model is a LayerNorm",
        f"RMSNorm={repo}:Missing": "could not be loaded",
    }
    for spec, message in cases.items():
        with pytest.raises(ConfigError, match=message):
            LLM.from_module(model, default_tokenizer, kernel_layers=spec, **ENGINE_TEST_OPTIONS)
    hub = {
        "RMSNorm": {
            "cpu": kernels.LayerRepository(
                repo_id="kernels-community/x", layer_name="RMSNorm", revision="main"
            )
        }
    }
    from vriksha.engine.platform.kernel_sets import TorchKernels
    from vriksha.engine.platform.module_installation import ModuleInstallation

    with (
        ModuleInstallation(model) as installation,
        pytest.raises(ConfigError, match="not a local repository"),
    ):
        hub_layers.bind_mapping(model, hub, installation, TorchKernels())
