"""The fused greedy pick (argmax and its log-probability in one native call) against torch, alone and in the
sampler."""

from __future__ import annotations

import pytest
import torch

from vriksha.engine.core.request import Request
from vriksha.engine.core.sampler import Sampler
from vriksha.engine.core.sampling_params import SamplingParams
from vriksha.engine.platform.native import kernels


@pytest.fixture(scope="module")
def lib():
    built = kernels()
    assert built is not None, "the native kernels should build on this machine (gcc is installed)"
    return built


@pytest.mark.parametrize("rows,vocab", [(1, 49152), (16, 49152), (3, 7), (5, 1001), (64, 8)])
def test_greedy_pick_is_torchs_argmax_and_log_softmax(lib, rows, vocab):
    gen = torch.Generator().manual_seed(rows * vocab)
    logits = torch.randn(rows, vocab, generator=gen) * 4
    logits[0, vocab // 3] = float("-inf")  # masked tokens weigh nothing
    ids, logprobs = lib.greedy_pick(logits)
    assert ids == logits.argmax(-1).tolist()
    want = torch.log_softmax(logits, -1).gather(1, logits.argmax(-1, keepdim=True)).view(-1)
    torch.testing.assert_close(torch.tensor(logprobs), want, rtol=1e-5, atol=1e-5)


def test_greedy_pick_takes_the_first_of_equal_maxima(lib):
    logits = torch.zeros(4, 100)
    logits[0, [3, 11, 19, 90]] = 5.0  # equal maxima in different vector lanes
    logits[1, [90, 91]] = 5.0  # in the scalar tail only
    logits[2, [12, 4]] = 5.0  # the later position in an earlier lane
    ids, logprobs = lib.greedy_pick(logits)
    assert ids == [3, 90, 4, 0] == logits.argmax(-1).tolist()
    assert logprobs[3] == pytest.approx(-torch.log(torch.tensor(100.0)).item(), rel=1e-5)


@pytest.mark.parametrize("poison", [float("nan"), float("inf")])
def test_greedy_pick_declines_rows_torch_would_answer_otherwise(lib, poison):
    logits = torch.randn(3, 40)
    logits[1, 17] = poison
    assert lib.greedy_pick(logits) is None
    assert lib.greedy_pick(torch.full((2, 40), float("-inf"))) is None


def _request(params: SamplingParams) -> Request:
    return Request("r", 0, [1, 2, 3], params, frozenset())


def test_the_sampler_takes_the_fused_pick_for_plain_greedy_rows_only(lib):
    """Greedy rows without shaping or top log-probabilities take the fused pick: the same tokens and
    log-probabilities as the general path; a sampled row in the batch sends it back to the general path."""
    calls = []

    def counting(logits):
        calls.append(logits.shape[0])
        return lib.greedy_pick(logits)

    logits = torch.randn(3, 500, generator=torch.Generator().manual_seed(3))
    greedy = [_request(SamplingParams(temperature=0, logprobs=lp)) for lp in (None, 0, None)]
    fused, general = Sampler(0, counting)(logits.clone(), greedy), Sampler(0)(logits.clone(), greedy)
    assert calls == [3]
    assert fused.token_ids == general.token_ids
    torch.testing.assert_close(torch.tensor(fused.logprobs), torch.tensor(general.logprobs))
    assert fused.top_logprobs[0] is None and fused.top_logprobs[1] == {fused.token_ids[1]: fused.logprobs[1]}
    mixed = greedy[:2] + [_request(SamplingParams(temperature=1.0, seed=5))]
    Sampler(0, counting)(logits.clone(), mixed)
    top = [_request(SamplingParams(temperature=0, logprobs=2))]
    Sampler(0, counting)(logits[:1].clone(), top)
    assert calls == [3], "a sampled row or top log-probabilities take the general path"
