"""The engine's forward context is per thread: a plain forward (training) in one thread while an engine
forward runs in another computes the family's own attention, as off-policy GRPO does (a producer
thread's engine plays while the trainer's thread trains)."""

from __future__ import annotations

import threading

import torch

from tests.tiny_llama import embedded_tokenizer, tiny_llama
from vriksha.engine.attention.batch import LayoutProbe
from vriksha.engine.attention.paged import forward_context, register_attention


def test_forward_in_another_thread_does_not_see_the_engine_batch():
    tok = embedded_tokenizer()
    model = tiny_llama(tok).eval()
    model.config._attn_implementation = register_attention()
    ids = torch.tensor([tok("Compute 2 + 3.")["input_ids"]])
    with torch.no_grad():
        reference = model(input_ids=ids).logits
    entered, release = threading.Event(), threading.Event()
    probe = LayoutProbe()

    def engine_thread():
        with forward_context(probe):
            entered.set()
            release.wait(30)

    t = threading.Thread(target=engine_thread)
    t.start()
    try:
        assert entered.wait(30)
        with torch.no_grad():
            during = model(input_ids=ids).logits
    finally:
        release.set()
        t.join(30)
    assert torch.equal(during, reference)
    assert probe.seen == {}  # the main thread's forward never saw the other thread's batch
