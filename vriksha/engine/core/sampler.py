"""Logits -> sampled token ids and their log-probabilities (greedy, temperature, top-k, top-p, min-p, seeds).

Penalties, logit bias, token restrictions and grammar masks (`logits_processing`) shape what is sampled; the
log-probabilities returned are those of the model's distribution before them.

A seeded request's random draw for its output token at position p depends on (seed, p) alone, never on how
many draws came before: so a step that scores several positions of one request at once (speculative decoding)
samples each exactly as one-token steps would, and a draw made for a position that is then thrown away
changes nothing after it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from vriksha.device import is_host
from vriksha.engine.core.logits_processing import (
    MaskKernel,
    apply_bitmask,
    apply_penalties,
    apply_restrictions,
    bitmask_in_place,
)
from vriksha.engine.core.request import Request


@dataclass(slots=True)
class SampleResult:
    token_ids: list[int]
    logprobs: list[float]  # log-probability of each sampled token under the model's distribution
    top_logprobs: list[dict[int, float] | None]


GreedyPick = Callable[[torch.Tensor], "tuple[list[int], list[float]] | None"]


class Sampler:
    def __init__(
        self, seed: int = 0, greedy_pick: GreedyPick | None = None, mask_kernel: MaskKernel | None = None
    ) -> None:
        """`greedy_pick`: a fused argmax and log-probability over CPU float32 logits (the native kernels'),
        taken when every row is greedy, unshaped and asks no top log-probabilities; `mask_kernel`: applies
        grammar masks to the logits in place (the platform's native kernel). Both are chosen at load."""
        self.generator = torch.Generator().manual_seed(seed)
        self._keyed = torch.Generator()  # re-seeded per (request seed, position)
        self.greedy_pick = greedy_pick
        self.mask_kernel = mask_kernel

    def __call__(
        self,
        logits: torch.Tensor,
        requests: list[Request],
        bitmask: tuple[list[int], torch.Tensor] | None = None,
        offsets: list[int] | None = None,
    ) -> SampleResult:
        """`bitmask`: (rows, int32 masks) of the requests constrained by a grammar this step; on the CPU the
        native kernel masks those rows of `logits` in place (no copy: the caller's logits are spent). `offsets`:
        row i samples the request's output token at len(output) + offsets[i] (default 0: the next one); a
        request may fill several rows."""
        logits = logits.float()
        if self._plain_greedy(logits, requests, bitmask):
            picked = self.greedy_pick(logits)
            if picked is not None:
                ids, lps = picked
                tops = [
                    None if r.params.logprobs is None else {ids[i]: lps[i]} for i, r in enumerate(requests)
                ]
                return SampleResult(ids, lps, tops)
        logprobs = torch.log_softmax(logits, dim=-1)
        shaped = any(_shaped(r) for r in requests)
        if shaped or (bitmask is not None and not bitmask_in_place(logits, self.mask_kernel)):
            logits = logits.clone()
        if shaped:
            apply_restrictions(logits, requests)
            apply_penalties(logits, requests)
        if bitmask is not None:
            apply_bitmask(logits, *bitmask, kernel=self.mask_kernel)
        greedy = [r.params.greedy for r in requests]
        if all(greedy):
            token_ids = logits.argmax(dim=-1)
        else:
            probs = self._filtered_probs(logits, requests)
            # exponential race: argmax(p / E) with E ~ Exp(1) draws from p (and is far cheaper than multinomial)
            # the noise is drawn on the host from each request's own generator, so a seed gives the same
            # samples on every device
            noise = torch.empty(probs.shape, dtype=probs.dtype)
            for i, req in enumerate(requests):
                if req.seed is None:
                    gen = self.generator
                else:
                    position = len(req.output_token_ids) + (offsets[i] if offsets is not None else 0)
                    gen = self._keyed.manual_seed(draw_seed(req.seed, position))
                noise[i].exponential_(generator=gen)
            token_ids = (probs / noise.to(probs.device)).argmax(dim=-1)
            if any(greedy):
                chosen = torch.tensor(greedy, device=logits.device)
                token_ids = torch.where(chosen, logits.argmax(dim=-1), token_ids)
        ids = token_ids.tolist()
        sampled_lp = logprobs.gather(1, token_ids.view(-1, 1)).view(-1).tolist()
        tops: list[dict[int, float] | None] = [None] * len(requests)
        k_max = max((r.params.logprobs or 0) for r in requests)
        if k_max > 0 or any(r.params.logprobs is not None for r in requests):
            top_v, top_i = logprobs.topk(k_max, dim=-1) if k_max > 0 else (None, None)
            for i, req in enumerate(requests):
                k = req.params.logprobs
                if k is None:
                    continue
                entry = {ids[i]: sampled_lp[i]}
                if k > 0:
                    entry.update(zip(top_i[i, :k].tolist(), top_v[i, :k].tolist(), strict=True))
                tops[i] = entry
        return SampleResult(ids, sampled_lp, tops)

    def _plain_greedy(self, logits: torch.Tensor, requests: list[Request], bitmask) -> bool:
        return (
            self.greedy_pick is not None
            and bitmask is None
            and is_host(logits.device)
            and logits.dim() == 2
            and logits.is_contiguous()
            and all(r.params.greedy and not r.params.logprobs and not _shaped(r) for r in requests)
        )

    @staticmethod
    def _filtered_probs(logits: torch.Tensor, requests: list[Request]) -> torch.Tensor:
        device = logits.device
        temps = torch.tensor(
            [max(r.params.temperature, 1e-5) for r in requests], dtype=logits.dtype, device=device
        )
        scaled = logits / temps[:, None]
        top_k = [r.params.top_k for r in requests]
        top_p = [r.params.top_p for r in requests]
        min_p = [r.params.min_p for r in requests]
        if any(k > 0 for k in top_k) or any(p < 1.0 for p in top_p):
            sorted_logits, sorted_idx = scaled.sort(dim=-1, descending=True)
            remove = torch.zeros_like(sorted_logits, dtype=torch.bool)
            vocab = logits.shape[-1]
            ks = torch.tensor([k if k > 0 else vocab for k in top_k], device=device)
            remove |= torch.arange(vocab, device=device)[None, :] >= ks[:, None]
            sorted_probs = sorted_logits.softmax(dim=-1)
            cum = sorted_probs.cumsum(dim=-1)
            ps = torch.tensor(top_p, dtype=cum.dtype, device=device)
            remove |= (cum - sorted_probs) > ps[:, None]  # keep the smallest set whose mass reaches top_p
            sorted_logits = sorted_logits.masked_fill(remove, float("-inf"))
            scaled = torch.empty_like(scaled).scatter_(1, sorted_idx, sorted_logits)
        probs = scaled.softmax(dim=-1)
        if any(p > 0 for p in min_p):
            mp = torch.tensor(min_p, dtype=probs.dtype, device=device)
            threshold = probs.max(dim=-1, keepdim=True).values * mp[:, None]
            probs = probs.masked_fill(probs < threshold, 0.0)
            probs = probs / probs.sum(dim=-1, keepdim=True)
        return probs


_MASK64 = (1 << 64) - 1


def draw_seed(seed: int, position: int) -> int:
    """The generator seed of a seeded request's draw at output position `position` (splitmix64 of both)."""
    z = (seed * 0x9E3779B97F4A7C15 + position + 1) & _MASK64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK64
    return z ^ (z >> 31)


def _shaped(req: Request) -> bool:
    p = req.params
    return bool(p.penalized or p.logit_bias or p.allowed_token_ids or req.bad_word_ids)
