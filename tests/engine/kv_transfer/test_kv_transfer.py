"""K/V transfer between two engines in one process: a prompt prefilled on one, moved over each transport into
the other's radix tree, decodes to the same greedy tokens as colocated serving; failures and timeouts of
either side leave every slot owned by the free list or the tree (no stranded memory)."""

from __future__ import annotations

import asyncio
import copy
import os

import pytest
import torch

from tests.tiny_llama import embedded_tokenizer, tiny_llama
from vriksha.engine.config import EngineConfig
from vriksha.engine.core.async_engine import AsyncEngine
from vriksha.engine.core.llm_engine import LLMEngine
from vriksha.engine.core.sampling_params import SamplingParams
from vriksha.engine.kv_transfer import (
    DecodeSide,
    Descriptor,
    KVTransferError,
    PrefillSide,
    accepted,
    host_id,
)
from vriksha.engine.kv_transfer.shm import ShmSink, ShmSource
from vriksha.engine.kv_transfer.stream import StreamSink, StreamSource

OPTS = dict(chunked_prefill_size=16, max_num_batched_tokens=64, kv_cache_memory_gb=0.002, max_model_len=256)


@pytest.fixture(scope="module")
def model_and_tok():
    tok = embedded_tokenizer()
    return tiny_llama(tok, max_position_embeddings=256).eval(), tok


def make_engine(model_and_tok) -> AsyncEngine:
    model, tok = model_and_tok
    return AsyncEngine(LLMEngine(EngineConfig(**OPTS), model=copy.deepcopy(model), tokenizer=tok))


def prompt(n: int, seed: int = 0) -> list[int]:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(10, 1000, (n,), generator=g).tolist()


GREEDY = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True)


async def final(engine: AsyncEngine, tokens: list[int], params: SamplingParams = GREEDY):
    last = None
    async for out in engine.generate({"prompt_token_ids": tokens}, params):
        last = out
    return last


def owned_everywhere(engine: AsyncEngine) -> None:
    """Every usable slot is free or in the tree, each once (nothing held by a transfer or a lock)."""
    e = engine.engine
    free = e.allocator.free_slot_set()
    tree = e.cache.slot_set()
    assert not free & tree
    assert len(free) + len(tree) == e.allocator.capacity
    assert e.cache.tree.protected_size() == 0


class LocalPeer:
    """The prefill replica in the same process: what the server's HTTP peer does."""

    def __init__(self, engine: AsyncEngine, side: PrefillSide, transport: str = "auto") -> None:
        self.engine, self.side, self.transport = engine, side, transport
        self.released = 0

    async def prefill(self, tokens: list[int], start: int) -> Descriptor:
        await final(self.engine, tokens, SamplingParams(max_tokens=1, temperature=0.0))
        return await self.side.offer(tokens, start, accepted(self.transport), host_id())

    async def release(self, desc: Descriptor) -> None:
        self.released += 1
        await self.side.release(desc.transfer_id)


def sides(p: AsyncEngine, d: AsyncEngine, hold_s: float = 30.0, timeout_s: float = 10.0):
    sources = {"shm": ShmSource(), "stream": StreamSource("tcp://127.0.0.1:*")}
    prefill = PrefillSide(p.call, p.engine.pool, sources, hold_s)
    decode = DecodeSide(d.call, d.engine.pool, {"shm": ShmSink(), "stream": StreamSink()}, timeout_s)
    return prefill, decode


