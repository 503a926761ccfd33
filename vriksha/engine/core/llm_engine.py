"""The engine core: requests in, one scheduled forward pass per `step()`, outputs out."""

from __future__ import annotations

import itertools
import logging
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

import vriksha.device as devices
from vriksha.engine.config import EngineConfig
from vriksha.engine.core.cache_events import CacheEventSink
from vriksha.engine.core.cache_manager import make_cache_manager
from vriksha.engine.core.kv_pool import SlotAllocator
from vriksha.engine.core.kv_tier import KVTier
from vriksha.engine.core.lora_registry import EngineLoras, LoadedLora, LoraRegistry
from vriksha.engine.core.outputs import CompletionOutput, RequestOutput
from vriksha.engine.core.prompt_logprobs import prompt_logprobs_list, record_prompt_logprobs
from vriksha.engine.core.request import Request
from vriksha.engine.core.sampler import Sampler
from vriksha.engine.core.sampling_params import SamplingParams
from vriksha.engine.core.scheduler import Scheduler
from vriksha.engine.core.stats import EngineStats, StepTimes
from vriksha.engine.core.validation import Prompt, check_request, tokenize_prompt
from vriksha.engine.runner.load import LoadedModel, load
from vriksha.engine.speculative.speculator import Speculator
from vriksha.errors import ConfigError, InvalidRequestError, VrikshaError
from vriksha.profiling import phase

logger = logging.getLogger(__name__)


class EngineClosedError(VrikshaError):
    """The engine was closed (its model handed back); it takes no more requests."""


@dataclass(eq=False)
class _Group:
    """A user request: its n sequences."""

    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    sequences: list[Request]
    stream: bool
    arrival_time: float = field(default_factory=time.monotonic)
    weight_version: int = 0  # the weights this request is computed under (updates wait for an idle engine)

    @property
    def finished(self) -> bool:
        return all(s.is_finished for s in self.sequences)


