import copy

import pytest
import torch

from vriksha.loading import load_tokenizer, resolve_model_path


@pytest.fixture(scope="session")
def default_tokenizer():
    return load_tokenizer(resolve_model_path(None))


def tiny_config(family: str, vocab_size: int):
    """A tiny random config of one model family (tests/engine/families.py), at `vocab_size`."""
    from tests.engine.families import FAMILY_CONFIGS, REFUSED_CONFIGS

    config = {**FAMILY_CONFIGS, **REFUSED_CONFIGS}[family]()
    config.vocab_size = vocab_size
    if hasattr(config, "get_text_config"):
        config.get_text_config().vocab_size = vocab_size
    return config


def tiny_model(family: str, vocab_size: int, seed: int = 0):
    """A random tiny model of `family`; "qwen2-sliding" is Qwen2 with a 6-token window on its second layer."""
    from transformers import AutoModelForCausalLM

    if family == "qwen2-sliding":
        config = tiny_config("qwen2", vocab_size)
        config.use_sliding_window, config.sliding_window, config.max_window_layers = True, 6, 1
        config.layer_types = ["full_attention", "sliding_attention"]
    else:
        config = tiny_config(family, vocab_size)
    torch.manual_seed(seed)
    return AutoModelForCausalLM.from_config(config, dtype=torch.float32).eval()


ENGINE_TEST_OPTIONS = dict(
    chunked_prefill_size=8, max_num_batched_tokens=24, kv_cache_memory_gb=0.01, max_model_len=256
)


def engines_over(model, tokenizer, **changed):
    """Two engines over copies of `model`: the default options, and the same with `changed`."""
    from vriksha import LLM

    default = LLM.from_module(copy.deepcopy(model), tokenizer, **ENGINE_TEST_OPTIONS)
    variant = LLM.from_module(copy.deepcopy(model), tokenizer, **ENGINE_TEST_OPTIONS, **changed)
    return default, variant


def assert_same_samples(a, b, vocab_size: int, seed: int, n: int, atol: float) -> None:
    """Seeded sampling of three random prompts (1, 9, 30 tokens) gives the same tokens and log-probs on both."""
    from vriksha import SamplingParams

    g = torch.Generator().manual_seed(seed)
    prompts = [
        {"prompt_token_ids": torch.randint(0, vocab_size, (k,), generator=g).tolist()} for k in (1, 9, 30)
    ]
    params = SamplingParams(temperature=1.0, max_tokens=16, ignore_eos=True, seed=5, logprobs=2, n=n)
    for x, y in zip(a.generate(prompts, params), b.generate(prompts, params), strict=True):
        assert len(x.outputs) == len(y.outputs) == n
        for u, v in zip(x.outputs, y.outputs, strict=True):
            assert u.token_ids == v.token_ids
            assert u.token_logprobs == pytest.approx(v.token_logprobs, abs=atol)
