"""The engine and a training step on a device the code never names (vdev, a PrivateUse1 backend) give what the
CPU gives; and no code outside vriksha/device.py names a device kind."""

import copy

import pytest
import torch

from tests.device_backend import NAME, compiler_missing, load


@pytest.fixture(scope="module")
def vdev():
    return load()


@pytest.mark.parametrize("family", ["llama", "gemma3"])  # the lean forward, and the Transformers forward
@pytest.mark.usefixtures("vdev")
@pytest.mark.slow
@pytest.mark.skipif(compiler_missing() is not None, reason=compiler_missing() or "")
def test_engine_generates_on_the_device_as_on_the_cpu(family, default_tokenizer):
    from tests.engine.conftest import tiny_model
    from vriksha import LLM, SamplingParams

    reference = tiny_model(family, 512)
    options = dict(
        kv_cache_memory_gb=0.01, max_model_len=256, chunked_prefill_size=8, max_num_batched_tokens=24
    )
    on_device = LLM.from_module(copy.deepcopy(reference).to(NAME), default_tokenizer, **options)
    on_cpu = LLM.from_module(copy.deepcopy(reference), default_tokenizer, native_kernels=False, **options)
    assert on_device.engine.device.type == NAME and on_device.engine.pool.k[0].device.type == NAME
    prompts = [{"prompt_token_ids": [1, 2, 3, 4, 5]}, {"prompt_token_ids": list(range(30))}]
    for params in (
        SamplingParams(temperature=0, max_tokens=8, ignore_eos=True),
        SamplingParams(temperature=1.0, max_tokens=8, ignore_eos=True, seed=3, logprobs=0, top_p=0.9),
    ):
        for a, b in zip(on_device.generate(prompts, params), on_cpu.generate(prompts, params), strict=True):
            assert a.outputs[0].token_ids == b.outputs[0].token_ids
            assert a.outputs[0].token_logprobs == pytest.approx(b.outputs[0].token_logprobs, abs=1e-4)


@pytest.mark.usefixtures("vdev")
@pytest.mark.slow
@pytest.mark.skipif(compiler_missing() is not None, reason=compiler_missing() or "")
def test_a_training_step_on_the_device_equals_the_cpu():
    from tests.train.parallel_cases import episodes, tiny_model
    from vriksha.train.config import GRPOConfig
    from vriksha.train.grpo import group_advantages
    from vriksha.train.losses import build_loss
    from vriksha.train.update import Learner, UpdateBatch, policy_update

    groups = episodes()
    rewards = torch.tensor([[e.reward for e in g] for g in groups], dtype=torch.float64)
    adv = group_advantages(rewards).advantages.tolist()
    results = {}
    for device in (torch.device(NAME), torch.device("cpu")):
        policy = tiny_model("llama").to(device)
        opt = torch.optim.AdamW(policy.parameters(), lr=1e-2, eps=1e-4)
        cfg = GRPOConfig(micro_batch_groups=1)
        learner = Learner(policy, opt, build_loss(cfg), cfg, device, max_grad_norm=1.0)
        res = policy_update(learner, UpdateBatch(groups, adv, groups[0], pad_id=0))
        results[device.type] = (res, {n: p.detach().cpu() for n, p in policy.named_parameters()})
        assert all(p.device.type == device.type for p in policy.parameters())
    (dev_res, dev_params), (cpu_res, cpu_params) = results[NAME], results["cpu"]
    assert dev_res.loss == pytest.approx(cpu_res.loss, abs=1e-5)
    assert dev_res.grad_norm == pytest.approx(cpu_res.grad_norm, rel=1e-4)
    for name, value in cpu_params.items():
        torch.testing.assert_close(dev_params[name], value, atol=1e-5, rtol=1e-4)
