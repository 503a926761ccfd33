"""Multi-LoRA serving in the engine: PEFT adapters load and give PEFT + Transformers' numbers, a step mixing
several adapters and the base model gives each request what it gets served alone, the prefix cache never
hands one adapter's K/V to another, and bad adapters are refused by name."""

from __future__ import annotations

import copy

import pytest
import torch

from tests.tiny_llama import embedded_tokenizer, tiny_llama
from vriksha import LLM, SamplingParams
from vriksha.engine.core.lora_registry import UnknownLoraError
from vriksha.lora import AdapterError, LoraAdapter, LoraWeights, load_peft_dir

TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
OPTIONS = dict(
    enable_lora=True,
    max_loras=6,
    max_lora_rank=16,
    chunked_prefill_size=8,
    max_num_batched_tokens=32,
    kv_cache_memory_gb=0.01,
    max_model_len=256,
)
GREEDY = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True, logprobs=0)


def peft_adapter(base, path, seed: int, rank: int = 8, targets=TARGETS):
    """An adapter written by PEFT itself: `get_peft_model`, B drawn at random (else a no-op), saved."""
    from peft import LoraConfig, get_peft_model

    torch.manual_seed(seed)
    model = get_peft_model(
        copy.deepcopy(base), LoraConfig(r=rank, lora_alpha=2 * rank, target_modules=list(targets))
    )
    with torch.no_grad():
        for n, p in model.named_parameters():
            if "lora_B" in n:
                p.normal_(std=0.5)
    model.save_pretrained(path)
    return model.eval()


def random_adapter(base, name: str, seed: int, rank: int = 4) -> LoraAdapter:
    g = torch.Generator().manual_seed(seed)
    modules = {}
    for n, m in base.named_modules():
        if isinstance(m, torch.nn.Linear) and n.rsplit(".", 1)[-1] in TARGETS:
            a = torch.randn(rank, m.in_features, generator=g) * 0.3
            b = torch.randn(m.out_features, rank, generator=g) * 0.3
            modules[n] = LoraWeights(a, b)
    return LoraAdapter(name, rank, 2.0 * rank, TARGETS, modules)


def engine(base, *adapters: LoraAdapter, **changed):
    llm = LLM.from_module(copy.deepcopy(base), embedded_tokenizer(), **{**OPTIONS, **changed})
    for adapter in adapters:
        llm.engine.add_lora(adapter)
    return llm


def prompt(tok, text: str) -> dict:
    return {"prompt_token_ids": tok(text)["input_ids"]}


def test_peft_adapter_gives_peft_logits(base, tok, tmp_path):
    peft_model = peft_adapter(base, tmp_path / "ad", seed=3)
    llm = engine(base)
    llm.engine.add_lora(load_peft_dir(tmp_path / "ad", name="ad"))
    p = prompt(tok, "The capital of France is")
    with_adapter = llm.generate(p, GREEDY, lora="ad")[0].outputs[0]
    plain = llm.generate(p, GREEDY)[0].outputs[0]
    ids = torch.tensor([p["prompt_token_ids"] + with_adapter.token_ids])
    with torch.no_grad():
        logits = peft_model(input_ids=ids).logits[0].float()
    n = len(p["prompt_token_ids"])
    want = logits[n - 1 : -1].log_softmax(-1)
    assert with_adapter.token_ids == want.argmax(-1).tolist()  # PEFT's greedy tokens
    chosen = want.gather(1, torch.tensor(with_adapter.token_ids)[:, None])[:, 0]
    torch.testing.assert_close(torch.tensor(with_adapter.token_logprobs), chosen, rtol=0, atol=1e-4)
    assert with_adapter.token_ids != plain.token_ids  # the adapter changes what the model says


def test_mixed_batch_equals_each_request_alone(base, tok):
    names = [f"a{i}" for i in range(4)]
    adapters = [random_adapter(base, name, seed=10 + i, rank=2 + 2 * i) for i, name in enumerate(names)]
    llm = engine(base, *adapters)
    texts = ["Hello there, my name is", "1 2 3 4 5", "The quick brown fox", "Paris is", "Once upon a time"]
    prompts = [prompt(tok, t) for t in texts] * 2
    loras = [*names, None, None, *reversed(names)]  # every adapter twice, the base twice, rows interleaved
    together = llm.generate(prompts, GREEDY, lora=loras)
    one_at_a_time = engine(base, *adapters, enable_prefix_caching=False)
    alone = [one_at_a_time.generate(p, GREEDY, lora=lo)[0] for p, lo in zip(prompts, loras, strict=True)]
    for t, a in zip(together, alone, strict=True):
        assert t.outputs[0].token_ids == a.outputs[0].token_ids
        torch.testing.assert_close(
            torch.tensor(t.outputs[0].token_logprobs),
            torch.tensor(a.outputs[0].token_logprobs),
            atol=1e-4,
            rtol=0,
        )
    by_adapter = {lo: t.outputs[0].token_ids for t, lo in zip(together[:5], loras[:5], strict=True)}
    assert len({tuple(v) for v in by_adapter.values()}) >= 4  # the adapters really differ from each other