@pytest.mark.parametrize("transport", ["shm", "stream"])
def test_transferred_prompt_decodes_as_colocated(model_and_tok, transport) -> None:
    async def run() -> None:
        p, d, c = (make_engine(model_and_tok) for _ in range(3))
        for e in (p, d, c):
            await e.start()
        prefill, decode = sides(p, d)
        try:
            shared = prompt(40, seed=1)
            long_a, long_b = shared + prompt(30, seed=2), shared + prompt(25, seed=3)
            peer = LocalPeer(p, prefill, transport)
            for tokens in (long_a, long_b):  # the second finds the shared part cached on the decode side
                result = await decode.pull(tokens, peer)
                assert result.transport == transport and not result.skipped
                assert result.fetched == len(tokens) - result.cached
                out = await final(d, tokens)
                ref = await final(c, tokens)
                assert out.outputs[0].token_ids == ref.outputs[0].token_ids
                assert out.num_cached_tokens == len(tokens) - 1  # only the last prompt token was computed
            assert result.cached >= len(shared)
            for _ in range(200):  # offers are released in the background
                if peer.released == 2 and prefill.status()["offers"] == 0:
                    break
                await asyncio.sleep(0.01)
            assert peer.released == 2 and prefill.status()["offers"] == 0
            short = await decode.pull(prompt(5, seed=4), peer, min_new=16)
            assert short.skipped and peer.released == 2  # nothing asked of the prefill side
            assert decode.status()["reservations"] == 0
            for e in (p, d):
                owned_everywhere(e)
        finally:
            await prefill.close()
            await decode.close()
            for e in (p, d, c):
                await e.shutdown()

    asyncio.run(run())


def test_failed_fetch_frees_the_decode_side(model_and_tok) -> None:
    """An offer withdrawn before the fetch (the prefill replica died or timed out) fails the pull cleanly."""

    async def run() -> None:
        p, d = make_engine(model_and_tok), make_engine(model_and_tok)
        for e in (p, d):
            await e.start()
        prefill, decode = sides(p, d, timeout_s=1.0)
        try:
            for transport in ("shm", "stream"):
                tokens = prompt(50, seed=7)
                await final(p, tokens, SamplingParams(max_tokens=1))
                desc = await prefill.offer(tokens, 0, [transport], host_id())
                await prefill.release(desc.transfer_id)  # gone before the decode side fetches
                with pytest.raises(KVTransferError):
                    await decode.pull(tokens, offer=desc)
                assert decode.status()["reservations"] == 0
                owned_everywhere(d)
                assert d.engine.cache.match_len(tokens) == 0
        finally:
            await prefill.close()
            await decode.close()
            for e in (p, d):
                await e.shutdown()

    asyncio.run(run())


def test_unfetched_offers_expire(model_and_tok) -> None:
    async def run() -> None:
        p, d = make_engine(model_and_tok), make_engine(model_and_tok)
        await p.start()
        prefill, decode = sides(p, d, hold_s=0.2)
        try:
            tokens = prompt(30, seed=9)
            await final(p, tokens, SamplingParams(max_tokens=1))
            shm_desc = await prefill.offer(tokens, 0, ["shm"], host_id())
            stream_desc = await prefill.offer(tokens, 0, ["stream"], host_id())
            assert p.engine.cache.tree.protected_size() > 0  # the stream offer keeps its slots locked
            assert os.path.exists(f"/dev/shm/{shm_desc.info['name']}") or not os.path.isdir("/dev/shm")
            await asyncio.sleep(0.3)
            assert await prefill.sweep() == 2
            assert prefill.status()["offers"] == 0 and prefill.status()["expired"] == 2
            assert not os.path.exists(f"/dev/shm/{shm_desc.info['name']}")
            assert stream_desc.transfer_id not in prefill.offers
            owned_everywhere(p)
        finally:
            await prefill.close()
            await decode.close()
            await p.shutdown()

    asyncio.run(run())


def test_transport_choice() -> None:
    from vriksha.engine.kv_transfer.transport import choose_transport

    assert accepted("auto") == ["shm", "stream"]
    assert choose_transport(["shm", "stream"], ["shm", "stream"], host_id()) == "shm"
    assert choose_transport(["shm", "stream"], ["shm", "stream"], "elsewhere/boot") == "stream"
    with pytest.raises(KVTransferError, match="no K/V transport in common"):
        choose_transport(["shm"], ["shm", "stream"], "elsewhere/boot")
    with pytest.raises(KVTransferError, match="unknown K/V transport"):
        accepted("carrier-pigeon")
