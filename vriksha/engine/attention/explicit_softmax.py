"""Attention with terms SDPA cannot express: tanh soft-capping of the logits (Gemma 2) and per-head attention
sinks (a learned logit that takes part in the softmax and is then dropped, GPT-OSS). The scores are computed
explicitly over gathered K/V, for a layer that has such terms, whatever backend the engine chose."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from vriksha.engine.attention.backend import AttentionBackend, LayerCall
from vriksha.engine.attention.batch import AttentionBatch, PrefillSegment
from vriksha.engine.attention.gathering import decode_queries, gather_decode_kv, gather_prefill_kv


@dataclass(slots=True)
class ExplicitSoftmaxAttention(AttentionBackend):
    softcap: float | None
    sinks: torch.Tensor | None  # [H]

    name = "explicit softmax (soft-capping or attention sinks)"

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

    def decode(
        self, call: LayerCall, batch: AttentionBatch, k_pool: torch.Tensor, v_pool: torch.Tensor
    ) -> torch.Tensor:
        b = batch.num_decode
        k, v = gather_decode_kv(call, batch, k_pool, v_pool)
        q = decode_queries(call, b)
        sinks = None if self.sinks is None else self.sinks.view(1, call.num_kv_heads, call.group, 1)
        o = self.scores_softmax(q.to(k.dtype), k, v, batch.decode_mask(call.window), call.scaling, sinks)
        return o.reshape(b, call.num_heads, v.shape[-1])

    def prefill(
        self,
        call: LayerCall,
        batch: AttentionBatch,
        index: int,
        seg: PrefillSegment,
        k_pool: torch.Tensor,
        v_pool: torch.Tensor,
    ) -> torch.Tensor:
        s, n = seg.q_start, seg.q_len
        q = call.query[:, :, s : s + n]
        k, v = gather_prefill_kv(seg, k_pool, v_pool)
        mask = batch.prefill_mask(index, call.window)
        if mask is None:
            mask = torch.ones(n, n, dtype=torch.bool, device=q.device).tril()
        sinks = None if self.sinks is None else self.sinks.view(1, call.num_heads, 1, 1)
        group = call.group
        o = self.scores_softmax(
            q.to(k.dtype), k.repeat_interleave(group, 1), v.repeat_interleave(group, 1), mask, call.scaling, sinks
        )
        return o[0].transpose(0, 1)

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
