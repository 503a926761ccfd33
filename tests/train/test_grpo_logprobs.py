"""Shared-prefix log-probs equal per-sequence log-probs, values and gradients."""

import pytest
import torch
from transformers import AutoModelForCausalLM, LlamaConfig

from vriksha.train.batch import collate_groups
from vriksha.train.logprobs import (
    SUB_BATCH_OVERHEAD_TOKENS,
    completion_logprobs,
    grown_plan,
    length_sub_batches,
)
from vriksha.train.rollout import Episode


def _tiny():
    torch.manual_seed(0)
    cfg = LlamaConfig(
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        intermediate_size=64,
        vocab_size=97,
        tie_word_embeddings=True,
    )
    return AutoModelForCausalLM.from_config(cfg).eval()


def _episode(group, member, prompt, completion, mask=None):
    return Episode(
        group=group,
        member=member,
        seed=0,
        prompt_ids=prompt,
        completion_ids=completion,
        engine_logprobs=[0.0] * len(completion),
        loss_mask=mask or [1] * len(completion),
    )


@pytest.mark.parametrize(
    "overhead", [SUB_BATCH_OVERHEAD_TOKENS, 0, 2], ids=["one-pass", "by-length", "split"]
)
def test_shared_prefix_matches_full_sequences(overhead):
    """In one completion forward, or in sub-batches of similar length (each to its own longest row)."""
    model = _tiny()
    g = torch.Generator().manual_seed(1)

    def ids(n):
        return torch.randint(1, 97, (n,), generator=g).tolist()

    p0, p1 = ids(7), ids(4)
    groups = [
        [_episode(0, 0, p0, ids(5)), _episode(0, 1, p0, ids(2)), _episode(0, 2, p0, ids(1))],
        [
            _episode(1, 0, p1, ids(3)),
            _episode(1, 1, p1, ids(6), [1, 1, 0, 0, 1, 1]),
            _episode(1, 2, p1, ids(4)),
        ],
    ]
    batch = collate_groups(groups, [[1.0, -1.0, 0.0], [0.5, 0.5, -1.0]], pad_id=0)
    seen = []
    handle = model.lm_head.register_forward_hook(lambda m, a, out: seen.append(tuple(out.shape[:2])))
    out = completion_logprobs(model, batch, with_entropy=True, overhead_tokens=overhead)
    handle.remove()
    forwards = len(seen) - 1  # the first is the prompts' last position
    assert forwards == {SUB_BATCH_OVERHEAD_TOKENS: 1, 0: 5, 2: 2}[overhead], seen
    assert out.logprobs.isfinite().all() and out.entropy.isfinite().all()
    loss_shared = (out.logprobs * batch.loss_mask).sum()
    loss_shared.backward()
    grads_shared = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()

    total = 0.0
    for j, e in enumerate([e for grp in groups for e in grp]):
        seq = torch.tensor([e.prompt_ids + e.completion_ids])
        logits = model(input_ids=seq).logits[0].float()
        lp = logits.log_softmax(-1)
        start = len(e.prompt_ids) - 1
        ref = lp[start : start + len(e.completion_ids)].gather(-1, torch.tensor(e.completion_ids)[:, None])[
            :, 0
        ]
        n = len(e.completion_ids)
        assert torch.allclose(out.logprobs[j, :n], ref, atol=1e-5), j
        p = lp[start : start + n].exp()
        ent = -(p * lp[start : start + n]).sum(-1)
        assert torch.allclose(out.entropy[j, :n], ent, atol=1e-4)
        total = total + (ref * torch.tensor(e.loss_mask, dtype=torch.float32)).sum()
    total.backward()
    for a, b in zip(grads_shared, [p.grad for p in model.parameters()], strict=True):
        assert torch.allclose(a, b, atol=1e-5)


def _batch():
    g = torch.Generator().manual_seed(2)

    def ids(n):
        return torch.randint(1, 97, (n,), generator=g).tolist()

    p0, p1 = ids(5), ids(3)
    groups = [
        [_episode(0, 0, p0, ids(7)), _episode(0, 1, p0, ids(3))],
        [_episode(1, 0, p1, ids(6), [1, 0, 1, 1, 0, 1]), _episode(1, 1, p1, ids(1))],
    ]
    return collate_groups(groups, [[1.0, -1.0], [0.5, -0.5]], pad_id=0)