class LLMEngine:
    def __init__(
        self,
        config: EngineConfig | None = None,
        model=None,
        tokenizer=None,
        cache_events: CacheEventSink | None = None,
    ) -> None:
        self.config = config = config or EngineConfig()
        loaded = load(config, model, tokenizer)
        try:
            self._build(config, loaded, cache_events)
        except BaseException:
            loaded.close()
            raise

    def _build(self, config: EngineConfig, loaded: LoadedModel, cache_events: CacheEventSink | None) -> None:
        self.model = loaded.model
        self.tokenizer = loaded.tokenizer
        self.model_name = loaded.name
        self.plan = plan = loaded.plan  # every platform decision taken at load (`--verbose` prints it)
        self.tensor_parallel = (
            loaded.tensor_parallel
        )  # a TensorParallelGroup when the engine runs on several ranks
        self.device = next(self.model.parameters()).device
        self.dtype = next(self.model.parameters()).dtype
        self.dtype_choice = plan.dtype
        self.host_malloc = plan.host_malloc
        self.kv_dtype = plan.kv_dtype
        self.step_threads = plan.threads
        self.quantization = plan.runner.quantization
        self.max_model_len = loaded.max_model_len
        self.vocab_size = int(self.model.config.get_text_config().vocab_size)
        self.eos_token_ids = self._eos_ids()
        self.pool, self.table, self.runner = loaded.pool, loaded.table, loaded.runner
        self.allocator = SlotAllocator(self.pool.num_slots, self.device)
        self.cache = make_cache_manager(
            config.enable_prefix_caching,
            self.allocator,
            self.table,
            cache_events,
            session_capacity=int(config.session_pin_fraction * self.allocator.capacity),
            session_timeout_s=config.session_timeout_s,
            tier=self._kv_tier(config),
        )
        self.loras: EngineLoras | None = None
        if config.enable_lora:
            registry = LoraRegistry(config.max_loras, config.max_lora_rank)
            self.loras = EngineLoras(registry, self.runner.lora, self.cache)
        speculator = Speculator(config, self.max_model_len) if config.speculative != "none" else None
        self.scheduler = Scheduler(config, self.cache, speculator)
        native = self.runner.native
        self.sampler = Sampler(
            config.seed, native.greedy_pick if native is not None else None, plan.mask_kernel
        )
        self._grammar = None  # GrammarEngine, built on the first constrained request
        self._grammar_lock = threading.Lock()
        self._groups: dict[str, _Group] = {}
        self._closed = False
        self.step_hooks: list = []  # called after every step (profilers)
        self._ids = itertools.count()
        self._prompt_tokens = 0
        self._cached_prompt_tokens = 0
        self._generation_tokens = 0
        self.weight_version = 0  # bumped by set_weight_version after an in-place weight update
        self.sleeping = False  # the KV pool released (`sleep`) until `wake_up`
        self.step_times = StepTimes()  # how long steps took, by kind (the server's /metrics histogram)
        logger.info(
            "engine: %s, %s, KV pool %d tokens; %s",
            self.model_name,
            self.dtype_choice.describe(),
            self.allocator.capacity,
            self.quantization.describe(),
        )

    def _kv_tier(self, config: EngineConfig) -> KVTier | None:
        if not config.kv_tier_tokens:
            return None
        if self.tensor_parallel is not None or not config.enable_prefix_caching:
            raise ConfigError(
                "--kv-tier-tokens needs the prefix cache on and one rank (no --tensor-parallel-size); "
                "drop --kv-tier-tokens or change those"
            )
        return KVTier(self.pool, config.kv_tier_tokens, config.kv_tier_dtype)

    @classmethod
    def from_module(
        cls, module: torch.nn.Module, tokenizer, config: EngineConfig | None = None, **config_kwargs
    ) -> LLMEngine:
        """An engine around an existing module: its parameters are used in place, never copied.
        `close()` hands the module back as it came."""
        if config is not None and config_kwargs:
            config = config.replace(**config_kwargs)
        return cls(config or EngineConfig.from_flat(**config_kwargs), model=module, tokenizer=tokenizer)

    def _eos_ids(self) -> frozenset[int]:
        ids: set[int] = set()
        gen = getattr(self.model, "generation_config", None)
        for source in (getattr(gen, "eos_token_id", None), self.tokenizer.eos_token_id):
            if isinstance(source, int):
                ids.add(source)
            elif source:
                ids.update(source)
        return frozenset(ids)

    # ---- requests ----------------------------------------------------------------------------------
    def add_request(
        self,
        prompt: Prompt,
        params: SamplingParams | None = None,
        request_id: str | None = None,
        stream: bool = False,
        lora: str | None = None,
        session_id: str | None = None,
    ) -> str:
        return self.add_requests(
            [prompt], [params], [request_id], stream=stream, loras=[lora], session_ids=[session_id]
        )[0]

    def add_requests(
        self,
        prompts: Sequence[Prompt],
        params: Sequence[SamplingParams | None] | SamplingParams | None = None,
        request_ids: Sequence[str | None] | None = None,
        stream: bool = False,
        loras: Sequence[str | None] | str | None = None,
        session_ids: Sequence[str | None] | None = None,
    ) -> list[str]:
        """Validate every request, then add them all (one bad request adds none); returns their ids.
        `loras`: the LoRA adapter each prompt runs with, by name (one for all, or one each; None: the base).
        `session_ids`: the session each prompt continues (None: none); its K/V stays pinned after it finishes
        until the session's next turn, its close (`close_session`) or its timeout."""
        if self._closed:
            raise EngineClosedError("the engine is closed; build a new one")
        if self.sleeping:
            raise InvalidRequestError("the engine is asleep (its KV pool released); call wake_up() first")
        n = len(prompts)
        params_list = list(params) if isinstance(params, Sequence) else [params] * n
        ids_list = list(request_ids) if request_ids is not None else [None] * n
        if len(params_list) != n or len(ids_list) != n:
            raise InvalidRequestError(
                f"got {n} prompts, {len(params_list)} sampling params and {len(ids_list)} request ids; "
                "pass one of each per prompt"
            )
        params_list = [p or SamplingParams() for p in params_list]
        adapters = self._resolve_loras(loras, n)
        sessions = list(session_ids) if session_ids is not None else [None] * n
        if len(sessions) != n or any(x is not None and (not isinstance(x, str) or not x) for x in sessions):
            raise InvalidRequestError(
                f"got {n} prompts and session ids {sessions!r}; pass one non-empty string (or None) per prompt"
            )
        tokenized = [tokenize_prompt(self.tokenizer, p) for p in prompts]
        for (_, ids), p in zip(tokenized, params_list, strict=True):
            check_request(ids, p, self.vocab_size, self.max_model_len, self.allocator.capacity)
            if p.structured_outputs is not None:
                self.grammar_engine().compile(p.structured_outputs)  # an invalid grammar fails here
        given = [rid for rid in ids_list if rid is not None]
        taken = [rid for rid in given if rid in self._groups]
        if taken or len(set(given)) != len(given):
            dup = taken[0] if taken else next(r for r in given if given.count(r) > 1)
            raise InvalidRequestError(f"request id {dup!r} is already in use")
        added = []
        for (text, ids), p, rid, lora, session in zip(
            tokenized, params_list, ids_list, adapters, sessions, strict=True
        ):
            if rid is None:
                rid = str(next(self._ids))
                while rid in self._groups or rid in given:
                    rid = str(next(self._ids))
            self._add(rid, text, ids, p, stream, lora, session)
            added.append(rid)
        return added

    def _resolve_loras(self, loras: Sequence[str | None] | str | None, n: int) -> list[LoadedLora | None]:
        names = [loras] * n if loras is None or isinstance(loras, str) else list(loras)
        if len(names) != n:
            raise InvalidRequestError(
                f"got {n} prompts but {len(names)} LoRA adapter names; pass one or one each"
            )
        if self.loras is None:
            if any(names):
                raise InvalidRequestError(
                    f"LoRA adapter {next(x for x in names if x)!r} asked for, but LoRA is off: start the engine "
                    "with --enable-lora"
                )
            return [None] * n
        return [self.loras.registry.resolve(x) if x else None for x in names]

    def add_lora(self, adapter, path: str | None = None, version: int | None = None, replace: bool = False):
        """Load a LoRA adapter (`vriksha.lora.LoraAdapter`) under its name; AdapterError says why not."""
        return self._lora_manager().add(
            adapter, self.lora_ids_in_use(), path=path, version=version, replace=replace
        )

    def remove_lora(self, name: str) -> LoadedLora:
        """Stop serving adapter `name` (requests running on it finish first); UnknownLoraError if absent."""
        return self._lora_manager().remove(name, self.lora_ids_in_use())

    def list_loras(self) -> list[LoadedLora]:
        return list(self.loras.registry.current.values()) if self.loras is not None else []

    def _lora_manager(self) -> EngineLoras:
        if self.loras is None:
            raise InvalidRequestError("LoRA adapters need an engine started with --enable-lora")
        return self.loras

    def lora_ids_in_use(self) -> set[int]:
        return {r.lora_id for g in self._groups.values() for r in g.sequences if not r.is_finished}

    def _add(
        self,
        request_id: str,
        text: str | None,
        ids: list[int],
        params: SamplingParams,
        stream: bool,
        lora: LoadedLora | None = None,
        session_id: str | None = None,
    ) -> None:
        bad_words = self._bad_word_ids(params.bad_words) if params.bad_words else []
        grammar = self.grammar_engine() if params.structured_outputs is not None else None
        sequences = []
        for i in range(params.n):
            req = Request(request_id, i, ids, params, self.eos_token_ids, prompt=text, session_id=session_id)
            if lora is not None:
                req.lora_id, req.lora_name = lora.lora_id, lora.name
            if params.seed is not None:
                req.seed = params.seed + i
            req.bad_word_ids = bad_words
            if grammar is not None:
                req.grammar = grammar.matcher(params.structured_outputs)
            sequences.append(req)
        if grammar is not None:
            grammar.prefetch([r.grammar for r in sequences])
        if session_id is not None:
            self.cache.open_session(session_id)
        for req in sequences:
            self.scheduler.add(req)
        self._groups[request_id] = _Group(
            request_id, text, ids, sequences, stream, weight_version=self.weight_version
        )

    @property
    def request_ids(self) -> list[str]:
        """Ids of the requests added and not yet finished or aborted."""
        return list(self._groups)

    def abort_all(self) -> list[str]:
        """Abort every unfinished request; returns their ids."""
        ids = list(self._groups)
        for request_id in ids:
            self.abort(request_id)
        return ids

    def close(self) -> None:
        """Abort what is running and hand the model back as it came (attention, linear layers restored).
        The engine takes no requests afterwards; calling it twice is harmless."""
        if self._closed:
            return
        self.abort_all()
        if self._grammar is not None:
            self._grammar.close()
        self.runner.close()
        if self.tensor_parallel is not None:
            self.tensor_parallel.close()
        self._closed = True

    def grammar_engine(self):
        """The structured-output engine (llguidance over this tokenizer), built on first use (from any thread:
        a server compiles grammars off the engine's loop)."""
        with self._grammar_lock:
            if self._grammar is None:
                from vriksha.engine.core.grammar import GrammarEngine, GrammarLimits, overlap_plan

                overlap, threads, min_batch = overlap_plan(
                    self.config.platform.grammar_overlap, devices.is_host(self.device)
                )
                limits = GrammarLimits(self.config.grammar_max_bytes, self.config.grammar_max_branches)
                self._grammar = GrammarEngine(
                    self.tokenizer, self.vocab_size, self.eos_token_ids, overlap, threads, min_batch, limits
                )
        return self._grammar

    def _bad_word_ids(self, words: list[str]) -> list[list[int]]:
        """Each word's tokens, alone and after a space (as vLLM bans them)."""
        out: list[list[int]] = []
        for word in words:
            for form in (word, " " + word.lstrip()):
                ids = self.tokenizer.encode(form, add_special_tokens=False)
                if ids and ids not in out:
                    out.append(ids)
        return out

    def abort(self, request_id: str) -> bool:
        group = self._groups.pop(request_id, None)
        if group is None:
            return False
        for req in group.sequences:
            if not req.is_finished:
                req.finish_reason = "abort"
                self.scheduler.abort(req)
        return True

    @property
    def has_unfinished(self) -> bool:
        return self.scheduler.has_work

    # ---- the step ----------------------------------------------------------------------------------
    def step(self) -> list[RequestOutput]:
        """Run one forward pass; return outputs of finished requests and of streaming ones that advanced."""
        outputs = self._step()
        for hook in self.step_hooks:
            hook()
        return outputs

    def _step(self) -> list[RequestOutput]:
        start = time.perf_counter()
        batch = self.scheduler.schedule()
        if batch.num_tokens == 0:
            return []
        logits = self.runner.forward(batch)
        draft_logits = None
        if batch.drafts:  # the draft runs' rows come last
            logits, draft_logits = logits.split(
                [logits.shape[0] - batch.num_draft_rows, batch.num_draft_rows]
            )
        sampled = batch.sampled_requests
        if logits.shape[0] > len(sampled):  # rows past the sampled ones: prompt positions (prompt_logprobs)
            record_prompt_logprobs(batch, logits[len(sampled) :])
            logits = logits[: len(sampled)]
        finished: list[Request] = []
        touched: set[str] = set()
        if sampled:
            self._suppress_early_stop(logits, sampled)
            bitmask = None
            constrained = [i for i, r in enumerate(sampled) if r.grammar is not None]
            if constrained:
                with phase("engine.grammar_mask"):
                    bitmask = (constrained, self._grammar.masks([sampled[i].grammar for i in constrained]))
            with phase("engine.sample"):
                result = self.sampler(logits, sampled, bitmask)
            now = time.monotonic()
            with phase("engine.detokenize"):
                for i, req in enumerate(sampled):
                    if self._append(
                        req, result.token_ids[i], result.logprobs[i], result.top_logprobs[i], now
                    ):
                        finished.append(req)
                    touched.add(req.request_id)
            if constrained:  # the next masks are computed while the next forward runs
                self._grammar.prefetch(
                    [sampled[i].grammar for i in constrained if not sampled[i].is_finished]
                )
        if draft_logits is not None:
            with phase("engine.verify"):
                now = time.monotonic()
                finished += self.scheduler.speculator.verify(
                    batch.drafts,
                    draft_logits,
                    self.sampler,
                    lambda r, t, lp, top: self._append(r, t, lp, top, now),
                )
                touched.update(r.request.request_id for r in batch.drafts)
        self.scheduler.postprocess(batch, finished)
        outputs = self._collect(touched)
        if self.loras is not None and self.loras.registry.retired:
            self.loras.collect(self.lora_ids_in_use())
        kind = "verify" if batch.drafts else "prefill" if batch.prefills else "decode"
        self.step_times.observe(kind, time.perf_counter() - start)
        return outputs

    def _suppress_early_stop(self, logits: torch.Tensor, requests: list[Request]) -> None:
        for i, req in enumerate(requests):
            if len(req.output_token_ids) < req.params.min_tokens:
                stop_ids = list(req.eos_token_ids | set(req.params.stop_token_ids))
                with torch.inference_mode():  # the logits are an inference tensor
                    logits[i, stop_ids] = float("-inf")

    def _append(self, req: Request, token: int, logprob: float, top: dict | None, now: float) -> bool:
        """Record a sampled token; True when it ends the sequence."""
        if req.first_token_time is None:
            req.first_token_time = now
            self._prompt_tokens += len(req.prompt_token_ids)
            self._cached_prompt_tokens += req.num_cached_prompt_tokens
        req.output_token_ids.append(token)
        req.token_logprobs.append(logprob)
        if top is not None:
            req.top_logprobs.append(top)
        self._generation_tokens += 1
        params = req.params
        n_out = len(req.output_token_ids)
        if req.grammar is not None and not req.grammar.advance(token):
            req.error = (
                f"the structured output failed at its token {n_out}: {req.grammar.reason} (the grammar "
                "is past the grammar engine's limits at this point); simplify the schema or grammar"
            )
            logger.warning("request %s: %s", req.request_id, req.error)
            self._finish(req, "error", None)
        elif token in params.stop_token_ids and n_out >= params.min_tokens:
            self._finish(req, "stop", token)
        elif not params.ignore_eos and token in req.eos_token_ids and n_out >= params.min_tokens:
            self._finish(req, "stop", token)
        elif params.stop and self._hit_stop_string(req):
            pass
        elif req.grammar is not None and req.grammar.done:
            self._finish(req, "stop", None)
        elif n_out >= params.max_tokens or req.num_tokens >= self.max_model_len:
            self._finish(req, "length", None)
        else:
            return False
        return True

    def _hit_stop_string(self, req: Request) -> bool:
        text = self._decode(req)
        params = req.params
        start = max(0, req._stop_checked_len - max(len(s) for s in params.stop))
        for stop in params.stop:
            pos = text.find(stop, start)
            if pos != -1:
                req.text = text[: pos + len(stop)] if params.include_stop_str_in_output else text[:pos]
                self._finish(req, "stop", stop, keep_text=True)
                return True
        req._stop_checked_len = len(text)
        return False

    def _decode(self, req: Request) -> str:
        return self.tokenizer.decode(req.output_token_ids, skip_special_tokens=req.params.skip_special_tokens)

    def _finish(self, req: Request, reason: str, stop_reason, keep_text: bool = False) -> None:
        req.finish_reason = reason
        req.stop_reason = stop_reason
        if not keep_text:
            req.text = self._decode(req)

    def _collect(self, touched: set[str]) -> list[RequestOutput]:
        outputs = []
        for request_id in touched:
            group = self._groups.get(request_id)
            if group is None:
                continue
            finished = group.finished
            if finished or group.stream:
                outputs.append(self._output(group, finished))
            if finished:
                del self._groups[request_id]
        return outputs

    def _output(self, group: _Group, finished: bool) -> RequestOutput:
        completions = []
        for req in group.sequences:
            if req.is_finished:
                text = req.text
            else:
                text = self._decode(req).rstrip("\ufffd")  # hold back an incomplete character while streaming
            completions.append(
                CompletionOutput(
                    index=req.index,
                    text=text,
                    token_ids=list(req.output_token_ids),
                    token_logprobs=list(req.token_logprobs),
                    logprobs=list(req.top_logprobs) if req.params.logprobs is not None else None,
                    finish_reason=req.finish_reason,
                    stop_reason=req.stop_reason,
                    error=req.error,
                )
            )
        first = group.sequences[0]
        metrics = {"arrival_time": group.arrival_time}
        if first.first_token_time is not None:
            metrics["first_token_time"] = first.first_token_time
        return RequestOutput(
            request_id=group.request_id,
            prompt=group.prompt,
            prompt_token_ids=group.prompt_token_ids,
            outputs=completions,
            finished=finished,
            num_cached_tokens=max(s.num_cached_prompt_tokens for s in group.sequences),
            prompt_logprobs=prompt_logprobs_list(first) if first.params.prompt_logprobs is not None else None,
            metrics=metrics,
            weight_version=group.weight_version,
        )

    # ---- cache and weights -------------------------------------------------------------------------
    def close_session(self, session_id: str) -> bool:
        """Close a session: its pinned prefix becomes an ordinary cache entry again. False when not open."""
        return self.cache.close_session(session_id)

    def flush_cache(self) -> bool:
        """Drop every unlocked prefix-cache entry. Returns False when running requests still hold some."""
        return self.cache.flush()

    def weights_updated(self) -> None:
        """The module's parameters changed in place: cached KV and derived weight layouts are stale."""
        if self.tensor_parallel is not None:
            raise InvalidRequestError(
                "weight updates are not supported on a tensor-parallel engine (each rank holds a shard); "
                "restart it on the new weights"
            )
        if self.scheduler.has_work:
            raise InvalidRequestError(
                "weights changed while requests are running; finish or abort them first"
            )
        self.cache.reset()
        self.runner.weights_updated()

    def sleep(self) -> None:
        """Release the KV pool's memory (vLLM's sleep mode; the weights stay: they are the module's): the prefix
        cache is dropped and the pool's memory given back (on an accelerator its tensors freed and the
        allocator's cache emptied; on the host its pages dropped and the free heap trimmed).
        Nothing may run meanwhile; `wake_up` takes the memory back."""
        if self.sleeping:
            return
        if self.tensor_parallel is not None:
            raise InvalidRequestError(
                "sleep is not supported on a tensor-parallel engine (each rank holds a shard of the pool)"
            )
        if self.scheduler.has_work:
            raise InvalidRequestError(
                "the engine cannot sleep while requests run; finish or abort them first"
            )
        self.cache.reset()
        self.pool.release()
        devices.empty_cache(self.device)
        self.sleeping = True
        logger.debug("engine asleep: KV pool of %.2f GiB released", self.pool.nbytes / 2**30)

    def wake_up(self) -> None:
        """Take the KV pool's memory back after `sleep` (zeroed; on an accelerator at new addresses, on the host
        resident again as slots are written); the cache starts empty."""
        if not self.sleeping:
            return
        self.pool.reacquire()
        if self.pool.moves_on_release:
            self.runner.pool_reallocated()
        self.sleeping = False

    def set_weight_version(self, version: int) -> None:
        """The parameters were overwritten in place with `version`: the prefix cache is flushed (its KV was
        computed under the old weights) and later outputs say `version`."""
        self.weights_updated()
        self.weight_version = version

    def stats(self) -> EngineStats:
        self.cache.expire_sessions()
        open_sessions, pinned_sessions, counters = self.cache.session_counts()
        tier_total, tier_used, tier = self.cache.tier_counts()
        cached = self.cache.evictable_size()
        used = self.allocator.capacity - self.allocator.num_free - cached
        return EngineStats(
            num_running=len(self.scheduler.running),
            num_waiting=len(self.scheduler.waiting),
            kv_used_tokens=used,
            kv_cached_tokens=cached,
            kv_total_tokens=self.allocator.capacity,
            prompt_tokens=self._prompt_tokens,
            cached_prompt_tokens=self._cached_prompt_tokens,
            generation_tokens=self._generation_tokens,
            num_retracted=self.scheduler.num_retracted,
            step_times=self.step_times.copy(),
            kv_pinned_tokens=self.cache.pinned_tokens(),
            open_sessions=open_sessions,
            pinned_sessions=pinned_sessions,
            sessions_released_for_memory=counters.released_for_memory + counters.released_over_share,
            sessions_timed_out=counters.timed_out,
            kv_tier_total_tokens=tier_total,
            kv_tier_tokens=tier_used,
            kv_tier_written_tokens=tier.written_tokens,
            kv_tier_loaded_tokens=tier.loaded_tokens,
            **self._lora_stats(),
            **self._speculation_stats(),
        )

    def _lora_stats(self) -> dict:
        if self.loras is None:
            return {}

        def names(reqs) -> tuple[str, ...]:
            return tuple(sorted({r.lora_name for r in reqs if r.lora_name}))

        return dict(
            running_loras=names(self.scheduler.running),
            waiting_loras=names(self.scheduler.waiting),
            max_loras=self.loras.registry.max_loras,
        )

    def _speculation_stats(self) -> dict[str, int]:
        spec = self.scheduler.speculator
        if spec is None:
            return {}
        c = spec.counters
        return dict(
            spec_runs=c.runs,
            spec_draft_tokens=c.draft_tokens,
            spec_accepted_tokens=c.accepted_tokens,
            spec_emitted_tokens=c.emitted_tokens,
        )
