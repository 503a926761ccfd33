"""One engine step as rank 0 sends it to the other ranks: the flattened batch in one int64 message.

Rank 0's model runner builds the batch (token ids, positions, the KV slot of every new token, each decode
request's KV slots and each prefill chunk's) from its scheduler and request-to-token table; the other ranks
hold no scheduler and no table, only their share of every KV slot, so they need exactly these tensors and
nothing else. Sampling stays on rank 0, which alone computes logits.

A message is a fixed header (`HEADER` int64s: the kind and the section lengths), broadcast first so every
rank knows the size of what follows, then one payload of the sections laid end to end. The decode slots go
ragged (each request's own length, no padding), so a step's message grows with the tokens attended to,
not with the longest request times the batch.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from vriksha.engine.attention.backend import AttentionBackend
from vriksha.engine.attention.batch import AttentionBatch, PrefillSegment
from vriksha.engine.core.kv_pool import KVPool

HEADER = 6
FORWARD, STOP = 1, 2


@dataclass(slots=True)
class StepMessage:
    header: torch.Tensor  # [HEADER]: kind, tokens, decodes, decode slots, prefills, prefill slots
    payload: torch.Tensor  # [sum of the sections]

    @property
    def kind(self) -> int:
        return int(self.header[0])


def stop_message() -> StepMessage:
    header = torch.zeros(HEADER, dtype=torch.int64)
    header[0] = STOP
    return StepMessage(header, torch.empty(0, dtype=torch.int64))


def pack(input_ids: torch.Tensor, position_ids: torch.Tensor, attn: AttentionBatch) -> StepMessage:
    """The message for a forward step over `input_ids` [1, T] at `position_ids` [1, T] laid out as `attn`."""
    parts = [input_ids.view(-1), position_ids.view(-1), attn.slot_mapping.view(-1)]
    decode_slots = 0
    if attn.num_decode:
        lens = attn.decode_kv_lens
        cols = torch.arange(attn.decode_kv_slots.shape[1], device=lens.device)
        ragged = attn.decode_kv_slots[cols[None, :] < lens[:, None]]
        parts += [lens, ragged]
        decode_slots = ragged.numel()
    prefill_slots = 0
    if attn.prefills:
        meta = [x for seg in attn.prefills for x in (seg.q_start, seg.q_len, seg.prefix_len)]
        parts.append(torch.tensor(meta, dtype=torch.int64, device=input_ids.device))
        parts += [seg.kv_slots for seg in attn.prefills]
        prefill_slots = sum(seg.kv_slots.numel() for seg in attn.prefills)
    header = torch.tensor(
        [FORWARD, input_ids.numel(), attn.num_decode, decode_slots, len(attn.prefills), prefill_slots],
        dtype=torch.int64,
    )
    payload = torch.cat([p.to(torch.int64) for p in parts])
    return StepMessage(header, payload)


def payload_size(header: torch.Tensor) -> int:
    _, tokens, decodes, decode_slots, prefills, prefill_slots = (int(x) for x in header.tolist())
    return 3 * tokens + decodes + decode_slots + 3 * prefills + prefill_slots


def unpack(
    message: StepMessage, pool: KVPool, device: torch.device, attention: AttentionBackend
) -> tuple[torch.Tensor, torch.Tensor, AttentionBatch]:
    """(input_ids [1, T], position_ids [1, T], the attention batch over this rank's `pool`)."""
    _, tokens, decodes, decode_slots, prefills, prefill_slots = (int(x) for x in message.header.tolist())
    data = message.payload.to(device)
    sizes = [tokens, tokens, tokens, decodes, decode_slots, 3 * prefills, prefill_slots]
    ids, positions, slot_mapping, lens, ragged, meta, prefill_flat = data.split(sizes)
    attn = AttentionBatch(pool=pool, slot_mapping=slot_mapping, num_decode=decodes, backend=attention)
    if decodes:
        width = int(lens.max())
        cols = torch.arange(width, device=device)
        mask = cols[None, :] < lens[:, None]
        padded = torch.zeros((decodes, width), dtype=torch.int64, device=device)
        padded[mask] = ragged
        attn.decode_kv_slots, attn.decode_kv_lens = padded, lens
    offset = 0
    for q_start, q_len, prefix_len in meta.view(-1, 3).tolist():
        n = prefix_len + q_len
        attn.prefills.append(PrefillSegment(q_start, q_len, prefix_len, prefill_flat[offset : offset + n]))
        offset += n
    return ids[None], positions[None], attn