def _loss_and_grads(model, batch, chunk_tokens):
    model.zero_grad()
    out = completion_logprobs(model, batch, with_entropy=True, chunk_tokens=chunk_tokens)
    weights = torch.linspace(-1.0, 1.0, batch.loss_mask.numel()).view_as(batch.loss_mask)
    (out.logprobs * batch.loss_mask * weights).sum().backward()
    return out, {n: p.grad.clone() for n, p in model.named_parameters()}


def test_chunked_head_equals_one_piece():
    """The LM head and log-softmax over chunks of positions (checkpointed, recomputed in backward)
    give the log-probs, entropies and gradients of the whole completion at once."""
    model, batch = _tiny(), _batch()
    whole, grads_whole = _loss_and_grads(model, batch, chunk_tokens=0)
    mask = batch.completion_mask.bool()
    for chunk in (1, 4, 9):  # one position per chunk, two, an uneven split
        part, grads_part = _loss_and_grads(model, batch, chunk_tokens=chunk)
        torch.testing.assert_close(part.logprobs[mask], whole.logprobs[mask], rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(part.entropy[mask], whole.entropy[mask], rtol=1e-5, atol=1e-6)
        for name, grad in grads_whole.items():
            assert grad.abs().sum() > 0, name
            torch.testing.assert_close(grads_part[name], grad, rtol=1e-5, atol=1e-7, msg=name)
    with torch.no_grad():  # the reference model's path: chunks without checkpointing
        ref = completion_logprobs(model, batch, chunk_tokens=2).logprobs
    torch.testing.assert_close(ref[mask], whole.logprobs[mask].detach(), rtol=1e-5, atol=1e-6)


def test_chunked_head_keeps_one_chunk_of_logits():
    """During the chunked forward, the LM head never sees more than one chunk of positions."""
    model, batch = _tiny(), _batch()
    seen = []
    handle = model.lm_head.register_forward_hook(lambda m, a, out: seen.append(out.shape[:2].numel()))
    try:
        completion_logprobs(model, batch, chunk_tokens=4)
    finally:
        handle.remove()
    rows = batch.completion_ids.shape[0]
    assert max(seen) <= 4 and len(seen) > 2
    assert sum(seen) >= rows * (batch.completion_ids.shape[1] - 1)


def test_length_sub_batches_cut_where_padding_costs_more_than_a_forward():
    lengths = [31, 8, 8, 7, 8, 0, 8, 6, 8]
    assert length_sub_batches(lengths, 200) == [[0, 1, 2, 4, 6, 8, 3, 7]]  # 8 x 31 + 200 < two forwards
    assert length_sub_batches(lengths, 8) == [[0], [1, 2, 4, 6, 8, 3, 7]]  # the long row alone
    assert length_sub_batches(lengths, 0) == [[0], [1, 2, 4, 6, 8], [3], [7]]
    assert length_sub_batches([0, 0], 0) == []
    many = [32] + [9] * 47  # the demo's shape: one completion ran to the limit
    assert length_sub_batches(many, SUB_BATCH_OVERHEAD_TOKENS) == [[0], list(range(1, 48))]


def test_grown_plan_splits_the_widest_then_adds_forwards_that_count_zero():
    assert grown_plan([[0], [1, 2, 3, 4]], 3) == [[0], [1, 2], [3, 4]]
    assert grown_plan([[0], [1, 2]], 4) == [[0], [1], [2], None]
    assert grown_plan([], 2) == [None, None]
    assert grown_plan([[0, 1]], 1) == [[0, 1]]


@pytest.mark.parametrize("more", [1, 3, 8])
def test_more_forwards_for_other_ranks_change_nothing(more):
    """A rank that runs extra completion forwards (other ranks' plans were longer) gets the log-probs,
    entropies and gradients of its own plan, whether it splits its sub-batches or adds zero forwards."""
    model, batch = _tiny(), _batch()
    whole, grads_whole = _loss_and_grads(model, batch, chunk_tokens=0)
    counts = []

    def agree(count):
        counts.append(count)
        return count + more

    model.zero_grad()
    out = completion_logprobs(model, batch, with_entropy=True, chunk_tokens=0, overhead_tokens=0, agree=agree)
    weights = torch.linspace(-1.0, 1.0, batch.loss_mask.numel()).view_as(batch.loss_mask)
    (out.logprobs * batch.loss_mask * weights).sum().backward()
    mask = batch.completion_mask.bool()
    assert counts == [3]  # completion lengths 7, 3, 6, 1: three forwards (the one-token row needs none)
    torch.testing.assert_close(out.logprobs[mask], whole.logprobs[mask], rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(out.entropy[mask], whole.entropy[mask], rtol=1e-5, atol=1e-6)
    for name, p in model.named_parameters():
        torch.testing.assert_close(p.grad, grads_whole[name], rtol=1e-5, atol=1e-7, msg=name)


def test_one_token_completions_still_run_the_forwards_other_ranks_run():
    model = _tiny()
    g = torch.Generator().manual_seed(3)
    prompt = torch.randint(1, 97, (4,), generator=g).tolist()
    batch = collate_groups([[_episode(0, 0, prompt, [5]), _episode(0, 1, prompt, [9])]], [[1.0, -1.0]], 0)
    alone = completion_logprobs(model, batch).logprobs
    seen = []
    handle = model.lm_head.register_forward_hook(lambda m, a, out: seen.append(out.shape[:2].numel()))
    out = completion_logprobs(model, batch, agree=lambda count: count + 2)
    handle.remove()
    assert len(seen) == 3  # the prompts' last position, then two forwards that count zero
    torch.testing.assert_close(out.logprobs, alone)
    out.logprobs.sum().backward()
    assert all(p.grad is not None and p.grad.isfinite().all() for p in model.parameters())


def _entropy_grads(model, batch, chunk_tokens):
    model.zero_grad()
    out = completion_logprobs(model, batch, with_entropy=True, chunk_tokens=chunk_tokens, entropy_grad=True)
    (out.entropy * batch.loss_mask).sum().backward()
    return out, {n: p.grad.clone() for n, p in model.named_parameters()}


def test_entropy_with_its_gradient_in_chunks_and_in_one_piece():
    """An entropy bonus: the entropy keeps its gradient, chunked or not, equal to per-sequence forwards."""
    model, batch = _tiny(), _batch()
    whole, grads_whole = _entropy_grads(model, batch, chunk_tokens=0)
    assert whole.entropy.requires_grad
    mask = batch.completion_mask.bool()
    for chunk in (1, 4):
        part, grads_part = _entropy_grads(model, batch, chunk_tokens=chunk)
        torch.testing.assert_close(part.entropy[mask], whole.entropy[mask].detach(), rtol=1e-5, atol=1e-6)
        for name, grad in grads_whole.items():
            torch.testing.assert_close(grads_part[name], grad, rtol=1e-5, atol=1e-7, msg=name)
    # the reference: each sequence's full forward, entropy of its completion positions
    model.zero_grad()
    total = 0.0
    for j in range(batch.num_sequences):
        g = j // batch.group_size
        prompt = batch.prompt_ids[g][batch.prompt_mask[g].bool()]
        n = int(batch.completion_mask[j].sum())
        seq = torch.cat([prompt, batch.completion_ids[j, :n]])[None]
        lp = model(input_ids=seq).logits[0].float().log_softmax(-1)[len(prompt) - 1 : len(prompt) - 1 + n]
        ent = -(lp.exp() * lp).sum(-1)
        total = total + (ent * batch.loss_mask[j, :n]).sum()
    total.backward()
    for name, p in model.named_parameters():
        assert grads_whole[name].abs().sum() > 0, name
        torch.testing.assert_close(grads_whole[name], p.grad, rtol=1e-4, atol=1e-6, msg=name)
