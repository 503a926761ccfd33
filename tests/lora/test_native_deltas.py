"""LoRA deltas inside the native decode step: a step with adapter rows stays in the one native call and gives
what the torch path (the lean forward adding the deltas in torch) and PEFT + Transformers give, a batch mixing
adapters and base rows gives each request what it gets alone, and loading and unloading adapters changes
what the native step reads (an unloaded adapter's tables are gone with its weights)."""

from __future__ import annotations

import copy
import gc
import weakref

import pytest
import torch

from tests.lora.test_serving_engine import GREEDY, OPTIONS, peft_adapter, prompt, random_adapter
from tests.tiny_llama import embedded_tokenizer
from vriksha import LLM, SamplingParams
from vriksha.engine.platform import native
from vriksha.engine.platform.lora_linear import LoraRows
from vriksha.engine.runner.lean_forward import LeanForward
from vriksha.engine.runner.native_decode import NativeDecode
from vriksha.engine.runner.native_decode_choice import synthetic_decode
from vriksha.engine.runner.step import ForwardStep
from vriksha.lora import load_peft_dir

pytestmark = pytest.mark.skipif(native.kernels() is None, reason="no C compiler: no native kernels")
TEXTS = ["Hello there, my name is", "1 2 3 4 5", "The quick brown fox", "Paris is", "Once upon a time"]


def engine(base, *adapters, native_decode: str = "on", **changed):
    llm = LLM.from_module(
        copy.deepcopy(base), embedded_tokenizer(), **{**OPTIONS, **changed}, native_decode=native_decode
    )
    for adapter in adapters:
        llm.engine.add_lora(adapter)
    return llm


def native_lora_steps(llm) -> list[int]:
    """Counts, per native step taken from now on, its rows on an adapter (the path is wrapped to count)."""
    path = llm.engine.runner.path(NativeDecode)
    assert path is not None, llm.engine.runner.native_decode_choice
    seen: list[int] = []
    logits = path.logits

    def counting(*args, lora=None):
        seen.append(0 if lora is None else sum(p is not None for p in lora.rows))
        return logits(*args, lora)

    path.logits = counting
    return seen


def assert_same_outputs(a, b, atol: float = 1e-4) -> None:
    for x, y in zip(a, b, strict=True):
        assert x.outputs[0].token_ids == y.outputs[0].token_ids
        torch.testing.assert_close(
            torch.tensor(x.outputs[0].token_logprobs),
            torch.tensor(y.outputs[0].token_logprobs),
            atol=atol,
            rtol=0,
        )


@pytest.mark.parametrize("quantization", [None, "int8"])
def test_one_step_with_adapter_rows_equals_the_torch_path(base, quantization):
    """A decode step of 5 rows, 2 adapters of different ranks (one on scattered rows) and 2 base rows: the native
    step's logits equal the lean forward's, which adds the deltas in torch; over float32 and packed int8 bases."""
    options = {"quantization": quantization} if quantization else {}
    llm = engine(
        base, random_adapter(base, "a", seed=1, rank=4), random_adapter(base, "b", seed=2, rank=8), **options
    )
    runner = llm.engine.runner
    fused, lean = runner.path(NativeDecode), runner.path(LeanForward)
    assert fused is not None and (quantization is None or fused.quant is not None)
    ids = {lr.name: lr.lora_id for lr in llm.engine.loras.registry.current.values()}
    inputs = synthetic_decode(runner.pool, runner.attention, 5, 12, llm.engine.vocab_size)
    inputs.lora = LoraRows.of([ids["a"], 0, ids["b"], ids["b"], ids["a"]])
    step = ForwardStep(inputs=inputs)
    assert fused.accepts(step)
    with_deltas = fused(step)
    torch.testing.assert_close(with_deltas, lean(step), rtol=1e-5, atol=1e-5)
    inputs.lora = None
    plain = fused(step)
    assert (with_deltas[1] - plain[1]).abs().max() == 0  # the base row is the base model's
    assert all((with_deltas[r] - plain[r]).abs().max() > 1e-2 for r in (0, 2, 3, 4))  # the adapters do act


