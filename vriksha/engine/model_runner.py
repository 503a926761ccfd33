"""Builds the flattened ragged batch, runs the Transformers model with the engine's attention, returns logits."""

from __future__ import annotations

import contextlib
import logging
from pathlib import Path

import torch

import vriksha.device as devices
from vriksha import timing_load
from vriksha.cache import announce_first_load
from vriksha.engine import fast_linear, fp32_precision, hub_layers, kernel_sets, native_decode, quantization
from vriksha.engine import native as native_lib
from vriksha.engine.attention import AttentionBatch, PrefillSegment, forward_context, register_attention
from vriksha.engine.batch import ForwardBatch
from vriksha.engine.config import EngineConfig
from vriksha.engine.decode_graphs import DecodeGraphs
from vriksha.engine.fast_forward import FastForward
from vriksha.engine.installation import ModuleInstallation
from vriksha.engine.kv_pool import KVPool, ReqToTokenTable
from vriksha.engine.prompt_logprobs import extra_rows
from vriksha.profiling import phase

logger = logging.getLogger(__name__)

# Prefill chunks of several tokens run as decode rows while the K/V positions their rows read add up to at
# most this many (about 50 MB of a bf16 pool for a 135M model's 30 layers, a few ms): a short chat turn over a
# short history qualifies, a chunk over a long cached prefix does not. One-token chunks always qualify.
CHUNK_DECODE_ROWS_MAX_READS = 2048


