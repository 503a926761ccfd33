"""The flattened ragged batch of one step: token ids, positions, where each new token's K/V goes, what each
request attends to, and which rows are sampled."""

from __future__ import annotations

import torch

from vriksha.engine.attention.backend import AttentionBackend
from vriksha.engine.attention.batch import AttentionBatch, PrefillSegment
from vriksha.engine.core.batch import ForwardBatch
from vriksha.engine.core.kv_pool import KVPool, ReqToTokenTable
from vriksha.engine.core.prompt_logprobs import extra_rows
from vriksha.engine.platform.lora_linear import LoraRows
from vriksha.engine.runner.step import StepInputs
from vriksha.profiling import phase

# Prefill chunks of several tokens run as decode rows while the K/V positions their rows read add up to at
# most this many (about 50 MB of a bf16 pool for a 135M model's 30 layers, a few ms): a short chat turn over a
# short history qualifies, a chunk over a long cached prefix does not. One-token chunks always qualify.
CHUNK_DECODE_ROWS_MAX_READS = 2048


class StepBuilder:
    """Builds a scheduled batch's `StepInputs` over the request-to-token table, for the attention backend
    chosen at load. `decode_rows_limit`: the most rows a step may have for its prefill chunks to run as
    decode rows (the native decode step's largest batch, where there is one)."""

    def __init__(
        self, pool: KVPool, table: ReqToTokenTable, attention: AttentionBackend, decode_rows_limit: int
    ) -> None:
        self.pool = pool
        self.table = table
        self.attention = attention
        self.decode_rows_limit = decode_rows_limit
        self.device = pool.device

    def chunks_as_decode_rows(self, batch: ForwardBatch) -> bool:
        """Whether this step's prefill chunks are short enough to run as decode rows: then the step takes the
        native decode path where there is one, instead of the lean forward (whose per-step overhead is several
        decode steps' worth of time at small batches), and a prompt token is attended exactly as a decoded one
        (on every path, so that native decode on or off computes the same). Chiefly a prompt found cached but
        for its last token (a prefix-cache hit, a K/V transfer from a prefill replica, the samples of one
        prompt) and short chat turns. Each such row reads its request's K/V on its own, so the rows' summed
        context is bounded."""
        if not batch.prefills or batch.drafts:
            return False
        rows = len(batch.decodes) + sum(c.end - c.start for c in batch.prefills)
        if rows > self.decode_rows_limit:
            return False
        reads = sum(
            (c.start + 1 + c.end) * (c.end - c.start) // 2 for c in batch.prefills if c.end - c.start > 1
        )
        return reads <= CHUNK_DECODE_ROWS_MAX_READS

    def __call__(self, batch: ForwardBatch) -> StepInputs:
        with phase("engine.prepare_batch"):
            return self.build(batch)

    def build(self, batch: ForwardBatch) -> StepInputs:
        ids: list[int] = []
        positions: list[int] = []
        for req in batch.decodes:
            ids.append(req.all_token_ids[req.num_computed])
            positions.append(req.num_computed)
        for chunk in batch.prefills:
            ids.extend(chunk.request.all_token_ids[chunk.start : chunk.end])
            positions.extend(range(chunk.start, chunk.end))
        for run in batch.drafts:
            ids.extend(run.token_ids)
            positions.extend(range(run.start, run.start + run.num_tokens))
        # decode rows, (table row, tokens attended): each decode token, then each token of chunks short
        # enough to run as decode rows, attending its request's K/V up to its own position
        decode_rows = [(r.row, r.num_computed + 1) for r in batch.decodes]
        chunks = batch.prefills
        if self.chunks_as_decode_rows(batch):
            decode_rows += [(c.request.row, p + 1) for c in chunks for p in range(c.start, c.end)]
            chunks = []
        attn = AttentionBatch(
            pool=self.pool, slot_mapping=torch.empty(0), num_decode=len(decode_rows), backend=self.attention
        )
        slot_parts = self._layout(attn, batch, decode_rows, chunks)
        attn.slot_mapping = torch.cat(slot_parts).to(self.device)
        return StepInputs(
            input_ids=torch.tensor(ids, dtype=torch.int64, device=self.device)[None],
            position_ids=torch.tensor(positions, dtype=torch.int64, device=self.device)[None],
            attn=attn,
            sample_index=torch.tensor(self._sample_rows(batch), dtype=torch.int64, device=self.device),
            lora=LoraRows.of(batch.row_lora_ids(), self.device) if batch.has_lora else None,
        )

    def _layout(self, attn: AttentionBatch, batch: ForwardBatch, decode_rows, chunks) -> list[torch.Tensor]:
        """Fill in what each decode row and prefill segment attends to; returns the new tokens' slots in order."""
        table = self.table.table
        slot_parts: list[torch.Tensor] = []
        if decode_rows:
            rows = torch.tensor([row for row, _ in decode_rows], dtype=torch.int64, device=self.device)
            lengths = [n for _, n in decode_rows]
            lens = torch.tensor(lengths, dtype=torch.int64, device=self.device)
            max_len = max(lengths)
            kv = table[rows, :max_len]
            cols = torch.arange(max_len, device=self.device)
            attn.decode_kv_slots = kv.masked_fill(cols[None, :] >= lens[:, None], 0)
            attn.decode_kv_lens = lens
            slot_parts.append(kv.gather(1, (lens - 1)[:, None]).view(-1))
        offset = len(decode_rows)
        for chunk in chunks:
            kv_slots = table[chunk.request.row, : chunk.end]
            attn.prefills.append(PrefillSegment(offset, chunk.end - chunk.start, chunk.start, kv_slots))
            slot_parts.append(kv_slots[chunk.start :])
            offset += chunk.end - chunk.start
        for run in batch.drafts:  # attended like a prefill chunk over the cached prefix, every row sampled
            end = run.start + run.num_tokens
            kv_slots = table[run.request.row, :end]
            attn.prefills.append(PrefillSegment(offset, run.num_tokens, run.start, kv_slots))
            slot_parts.append(kv_slots[run.start :])
            offset += run.num_tokens
        return slot_parts

    @staticmethod
    def _sample_rows(batch: ForwardBatch) -> list[int]:
        """The decode rows, each sampling prefill chunk's last row, the prompt positions whose log-probs were
        asked for (`prompt_logprobs.extra_rows`), then every row of the draft runs."""
        sample_index: list[int] = list(range(len(batch.decodes)))
        offset = len(batch.decodes)
        for chunk in batch.prefills:
            offset += chunk.end - chunk.start
            if chunk.sample:
                sample_index.append(offset - 1)
        sample_index.extend(extra_rows(batch))
        drafts_start = offset
        for run in batch.drafts:
            sample_index.extend(range(drafts_start, drafts_start + run.num_tokens))
            drafts_start += run.num_tokens
        return sample_index