def test_peft_adapter_through_the_native_step_gives_peft_logits(base, tok, tmp_path):
    peft_model = peft_adapter(base, tmp_path / "ad", seed=3)
    llm = engine(base)
    llm.engine.add_lora(load_peft_dir(tmp_path / "ad", name="ad"))
    steps = native_lora_steps(llm)
    p = prompt(tok, "The capital of France is")
    out = llm.generate(p, GREEDY, lora="ad")[0].outputs[0]
    assert len(steps) >= 7 and all(n > 0 for n in steps)  # every step ran natively, adapter rows in it
    ids = torch.tensor([p["prompt_token_ids"] + out.token_ids])
    with torch.no_grad():
        logits = peft_model(input_ids=ids).logits[0].float()
    n = len(p["prompt_token_ids"])
    want = logits[n - 1 : -1].log_softmax(-1)
    assert out.token_ids == want.argmax(-1).tolist()
    chosen = want.gather(1, torch.tensor(out.token_ids)[:, None])[:, 0]
    torch.testing.assert_close(torch.tensor(out.token_logprobs), chosen, rtol=0, atol=1e-4)
    torch_path = engine(base, native_decode="off")
    torch_path.engine.add_lora(load_peft_dir(tmp_path / "ad", name="ad"))
    assert_same_outputs([llm.generate(p, GREEDY, lora="ad")[0]], torch_path.generate(p, GREEDY, lora="ad"))


def test_mixed_batch_in_the_native_step_equals_each_request_alone(base, tok):
    adapters = [random_adapter(base, "a", seed=10, rank=4), random_adapter(base, "b", seed=11, rank=16)]
    llm = engine(base, *adapters)
    steps = native_lora_steps(llm)
    prompts = [prompt(tok, t) for t in TEXTS] * 2
    loras = ["a", None, "b", "b", None, "a", None, "b", "a", None]
    together = llm.generate(prompts, GREEDY, lora=loras)
    assert 6 in steps  # decode steps mixing both adapters' rows and base rows ran natively
    alone_engine = engine(base, *adapters, enable_prefix_caching=False)
    alone = [alone_engine.generate(p, GREEDY, lora=lo)[0] for p, lo in zip(prompts, loras, strict=True)]
    assert_same_outputs(together, alone)
    torch_path = engine(base, *adapters, native_decode="off").generate(prompts, GREEDY, lora=loras)
    assert_same_outputs(together, torch_path)
    assert len({tuple(t.outputs[0].token_ids) for t in together[:3]}) == 3  # a, base and b differ


def test_loading_and_unloading_update_what_the_native_step_reads(base, tok):
    llm = engine(base, random_adapter(base, "x", seed=1), random_adapter(base, "y", seed=2))
    fused = llm.engine.runner.path(NativeDecode)
    p = prompt(tok, "Adapters come and go")
    first_x = llm.generate(p, GREEDY, lora="x")[0]
    llm.generate(p, GREEDY, lora="y")
    x_id = llm.engine.loras.registry.resolve("x").lora_id
    assert x_id in fused.loras.tables
    x_a = weakref.ref(llm.engine.runner.lora.weights[x_id]["model.layers.0.self_attn.q_proj"][0])
    llm.engine.remove_lora("x")
    assert x_id not in fused.loras.tables  # gone with the weights: no pointer into them is left
    gc.collect()
    assert x_a() is None  # and nothing the native step keeps holds the weights alive
    step = ForwardStep(
        inputs=synthetic_decode(llm.engine.runner.pool, llm.engine.runner.attention, 1, 4, 100)
    )
    step.inputs.lora = LoraRows.of([x_id])
    with pytest.raises(RuntimeError, match=f"adapter id {x_id}, which is not loaded"):
        fused(step)  # refused before the native call, never read
    new_x = random_adapter(base, "x", seed=5)
    llm.engine.add_lora(new_x)
    steps = native_lora_steps(llm)
    again = llm.generate(p, GREEDY, lora="x")[0]
    assert len(steps) >= 7 and all(n > 0 for n in steps)
    fresh = engine(base, new_x, native_decode="off").generate(p, GREEDY, lora="x")
    assert_same_outputs([again], fresh)
    assert again.outputs[0].token_ids != first_x.outputs[0].token_ids  # the new weights, not the old


def test_new_version_in_the_native_step_while_old_requests_finish(base, tok):
    """An adapter-only update (a new version under the same name) while a request runs on the old one: both
    versions' rows share native steps, each with its own weights."""
    llm = engine(base)
    v1, v2 = random_adapter(base, "live", seed=1), random_adapter(base, "live", seed=2)
    llm.engine.add_lora(v1, version=1)
    steps = native_lora_steps(llm)
    p = prompt(tok, "Versions side by side")
    long = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True, logprobs=0)
    old = llm.engine.add_request(p, long, lora="live")
    llm.engine.step()
    llm.engine.add_lora(v2, version=2, replace=True)
    new = llm.engine.add_request(p, long, lora="live")
    outs = {}
    while llm.engine.has_unfinished:
        for o in llm.engine.step():
            if o.finished:
                outs[o.request_id] = o
    assert 2 in steps  # a native step carried both versions' rows
    assert len(llm.engine.runner.path(NativeDecode).loras.tables) == 1  # the old version's table went with it
    for rid, adapter in ((old, v1), (new, v2)):
        want = engine(base, adapter, native_decode="off").generate(p, long, lora="live")
        assert_same_outputs([outs[rid]], want)