class ModelRunner:
    """Runs the engine's forward passes on `model`; its changes to the model are undone by `close()`."""

    def __init__(
        self,
        model: torch.nn.Module,
        pool: KVPool,
        table: ReqToTokenTable,
        config: EngineConfig,
        gguf: Path | None = None,
        bf16_matmuls: bool = False,
        packed_activations: str = "float32",
    ) -> None:
        """`gguf`: the file the model was loaded from, whose packed blocks `quantization` may serve;
        `bf16_matmuls`: an fp32 model's linear layers may run in bf16 arithmetic where it measures faster
        (`fp32_precision.resolve`); `packed_activations`: the least precise activations the packed kernels may use
        (`quantization.packed_activations`). The KV pool may hold another dtype than the model (`kv_cache_dtype`)."""
        self.model = model
        self.pool = pool
        self.table = table
        self.device = pool.device
        self.installation = ModuleInstallation(model)
        self.installation.set_attn_implementation(register_attention())
        cpu = devices.is_host(self.device)
        dtype = next(model.parameters()).dtype
        self.kernels = kernel_sets.select(config.kernels, self.device, dtype, config.native_kernels)
        if config.kernel_layers:
            self.kernels = hub_layers.bind(model, config.kernel_layers, self.installation, self.kernels)
        logger.info("kernel set for %s on %s: %s", dtype, self.device, self.kernels.describe())
        self.decode_kernel = self.kernels.decode_attention_for(pool.dtype)
        self.prefill_kernel = self.kernels.prefill_attention_for(pool.dtype)
        self.bf16_matmuls = bf16_matmuls
        self.fast_linear: fast_linear.FastLinear | None = None
        if config.fast_linear and cpu:
            linear_kernels = self.kernels.linear_for(dtype)
            self.fast_linear = fast_linear.FastLinear(
                model, self.installation, linear_kernels, self.bf16_matmuls
            )
        # tensor parallel: a TensorParallelGroup that hands each step's batch to the other ranks, then runs it
        self.tensor_parallel = None
        self.quant, self.quantization = quantization.apply(
            model,
            config.quantization,
            self.installation,
            self.kernels.linear_for(dtype),
            gguf,
            cpu,
            self.bf16_matmuls and self.fast_linear is not None,
            activations=packed_activations,
        )
        self._build_linear_layouts()
        self.matmul_choice = self._describe_matmuls()
        self.fast_forward: FastForward | None = None
        if config.fast_forward:
            try:
                self.fast_forward = FastForward(model, self.kernels)
            except ValueError as exc:
                logger.info("Transformers forward for every step: %s", exc)
        self.native_decode: native_decode.NativeDecode | None = None
        self.native_decode_choice = "off"  # what decode steps run natively, and why (logs, --verbose)
        if config.native_decode != "off":
            self._set_up_native_decode(model, config)
        self.decode_graphs: DecodeGraphs | None = None
        self.decode_graphs_choice = self._set_up_decode_graphs(config)  # logs, --verbose

    def _describe_matmuls(self) -> str:
        """Which fp32 matmuls run in bf16 arithmetic (logs, --verbose)."""
        text = fp32_precision.describe(self.bf16_matmuls)
        if self.bf16_matmuls and self.fast_linear is not None:
            buckets = self.fast_linear.bf16_buckets()
            dense = f"dense calls of {', '.join(map(str, buckets))} rows" if buckets else "no dense call"
            text += f": {dense}"
            if self.quant is not None:
                text += " (packed layers take the dense path only where it measured faster)"
        return text

    def _set_up_native_decode(self, model: torch.nn.Module, config: EngineConfig) -> None:
        if self.fast_forward is None:
            self.native_decode_choice = "off: the model runs the Transformers forward"
            return
        if config.tensor_parallel_size > 1 or config.kernel_layers:
            self.native_decode_choice = "off: tensor parallel or hub kernel layers"
            return
        try:
            self.native_decode = native_decode.NativeDecode(model, self.kernels, self.pool, self.quant)
        except ValueError as exc:
            self.native_decode_choice = f"off: {exc}"
            logger.info("decode steps run the lean forward: %s", exc)
            return
        if config.native_decode == "on":
            self.native_decode_choice = f"on: decode batches up to {self.native_decode.max_batch}"
            return
        key = native_decode.choice_key(model, self.kernels, self.quant, self.pool, self.bf16_matmuls)
        cached = native_decode.cached_choice(key)
        if cached is not None:
            best, times = cached["max_batch"], cached["timings"]
            how = "cached"
        else:
            announce_first_load()
            watch = timing_load.LoadWatch()
            best, times = self._measure_native_decode(model)
            if times:
                native_decode.store_choice(key, best, times, watch)
            how = "measured"
        self.native_decode.max_batch = best
        if best == 0:
            self.native_decode = None
        self.native_decode_choice = (
            f"auto ({how}): decode batches up to {best} natively "
            f"({'; '.join(times) or 'not measured: small KV pool'})"
        )
        logger.info("native decode %s", self.native_decode_choice)

    def _set_up_decode_graphs(self, config: EngineConfig) -> str:
        mode = config.cuda_graphs
        if mode == "off":
            return "off"
        if devices.graph_module(self.device) is None:
            return "off: CUDA graphs need a CUDA device"
        if config.tensor_parallel_size > 1:
            return "off: tensor parallel"
        if mode == "auto" and self.fast_forward is None:
            return "off: the model runs the Transformers forward (--cuda-graphs on captures it anyway)"
        if mode == "auto" and self.decode_kernel is None:
            return (
                "off: the kernel set's decode attention gathers K/V (the triton set reads the pool in place)"
            )
        max_batch = min(config.cuda_graph_max_batch, config.max_num_seqs, config.max_num_batched_tokens)
        try:
            self.decode_graphs = DecodeGraphs(
                self.run, self.model, self.pool, self.table.table, self.decode_kernel, max_batch
            )
        except Exception as exc:  # a forward that cannot be captured, e.g. one that reads a device value
            devices.synchronize(self.device)
            logger.warning("decode steps stay eager: capturing them as CUDA graphs failed: %s", exc)
            return f"off: capture failed ({type(exc).__name__}: {exc})"
        choice = f"{mode}: {self.decode_graphs.describe()}"
        logger.info("CUDA graphs %s", choice)
        return choice

    def _measure_native_decode(self, model: torch.nn.Module) -> tuple[int, list[str]]:
        """The largest measured decode batch size up to which the native step was faster, and the timings."""
        vocab = model.model.embed_tokens.weight.shape[0]
        best, times = 0, []
        for b in native_decode.MEASURE_BATCHES:
            inputs = native_decode.synthetic_decode(self.pool, self.decode_kernel, b, 16, vocab)
            if inputs is None:
                break
            lean = native_decode.time_step(lambda inputs=inputs: self.run(*inputs, native=False))
            fused = native_decode.time_step(lambda inputs=inputs: self.run(*inputs, native=True))
            times.append(f"batch {b}: {fused * 1e3:.2f} ms native vs {lean * 1e3:.2f} ms lean")
            if fused >= lean:
                break
            best = b
        return best, times

    @property
    def native(self) -> native_lib.Kernels | None:
        """The native C kernels when the kernel set is a native one, else None."""
        return getattr(self.kernels, "lib", None)

    def close(self) -> None:
        """Hand the model back as it came: its attention implementation and linear layers restored."""
        self.installation.undo()
        self.fast_linear = None
        self.quant = None
        self.fast_forward = None
        self.native_decode = None
        self.decode_graphs = None

    def _build_linear_layouts(self) -> None:
        """The fast-linear router's derived weight copies, made now for the layers whose calls may take them;
        a layer the packed kernels serve at every bucket makes its copy only if a call ever needs it."""
        if self.fast_linear is None:
            return
        skip = self.quant.always_packed() if self.quant is not None else set()
        nbytes = self.fast_linear.build_layouts(skip)
        if skip:
            logger.info(
                "derived fp32/bf16 weight copies: %.0f MiB (none for the %d layers served packed at every batch size)",
                nbytes / 2**20,
                len(skip),
            )

    def weights_updated(self) -> None:
        if self.fast_linear is not None:
            self.fast_linear.refresh()
        if self.quant is not None:
            self.quant.refresh()
        self._build_linear_layouts()
        if self.native_decode is not None:
            self.native_decode.refresh()
        if self.decode_graphs is not None:
            self.decode_graphs.weights_updated()

    def _chunks_as_decode_rows(self, batch: ForwardBatch) -> bool:
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
        limit = native_decode.MAX_BATCH if self.native_decode is None else self.native_decode.max_batch
        if rows > limit:
            return False
        reads = sum(
            (c.start + 1 + c.end) * (c.end - c.start) // 2 for c in batch.prefills if c.end - c.start > 1
        )
        return reads <= CHUNK_DECODE_ROWS_MAX_READS

    def _build(self, batch: ForwardBatch) -> tuple[torch.Tensor, torch.Tensor, AttentionBatch, torch.Tensor]:
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
        table = self.table.table
        slot_parts: list[torch.Tensor] = []
        # decode rows, (table row, tokens attended): each decode token, then each token of chunks short
        # enough to run as decode rows, attending its request's K/V up to its own position
        decode_rows = [(r.row, r.num_computed + 1) for r in batch.decodes]
        chunks = batch.prefills
        if self._chunks_as_decode_rows(batch):
            decode_rows += [(c.request.row, p + 1) for c in chunks for p in range(c.start, c.end)]
            chunks = []
        attn = AttentionBatch(
            pool=self.pool,
            slot_mapping=torch.empty(0),
            num_decode=len(decode_rows),
            decode_kernel=self.decode_kernel,
            prefill_kernel=self.prefill_kernel,
        )
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
        draft_rows: list[int] = []
        for run in batch.drafts:  # attended like a prefill chunk over the cached prefix, every row sampled
            end = run.start + run.num_tokens
            kv_slots = table[run.request.row, :end]
            attn.prefills.append(PrefillSegment(offset, run.num_tokens, run.start, kv_slots))
            slot_parts.append(kv_slots[run.start :])
            draft_rows.extend(range(offset, offset + run.num_tokens))
            offset += run.num_tokens
        attn.slot_mapping = torch.cat(slot_parts).to(self.device)
        sample_index: list[int] = list(range(len(batch.decodes)))
        offset = len(batch.decodes)
        for chunk in batch.prefills:
            offset += chunk.end - chunk.start
            if chunk.sample:
                sample_index.append(offset - 1)
        sample_index.extend(extra_rows(batch))  # prompt positions of requests asking for prompt_logprobs
        sample_index.extend(draft_rows)
        input_ids = torch.tensor(ids, dtype=torch.int64, device=self.device)[None]
        position_ids = torch.tensor(positions, dtype=torch.int64, device=self.device)[None]
        return (
            input_ids,
            position_ids,
            attn,
            torch.tensor(sample_index, dtype=torch.int64, device=self.device),
        )

    @torch.inference_mode()
    def forward(self, batch: ForwardBatch) -> torch.Tensor:
        """Logits [num_sampled, vocab] for the requests that sample a token this step, followed by the rows of
        prompt positions whose log-probabilities were asked for (`prompt_logprobs.extra_rows`), then every
        position of the draft runs."""
        graphs = self.decode_graphs
        if graphs is not None and self.tensor_parallel is None and graphs.accepts(batch):
            with phase("engine.forward"):
                return graphs.forward(batch)
        with phase("engine.prepare_batch"):
            input_ids, position_ids, attn, sample_index = self._build(batch)
        if self.tensor_parallel is not None:
            return self.tensor_parallel.run_step(self.run, input_ids, position_ids, attn, sample_index)
        return self.run(input_ids, position_ids, attn, sample_index)

    @torch.inference_mode()
    def run(
        self,
        input_ids: torch.Tensor,
        position_ids: torch.Tensor,
        attn: AttentionBatch,
        sample_index: torch.Tensor,
        native: bool | None = None,
    ) -> torch.Tensor:
        """The forward pass over a built batch: logits of the rows at `sample_index`. `native`: force the
        native decode path on or off for this call (default: where it accepts the batch)."""
        with phase("engine.forward"), forward_context(attn), contextlib.ExitStack() as routed:
            for router in (self.fast_linear, self.quant):
                if router is not None:
                    routed.enter_context(router.engaged())
            fused = self.native_decode
            if fused is not None and (
                native if native is not None else fused.accepts(attn, input_ids.shape[1])
            ):
                return fused(input_ids, position_ids, attn, sample_index)
            if self.fast_forward is not None:
                return self.fast_forward(input_ids, position_ids, sample_index)
            out = self.model(
                input_ids=input_ids, position_ids=position_ids, use_cache=False, logits_to_keep=sample_index
            )
        return out.logits[0]
