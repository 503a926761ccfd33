"""Log-probabilities of the prompt's own tokens (vLLM's `prompt_logprobs`, OpenAI's `echo` with `logprobs`).

A request that asks for them computes its whole prompt (no prefix-cache reuse: cached positions have no
logits) and keeps the logits of every prompt position; position p's logits score prompt token p + 1.
Only the first of a request's n sequences computes them.
"""

from __future__ import annotations

import torch

from vriksha.engine.core.request import Request


def wants_prompt_logprobs(req: Request) -> bool:
    return req.index == 0 and req.params.prompt_logprobs is not None


def prompt_positions(batch) -> list[tuple[Request, int, list[int]]]:
    """(request, flat index of its first kept position in the batch, prompt positions kept), in batch order."""
    out = []
    offset = len(batch.decodes)
    for chunk in batch.prefills:
        req = chunk.request
        if wants_prompt_logprobs(req):
            last = len(req.prompt_token_ids) - 1  # the last prompt position predicts the first output token
            positions = list(range(chunk.start, min(chunk.end, last)))
            if positions:
                out.append((req, offset, positions))
        offset += chunk.end - chunk.start
    return out


def extra_rows(batch) -> list[int]:
    """Flat token indices whose logits the model runner returns after the sampled rows."""
    return [offset + j for _, offset, positions in prompt_positions(batch) for j in range(len(positions))]


ROWS_AT_ONCE = 256  # log-softmax rows computed together: a long chunk's fp32 copy stays bounded


def record_prompt_logprobs(batch, logits: torch.Tensor) -> None:
    """Store the prompt tokens' log-probabilities (plus top-k) from the rows `extra_rows` asked for."""
    row = 0
    for req, _, positions in prompt_positions(batch):
        k = req.params.prompt_logprobs or 0
        for start in range(0, len(positions), ROWS_AT_ONCE):
            part = positions[start : start + ROWS_AT_ONCE]
            lp = torch.log_softmax(logits[row : row + len(part)].float(), dim=-1)
            row += len(part)
            targets = torch.tensor([req.prompt_token_ids[p + 1] for p in part], device=lp.device)
            chosen = lp.gather(1, targets[:, None])[:, 0].tolist()
            top_v, top_i = lp.topk(k, dim=-1) if k > 0 else (None, None)
            for j, p in enumerate(part):
                entry = {int(targets[j]): chosen[j]}
                if k > 0:
                    entry.update(zip(top_i[j].tolist(), top_v[j].tolist(), strict=True))
                req.prompt_logprobs[p + 1] = entry


def prompt_logprobs_list(req: Request) -> list[dict[int, float] | None]:
    return [None] + [req.prompt_logprobs.get(i) for i in range(1, len(req.prompt_token_ids))]
