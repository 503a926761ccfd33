"""Attention with terms SDPA cannot express: tanh soft-capping of the logits (Gemma 2) and per-head attention
sinks (a learned logit that takes part in the softmax and is then dropped, GPT-OSS). The scores are computed
explicitly over gathered K/V, for a layer that has such terms, whatever backend the engine chose."""

from __future__ import annotations

import torch

from vriksha.engine.attention.backend import LayerCall
from vriksha.engine.attention.batch import AttentionBatch
from vriksha.engine.attention.gathering import GatheringAttention, gather_prefill_kv


class ExplicitSoftmaxAttention(GatheringAttention):
    """Decode rows and prefill chunks over gathered K/V, their scores soft-capped and/or joined by the sinks."""

    name = "explicit softmax (soft-capping or attention sinks)"

    def __init__(self, softcap: float | None, sinks: torch.Tensor | None) -> None:
        super().__init__()
        self.softcap = softcap
        self.sinks = sinks  # [H]

    @classmethod
    def of(cls, module: torch.nn.Module, kwargs: dict) -> ExplicitSoftmaxAttention | None:
        """The backend for a layer with such terms, or None when SDPA expresses the layer."""
        softcap = kwargs.get("softcap") or getattr(module, "attn_logit_softcapping", None)
        sinks = kwargs.get("s_aux")
        if sinks is None:
            sinks = getattr(module, "sinks", None)
        if not softcap and sinks is None:
            return None
        return cls(float(softcap) if softcap else None, sinks)

    def decode_rows(self, call: LayerCall, q, k, v, mask: torch.Tensor) -> torch.Tensor:
        sinks = None if self.sinks is None else self.sinks.view(1, call.num_kv_heads, call.group, 1)
        return self.scores_softmax(q, k, v, mask, call.scaling, sinks)

    def prefill(self, call: LayerCall, batch: AttentionBatch, index: int) -> torch.Tensor:
        seg = batch.prefills[index]
        s, n = seg.q_start, seg.q_len
        q = call.query[:, :, s : s + n]
        k, v = gather_prefill_kv(call, seg)
        mask = batch.prefill_mask(index, call.window)
        if mask is None:
            mask = torch.ones(n, n, dtype=torch.bool, device=q.device).tril()
        sinks = None if self.sinks is None else self.sinks.view(1, call.num_heads, 1, 1)
        group = call.group
        k, v = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)
        return self.scores_softmax(q.to(k.dtype), k, v, mask, call.scaling, sinks)[0].transpose(0, 1)

    def scores_softmax(self, q, k, v, mask, scale, sinks) -> torch.Tensor:
        """q [.., Tq, D], k/v [.., Tk, D] with matching heads; mask bool, broadcastable to [.., Tq, Tk]."""
        scale = scale if scale is not None else q.shape[-1] ** -0.5
        scores = torch.matmul(q, k.transpose(-1, -2)).float() * scale
        if self.softcap is not None:
            scores = torch.tanh(scores / self.softcap) * self.softcap
        scores = scores.masked_fill(~mask, float("-inf"))
        if sinks is not None:
            sink = sinks.float().expand(*scores.shape[:-1], 1)
            scores = torch.cat([scores, sink], dim=-1)
            probs = torch.softmax(scores - scores.amax(dim=-1, keepdim=True), dim=-1)[..., :-1]
        else:
            probs = torch.softmax(scores, dim=-1)
        return torch.matmul(probs.to(v.dtype), v)
