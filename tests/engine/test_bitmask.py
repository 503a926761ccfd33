"""Grammar masks: llguidance's packed int32 words (bit j of word w allows token 32 w + j) applied to logits."""

import torch

from vriksha.engine.logits_processing import NEG_INF, apply_bitmask


def _reference(logits: torch.Tensor, rows: list[int], bitmask: torch.Tensor) -> torch.Tensor:
    out = logits.clone()
    for r, words in zip(rows, bitmask.tolist(), strict=True):
        for token in range(logits.shape[1]):
            w, j = divmod(token, 32)
            if w >= len(words) or not (words[w] >> j) & 1:
                out[r, token] = NEG_INF
    return out


def test_bitmask_matches_the_bit_layout_on_all_rows_and_on_a_subset():
    gen = torch.Generator().manual_seed(0)
    vocab = 100  # not a multiple of 32: the last word is partly padding
    logits = torch.randn(4, vocab, generator=gen)
    bitmask = torch.randint(-(2**31), 2**31 - 1, (4, 4), dtype=torch.int32, generator=gen)
    for rows in ([0, 1, 2, 3], [1, 3]):
        got = logits.clone()
        apply_bitmask(got, rows, bitmask[: len(rows)])
        assert torch.equal(got, _reference(logits, rows, bitmask[: len(rows)])), rows
        untouched = [r for r in range(4) if r not in rows]
        assert torch.equal(got[untouched], logits[untouched])


def test_tokens_past_the_masks_words_are_blocked():
    logits = torch.zeros(1, 70)
    apply_bitmask(logits, [0], torch.full((1, 2), -1, dtype=torch.int32))  # 64 tokens allowed
    assert torch.isfinite(logits[0, :64]).all() and (logits[0, 64:] == NEG_INF).all()
