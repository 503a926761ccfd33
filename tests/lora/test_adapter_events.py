"""KV cache events say which LoRA adapter a cached path belongs to, and the router's mirror keys paths by it:
an adapter's blocks never look like the base model's, in vriksha's stream or in vLLM's block events."""

from __future__ import annotations

import copy

import httpx

from tests.lora.test_serving_engine import GREEDY, OPTIONS, prompt, random_adapter
from tests.tiny_llama import embedded_tokenizer, tiny_llama
from vriksha.kv_events.schema import EventBatch, PrefixRemoved, PrefixStored, adapter_key, keyed
from vriksha.kv_events.vllm_blocks import BlockView
from vriksha.router.subscriber import EventSubscriber


class Recorder:
    def __init__(self) -> None:
        self.stored_events: list[tuple[list[int], str | None]] = []
        self.removed_events: list[tuple[list[int], str | None]] = []

    def stored(self, parent, token_ids, slots=None, lora_name=None) -> None:
        self.stored_events.append(([*parent, *token_ids], lora_name))

    def removed(self, parent, token_ids, lora_name=None) -> None:
        self.removed_events.append(([*parent, *token_ids], lora_name))

    def cleared(self) -> None:
        pass


def test_engine_events_carry_the_adapter():
    from vriksha.engine.config import EngineConfig
    from vriksha.engine.core.llm_engine import LLMEngine

    tok = embedded_tokenizer()
    base = tiny_llama(tok, initializer_range=0.2).eval()
    sink = Recorder()
    engine = LLMEngine(EngineConfig.from_flat(**OPTIONS), copy.deepcopy(base), tok, cache_events=sink)
    engine.add_lora(random_adapter(base, "x", seed=1))
    p = prompt(tok, "Which adapter cached this prompt?")
    for lora in ("x", None):
        engine.add_request(p, GREEDY, lora=lora)
        while engine.has_unfinished:
            engine.step()
    names = {name for _, name in sink.stored_events}
    assert names == {"x", None}
    ids = p["prompt_token_ids"]
    for name in ("x", None):
        assert any(path[: len(ids)] == ids for path, n in sink.stored_events if n == name)
    engine.remove_lora("x")  # no request runs on it: its tree leaves, and the events say so
    assert sink.removed_events and {n for _, n in sink.removed_events} == {"x"}


def test_vllm_blocks_of_an_adapter_are_tagged_and_hash_apart():
    view = BlockView(4)
    tokens = list(range(12))
    base = view.stored(tokens, 0)
    adapted = view.stored(tokens, 0, "x")
    assert base.lora_name is None and base.lora_id is None
    assert adapted.lora_name == "x" and adapted.lora_id == adapter_key("x")
    assert not set(base.block_hashes) & set(adapted.block_hashes)
    removed = view.removed(tokens, 4, "x")
    assert removed.block_hashes == adapted.block_hashes[-1:]


def test_router_mirror_keys_paths_by_adapter():
    sub = EventSubscriber(
        "r0", "tcp://127.0.0.1:1", "http://127.0.0.1:1/kv_events/snapshot", httpx.AsyncClient()
    )
    tokens = [5, 6, 7, 8]
    sub.apply(EventBatch(0.0, [PrefixStored(tokens, 0, "x")]))
    assert sub.tree.match(tokens) == 0  # the base model has none of it
    assert sub.tree.match(keyed(tokens, "x")) == len(tokens) + 1
    assert sub.tree.match(keyed(tokens, "y")) == 0
    assert sub.adapters == {"x"}
    sub.apply(EventBatch(0.0, [PrefixStored(tokens, 0), PrefixRemoved(tokens, 2, "x")]))
    assert sub.tree.match(tokens) == 4 and sub.tree.match(keyed(tokens, "x")) == 3