def test_prefix_cache_is_keyed_by_adapter(base, tok):
    llm = engine(base)
    llm.engine.add_lora(random_adapter(base, "x", seed=1))
    llm.engine.add_lora(random_adapter(base, "y", seed=2))
    p = prompt(tok, "A long shared system prompt that several adapters would all like to reuse, please.")
    first = llm.generate(p, GREEDY, lora="x")[0]
    again_x = llm.generate(p, GREEDY, lora="x")[0]
    as_y = llm.generate(p, GREEDY, lora="y")[0]
    as_base = llm.generate(p, GREEDY)[0]
    assert first.num_cached_tokens == 0 and again_x.num_cached_tokens > 0  # the same adapter reuses its K/V
    assert as_y.num_cached_tokens == 0 and as_base.num_cached_tokens == 0  # never another adapter's
    fresh = engine(base, random_adapter(base, "y", seed=2))
    assert as_y.outputs[0].token_ids == fresh.generate(p, GREEDY, lora="y")[0].outputs[0].token_ids
    assert as_base.outputs[0].token_ids == engine(base).generate(p, GREEDY)[0].outputs[0].token_ids


def test_bad_adapters_and_unknown_names_are_refused(base, tok, tmp_path):
    llm = engine(base)
    with pytest.raises(UnknownLoraError, match="'nope' is not loaded"):
        llm.generate(prompt(tok, "hi"), GREEDY, lora="nope")
    with pytest.raises(AdapterError, match="over --max-lora-rank 16"):
        llm.engine.add_lora(random_adapter(base, "big", seed=1, rank=32))
    other = tiny_llama(tok, hidden_size=32, intermediate_size=64)
    with pytest.raises(AdapterError, match="trained for another model"):
        llm.engine.add_lora(random_adapter(other, "wrong", seed=1))
    llm.engine.add_lora(random_adapter(base, "ok", seed=1))
    with pytest.raises(AdapterError, match="already loaded"):
        llm.engine.add_lora(random_adapter(base, "ok", seed=2))
    for i in range(OPTIONS["max_loras"] - 1):
        llm.engine.add_lora(random_adapter(base, f"fill{i}", seed=i))
    with pytest.raises(AdapterError, match="--max-loras 6"):
        llm.engine.add_lora(random_adapter(base, "one-too-many", seed=9))
    assert llm.generate(prompt(tok, "hi"), GREEDY, lora="ok")[0].outputs[0].token_ids  # still serving
    llm.engine.remove_lora("ok")
    with pytest.raises(UnknownLoraError):
        llm.generate(prompt(tok, "hi"), GREEDY, lora="ok")
    plain = LLM.from_module(copy.deepcopy(base), tok, kv_cache_memory_gb=0.01)
    with pytest.raises(Exception, match="--enable-lora"):
        plain.generate(prompt(tok, "hi"), GREEDY, lora="ok")


def test_new_version_serves_new_requests_while_old_ones_finish(base, tok):
    llm = engine(base)
    v1, v2 = random_adapter(base, "live", seed=1), random_adapter(base, "live", seed=2)
    llm.engine.add_lora(v1, version=1)
    p = prompt(tok, "Versions side by side")
    long = SamplingParams(temperature=0.0, max_tokens=20, ignore_eos=True)
    old = llm.engine.add_request(p, long, lora="live")
    llm.engine.step()
    llm.engine.add_lora(v2, version=2, replace=True)
    weights = llm.engine.runner.lora.weights
    assert len(weights) == 2  # the old version stays while a request runs on it
    new = llm.engine.add_request(p, long, lora="live")
    stats = llm.engine.stats()
    assert stats.running_loras == ("live",) and stats.waiting_loras == ("live",) and stats.max_loras == 6
    outs = {}
    while llm.engine.has_unfinished:
        for o in llm.engine.step():
            if o.finished:
                outs[o.request_id] = o.outputs[0].token_ids
    assert len(weights) == 1  # dropped once no request uses it
    solo1, solo2 = engine(base, v1), engine(base, v2)
    assert outs[old] == solo1.generate(p, long, lora="live")[0].outputs[0].token_ids
    assert outs[new] == solo2.generate(p, long, lora="live")[0].outputs[0].token_ids
