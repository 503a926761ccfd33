"""Adapter-only weight updates into a multi-LoRA engine: a trainer's update (PEFT-named tensors over a data
plane) registers a new version of the adapter, requests running on the old version finish on it, new ones get
the new version, and the base model's prefix cache survives (its weights did not change)."""

from __future__ import annotations

import copy

from tests.lora.test_serving_engine import OPTIONS, prompt, random_adapter
from tests.tiny_llama import embedded_tokenizer, tiny_llama
from vriksha import LLM, SamplingParams
from vriksha.weights.adapter_update import AdapterMeta
from vriksha.weights.counters import CopyCounter
from vriksha.weights.fs import FsSender
from vriksha.weights.receiver import WeightUpdater

LONG = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)


def _push(updater: WeightUpdater, engine, token: str, sender: FsSender, adapter, version: int) -> dict:
    tensors = list(adapter.peft_state_dict().items())
    updater.start(token, version, engine.weight_version, adapter=AdapterMeta.of(adapter).to_json())
    info = sender.prepare(tensors, CopyCounter(), version=version)
    updater.update(engine, token, info)
    return updater.finish(engine, token)


def test_adapter_update_serves_a_new_version_beside_the_running_one(tmp_path):
    tok = embedded_tokenizer()
    base = tiny_llama(tok, initializer_range=0.2).eval()
    v1, v2 = random_adapter(base, "policy", seed=1), random_adapter(base, "policy", seed=2)
    llm = LLM.from_module(copy.deepcopy(base), tok, **OPTIONS)
    engine = llm.engine
    updater = WeightUpdater()
    token = updater.claim("trainer")
    updater.init_backend("fs", {})
    sender = FsSender(tmp_path)
    p = prompt(tok, "An update arrives while a request is running")
    engine.add_request(p, LONG)  # the base model's prompt: its cached K/V must survive the updates
    while engine.has_unfinished:
        engine.step()
    assert _push(updater, engine, token, sender, v1, 1)["version"] == 1
    old = engine.add_request(p, LONG, lora="policy")
    engine.step()
    assert _push(updater, engine, token, sender, v2, 2)["version"] == 2  # while `old` runs on version 1
    new = engine.add_request(p, LONG, lora="policy")
    base_again = engine.add_request(p, LONG)
    outs = {}
    while engine.has_unfinished:
        for o in engine.step():
            if o.finished:
                outs[o.request_id] = o
    assert outs[old].weight_version == 1 and outs[new].weight_version == 2
    assert outs[base_again].num_cached_tokens > 0  # the base model's cache was not flushed
    assert len(engine.runner.lora.weights) == 1  # version 1 left with its last request
    for adapter, rid in ((v1, old), (v2, new)):
        solo = LLM.from_module(copy.deepcopy(base), tok, **OPTIONS)
        solo.engine.add_lora(adapter)
        want = solo.generate(p, LONG, lora="policy")[0].outputs[0].token_ids
        assert outs[rid].outputs[0].token_ids == want
    assert set(updater.adapters.digests()) == set(v2.peft_state_dict())
