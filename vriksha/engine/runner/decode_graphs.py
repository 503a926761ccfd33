"""Decode steps replayed from CUDA graphs captured at load, one graph per padded batch size.

On a GPU a small model's decode step is bound by kernel launches (hundreds of small kernels a step, each a
few microseconds of host time), not by the device. A step that only decodes (no prompt chunk, no draft run)
copies its inputs into static buffers, padded to the next captured batch size, and replays that size's
graph: the whole forward becomes one launch. Padding rows read token 0 at position 0, write their K/V into
the pool's scratch slot 0 and attend to that slot alone, so they touch no request's K/V. Each row's K/V
slots sit in a [max batch, context] buffer of which the decode attention reads the first `lens[b]`
columns of row b: the kernel must read the pool in place (the triton set's does), since a gathering
fallback would gather every column.

Without capture (`capture=False`) the same buffers and padding run eagerly: that is how the tests check on a
CPU everything but the capture itself.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch

import vriksha.device as devices
from vriksha.engine.attention.backend import AttentionBackend
from vriksha.engine.attention.batch import AttentionBatch
from vriksha.engine.core.batch import ForwardBatch
from vriksha.engine.core.kv_pool import KVPool
from vriksha.engine.runner.step import ForwardStep, StepInputs
from vriksha.profiling import phase

logger = logging.getLogger(__name__)

# the forward of a built step (the runner's chain of paths, which these graphs capture) -> logits
RunStep = Callable[[ForwardStep], torch.Tensor]


def capture_sizes(max_batch: int) -> list[int]:
    """The batch sizes captured: 1, 2, 4, 8, then every 16 up to `max_batch` (which is always one)."""
    sizes = [b for b in (1, 2, 4, 8) if b < max_batch]
    sizes += list(range(16, max_batch, 16))
    return [*sizes, max_batch]


@dataclass(slots=True)
class StaticInputs:
    """The buffers every captured graph reads, sized for the largest batch."""

    input_ids: torch.Tensor  # [1, B]
    position_ids: torch.Tensor  # [1, B]
    slot_mapping: torch.Tensor  # [B] where each row's new K/V is written
    kv_slots: torch.Tensor  # [B, context] each row's K/V slots, read up to kv_lens
    kv_lens: torch.Tensor  # [B]
    sample_index: torch.Tensor  # [B] 0 .. B-1
    logits: torch.Tensor | None = None  # [B, vocab] what the graphs write, allocated by the first step

    @classmethod
    def allocate(cls, max_batch: int, context: int, device: torch.device) -> StaticInputs:
        def ids(*shape: int) -> torch.Tensor:
            return torch.zeros(shape, dtype=torch.int64, device=device)

        return cls(
            input_ids=ids(1, max_batch),
            position_ids=ids(1, max_batch),
            slot_mapping=ids(max_batch),
            kv_slots=ids(max_batch, context),
            kv_lens=torch.ones(max_batch, dtype=torch.int64, device=device),
            sample_index=torch.arange(max_batch, device=device),
        )


class DecodeGraphs:
    """A forward path (`forward_path.py`): decode steps of up to `max_batch` requests through captured graphs
    (or, without capture, through the same static buffers eagerly)."""

    name = "decode graphs"

    def __init__(
        self,
        run: RunStep,
        model: torch.nn.Module,
        pool: KVPool,
        table: torch.Tensor,  # the request-to-token table [rows, context]
        attention: AttentionBackend,
        max_batch: int,
        capture: bool = True,
    ) -> None:
        self.run = run
        self.model = model
        self.pool = pool
        self.table = table
        self.attention = attention
        self.sizes = capture_sizes(max_batch)
        self.max_batch = max_batch
        self.capture = capture
        self.inputs = StaticInputs.allocate(max_batch, table.shape[1], pool.device)
        self.graphs: dict[int, object] = {}  # batch size -> the device module's graph
        self.capture_seconds = 0.0
        self._weights = self._weight_pointers()
        if capture:
            self.capture_all()

    def accepts(self, step: ForwardStep) -> bool:
        """Decode-only steps the scheduler made (a step built elsewhere, such as a capture's, has no batch)."""
        batch = step.batch
        return (
            batch is not None
            and not batch.prefills
            and not batch.drafts
            and not batch.has_lora  # captured without LoRA deltas
            and 0 < len(batch.decodes) <= self.max_batch
        )

    def __call__(self, step: ForwardStep) -> torch.Tensor:
        with phase("engine.forward"):
            return self.forward(step.batch)

    def _weight_pointers(self) -> list[int]:
        return [t.data_ptr() for t in (*self.model.parameters(), *self.model.buffers())]

    def _attention(self, size: int) -> AttentionBatch:
        s = self.inputs
        return AttentionBatch(
            pool=self.pool,
            slot_mapping=s.slot_mapping[:size],
            num_decode=size,
            backend=self.attention,
            decode_kv_slots=s.kv_slots[:size],
            decode_kv_lens=s.kv_lens[:size],
        )

    def _step(self, size: int) -> None:
        """One decode step of `size` rows from the static buffers, its logits into `inputs.logits`."""
        s = self.inputs
        inputs = StepInputs(
            s.input_ids[:, :size], s.position_ids[:, :size], self._attention(size), s.sample_index[:size]
        )
        logits = self.run(ForwardStep(inputs=inputs))
        if s.logits is None:
            s.logits = logits.new_empty(self.max_batch, logits.shape[1])
        s.logits[:size].copy_(logits)

    @torch.inference_mode()
    def capture_all(self) -> None:
        """Capture every size, the largest first (the smaller ones then fit in the memory it pooled)."""
        module = devices.graph_module(self.pool.device)
        if module is None:
            raise ValueError(f"{devices.describe(self.pool.device)} has no graph capture")
        start = time.perf_counter()
        self.graphs.clear()
        memory = module.graph_pool_handle()
        for size in reversed(self.sizes):
            self._step(size)  # warm-up outside the graph: compiles kernels, sets up library handles
            devices.synchronize(self.pool.device)
            graph = module.CUDAGraph()
            with module.graph(graph, pool=memory):
                self._step(size)
            self.graphs[size] = graph
        devices.synchronize(self.pool.device)
        self.capture_seconds = time.perf_counter() - start
        self._weights = self._weight_pointers()
        logger.info(
            "captured %d decode graphs (batch %s) in %.1f s",
            len(self.graphs),
            self.sizes,
            self.capture_seconds,
        )

    def weights_updated(self) -> None:
        """Weights copied in place keep the graphs valid; weights moved to new memory need new graphs."""
        if self.capture and self._weight_pointers() != self._weights:
            self.capture_all()

    @torch.inference_mode()
    def forward(self, batch: ForwardBatch) -> torch.Tensor:
        """Logits [len(batch.decodes), vocab] of a decode-only batch; a view of the static buffer that the next
        call overwrites."""
        n = len(batch.decodes)
        size = next(b for b in self.sizes if b >= n)
        s = self.inputs
        host = torch.tensor(
            [
                [r.all_token_ids[r.num_computed] for r in batch.decodes],
                [r.num_computed for r in batch.decodes],
                [r.row for r in batch.decodes],
            ],
            dtype=torch.int64,
        )
        context = int(host[1].max()) + 1
        rows = host.to(s.input_ids.device, non_blocking=True)
        s.input_ids[0, :n].copy_(rows[0])
        s.position_ids[0, :n].copy_(rows[1])
        s.kv_lens[:n].copy_(rows[1] + 1)
        s.kv_slots[:n, :context].copy_(self.table[rows[2], :context])
        s.slot_mapping[:n].copy_(s.kv_slots[:n].gather(1, rows[1][:, None]).view(-1))
        if size > n:  # padding rows: token 0 at position 0, K/V written to and read from scratch slot 0
            for buffer in (s.input_ids[0], s.position_ids[0], s.slot_mapping, s.kv_slots[:, 0]):
                buffer[n:size].zero_()
            s.kv_lens[n:size].fill_(1)
        graph = self.graphs.get(size)
        if graph is not None:
            graph.replay()
        else:
            self._step(size)
        return s.logits[:n]

    def describe(self) -> str:
        how = f"captured in {self.capture_seconds:.1f} s" if self.graphs else "replayed eagerly"
        return f"decode batches up to {self.max_batch} ({len(self.sizes)} sizes, {how})"
