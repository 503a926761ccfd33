"""The offline API in vLLM's shape: `LLM(model=...)`, `generate`, `chat`, `stream`."""

from __future__ import annotations

import weakref
from collections.abc import Iterator, Sequence

import torch

from vriksha.engine.config import EngineConfig
from vriksha.engine.core.llm_engine import LLMEngine
from vriksha.engine.core.outputs import RequestOutput
from vriksha.engine.core.sampling_params import SamplingParams
from vriksha.engine.core.stats import EngineStats
from vriksha.engine.core.validation import Prompt
from vriksha.errors import InvalidRequestError


class LLM:
    """Generate from a Transformers model with the engine.

    >>> llm = LLM()  # the embedded SmolLM2-135M-Instruct
    >>> out = llm.generate(["The capital of France is"], SamplingParams(temperature=0, max_tokens=8))
    >>> out[0].outputs[0].text

    An `LLM` that built its engine closes it when it goes out of scope, at `close()` or at the end of a `with`
    block: a module given to `from_module` is then handed back as it came.
    """

    def __init__(
        self,
        model: str | None = None,
        *,
        config: EngineConfig | None = None,
        engine: LLMEngine | None = None,
        owns_engine: bool | None = None,
        **config_kwargs,
    ) -> None:
        """Build an engine from `config` (or `model` and EngineConfig fields by keyword), or wrap `engine`."""
        owns = engine is None if owns_engine is None else owns_engine
        if engine is None:
            if config is None:
                config = EngineConfig.from_flat(model=model, **config_kwargs)
            elif model is not None or config_kwargs:
                raise InvalidRequestError("pass either config or model and engine options, not both")
            engine = LLMEngine(config)
        self.engine = engine
        self._finalizer = weakref.finalize(self, self.engine.close) if owns else None

    @classmethod
    def from_module(
        cls, module: torch.nn.Module, tokenizer, config: EngineConfig | None = None, **config_kwargs
    ) -> LLM:
        """Wrap an existing module; its parameters are used in place (call `weights_updated()` after changes).
        Options come as an `EngineConfig` or as its fields by keyword."""
        engine = LLMEngine.from_module(module, tokenizer, config, **config_kwargs)
        return cls(engine=engine, owns_engine=True)

    def close(self) -> None:
        """Close the engine this `LLM` built (the module it wraps is restored); later calls do nothing."""
        if self._finalizer is not None:
            self._finalizer()

    def __enter__(self) -> LLM:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def tokenizer(self):
        return self.engine.tokenizer

    @property
    def model(self) -> torch.nn.Module:
        return self.engine.model

    @property
    def eos_token_ids(self) -> frozenset[int]:
        """The ids that end a completion: the model's `generation_config` EOS ids and the tokenizer's."""
        return self.engine.eos_token_ids

    def generate(
        self,
        prompts: Prompt | Sequence[Prompt],
        sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
        use_tqdm: bool = False,
        lora: str | Sequence[str | None] | None = None,
        session_id: str | Sequence[str | None] | None = None,
    ) -> list[RequestOutput]:
        """`lora`: the LoRA adapter (by name, loaded with `engine.add_lora`) of every prompt, or of each.
        `session_id`: the session every prompt (or each) continues: its K/V stays pinned in the prefix cache
        after it finishes, until the session's next turn, `close_session` or the session timeout."""
        if isinstance(prompts, (str, dict)) or (
            isinstance(prompts, list) and prompts and isinstance(prompts[0], int)
        ):
            prompts = [prompts]
        prompts = list(prompts)
        if isinstance(sampling_params, Sequence):
            if len(sampling_params) != len(prompts):
                raise InvalidRequestError(
                    f"got {len(prompts)} prompts but {len(sampling_params)} sampling params; pass one or one each"
                )
            params_list = list(sampling_params)
        else:
            params_list = [sampling_params or SamplingParams()] * len(prompts)
        # everything is validated before anything runs: one bad prompt rejects the call, not half of it
        sessions = (
            [session_id] * len(prompts) if session_id is None or isinstance(session_id, str) else session_id
        )
        added = self.engine.add_requests(prompts, params_list, loras=lora, session_ids=list(sessions))
        order = {rid: i for i, rid in enumerate(added)}
        results: list[RequestOutput | None] = [None] * len(order)
        bar = None
        if use_tqdm:
            from tqdm import tqdm

            bar = tqdm(total=len(order), desc="generate", unit="req")
        try:
            while self.engine.has_unfinished:
                for out in self.engine.step():
                    if out.finished and out.request_id in order:
                        results[order[out.request_id]] = out
                        if bar is not None:
                            bar.update(1)
        except BaseException:
            for rid in order:
                self.engine.abort(rid)
            raise
        finally:
            if bar is not None:
                bar.close()
        return [r for r in results if r is not None]

    def chat(
        self,
        messages: list[dict] | list[list[dict]],
        sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
        add_generation_prompt: bool = True,
        use_tqdm: bool = False,
        session_id: str | Sequence[str | None] | None = None,
    ) -> list[RequestOutput]:
        conversations = [messages] if messages and isinstance(messages[0], dict) else messages
        prompts = [
            {"prompt_token_ids": self.apply_chat_template(c, add_generation_prompt)} for c in conversations
        ]
        return self.generate(prompts, sampling_params, use_tqdm=use_tqdm, session_id=session_id)

    def apply_chat_template(self, messages: list[dict], add_generation_prompt: bool = True) -> list[int]:
        if not getattr(self.tokenizer, "chat_template", None):
            raise InvalidRequestError(
                "this model's tokenizer has no chat template; use generate() with a prompt"
            )
        text = self.tokenizer.apply_chat_template(
            messages, add_generation_prompt=add_generation_prompt, tokenize=False
        )
        return self.tokenizer.encode(text, add_special_tokens=False)

    def stream(
        self, prompt: Prompt, sampling_params: SamplingParams | None = None
    ) -> Iterator[RequestOutput]:
        """Cumulative outputs of one request, one per engine step; the last has `finished=True`."""
        rid = self.engine.add_request(prompt, sampling_params, stream=True)
        try:
            while True:
                for out in self.engine.step():
                    if out.request_id == rid:
                        yield out
                        if out.finished:
                            return
                if not self.engine.has_unfinished:
                    return
        finally:
            self.engine.abort(rid)

    def close_session(self, session_id: str) -> bool:
        """Close a session: its pinned prefix becomes an ordinary (evictable) cache entry. False when not open."""
        return self.engine.close_session(session_id)

    def flush_cache(self) -> bool:
        return self.engine.flush_cache()

    def weights_updated(self) -> None:
        self.engine.weights_updated()

    def sleep(self) -> None:
        """Release the KV pool's memory until `wake_up()` (vLLM's name): the prefix cache is dropped, nothing
        may be generated meanwhile. The weights stay (they are the wrapped module's)."""
        self.engine.sleep()

    def wake_up(self) -> None:
        """Take the KV pool's memory back after `sleep()`; generation works as before."""
        self.engine.wake_up()

    def set_weight_version(self, version: int) -> None:
        """The module's parameters now hold `version`: caches reset, later outputs report `version`."""
        self.engine.set_weight_version(version)

    def stats(self) -> EngineStats:
        return self.engine.stats()
