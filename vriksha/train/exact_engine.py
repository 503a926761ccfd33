"""The rollout engine of `grpo.on_policy: exact`: it samples from the trainer's own forward.

Each request is played as one lockstep group (`lockstep.py`): the prompt, then one `[n, 1]` call per
position over the module the trainer's weights are in, under the trainer's precision. Token t is drawn from
the logits of call t (greedy at temperature 0; else the exponential race with the engine's seeded draws,
`sampler.draw_seed`, so a seed gives the same samples as the engine where their logits agree), and its
log-probability is the trainer's `token_logprobs` of those logits: the update recomputes exactly these bits.

What it gives up for that: no continuous batching, prefix cache, paged attention or fused kernels (a request
at a time, a Transformers forward per token). It implements what the trainer's episodes ask for (n, greedy or
temperature sampling at top_p 1, seeds, max_tokens, stop strings and token ids, EOS) and refuses the rest.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import torch

from vriksha.engine.core.outputs import CompletionOutput, RequestOutput
from vriksha.engine.core.sampler import draw_seed
from vriksha.errors import InvalidRequestError
from vriksha.train.lockstep import LockstepForward, token_logprobs

if TYPE_CHECKING:
    from transformers import PreTrainedModel

    from vriksha import SamplingParams
    from vriksha.envs.rollout_engine import TokenPrompt

logger = logging.getLogger(__name__)

__all__ = ["ExactEngine"]

# SamplingParams fields whose defaults the exact engine keeps: any other value is refused
UNSUPPORTED_DEFAULTS = {
    "top_p": 1.0,
    "top_k": -1,
    "min_p": 0.0,
    "min_tokens": 0,
    "ignore_eos": False,
    "presence_penalty": 0.0,
    "frequency_penalty": 0.0,
    "repetition_penalty": 1.0,
    "logit_bias": None,
    "allowed_token_ids": None,
    "bad_words": None,
    "prompt_logprobs": None,
    "structured_outputs": None,
}


class ExactEngine:
    """A `TrainingEngine` over `module` (read in place) whose sampling log-probs are the trainer's."""

    def __init__(
        self,
        module: PreTrainedModel,
        tokenizer: Any,
        precision: Callable[[], contextlib.AbstractContextManager[Any]] | None = None,
    ) -> None:
        """`precision()`: the context the trainer's forward runs under (its autocast), entered around every call."""
        self.module = module
        self.tokenizer = tokenizer
        self.precision = precision or contextlib.nullcontext
        self.weight_version = 0
        self.device = next(module.parameters()).device
        ids: set[int] = set()
        gen = getattr(module, "generation_config", None)
        for source in (getattr(gen, "eos_token_id", None), tokenizer.eos_token_id):
            if isinstance(source, int):
                ids.add(source)
            elif source:
                ids.update(source)
        self._eos = frozenset(ids)
        self.tokens_generated = 0

    @property
    def eos_token_ids(self) -> frozenset[int]:
        return self._eos

    # -- TrainingEngine ---------------------------------------------------------------------------

    def weights_updated(self) -> None:
        self.weight_version += 1

    def set_weight_version(self, version: int) -> None:
        self.weight_version = version

    def flush_cache(self) -> bool:
        return True  # no cache outlives a request

    def close(self) -> None:
        pass

    def generate(
        self,
        prompts: Sequence[TokenPrompt],
        sampling_params: Sequence[SamplingParams],
        /,
        use_tqdm: bool = False,
    ) -> list[RequestOutput]:
        if len(prompts) != len(sampling_params):
            raise InvalidRequestError(
                f"got {len(prompts)} prompts but {len(sampling_params)} sampling params"
            )
        for params in sampling_params:
            _check(params)
        return [
            self._play(i, list(p["prompt_token_ids"]), params)
            for i, (p, params) in enumerate(zip(prompts, sampling_params, strict=True))
        ]

    # -- one request ------------------------------------------------------------------------------

    @torch.no_grad()
    def _play(self, index: int, prompt: list[int], params: SamplingParams) -> RequestOutput:
        n = params.n
        forward = LockstepForward(self.module)
        tokens: list[list[int]] = [[] for _ in range(n)]
        logprobs: list[list[float]] = [[] for _ in range(n)]
        finish: list[str | None] = [None] * n
        stop_reason: list[int | str | None] = [None] * n
        texts: list[str | None] = [None] * n
        with self.precision():
            logits = forward.start(torch.tensor(prompt, device=self.device), n)
            for position in range(params.max_tokens):
                picked = self._sample(logits, params, position)
                lp, _ = token_logprobs(logits, picked)
                for r, (tok, value) in enumerate(zip(picked.tolist(), lp.tolist(), strict=True)):
                    if finish[r] is None:
                        tokens[r].append(tok)
                        logprobs[r].append(value)
                        finish[r], stop_reason[r], texts[r] = self._ended(tokens[r], params)
                if all(f is not None for f in finish):
                    break
                # a finished row is fed its last draw: no other row reads it (see lockstep.py)
                logits = forward.step(picked)
        outputs = []
        for r in range(n):
            reason = finish[r] or "length"
            cut = texts[r]
            text = cut if cut is not None else self._decode(tokens[r], params)
            outputs.append(CompletionOutput(r, text, tokens[r], logprobs[r], None, reason, stop_reason[r]))
            self.tokens_generated += len(tokens[r])
        return RequestOutput(
            request_id=f"exact-{index}",
            prompt=None,
            prompt_token_ids=prompt,
            outputs=outputs,
            finished=True,
            weight_version=self.weight_version,
        )

    def _sample(self, logits: torch.Tensor, params: SamplingParams, position: int) -> torch.Tensor:
        if params.temperature == 0:
            return logits.argmax(dim=-1)
        probs = torch.softmax(logits.float() / params.temperature, dim=-1)
        noise = torch.empty(probs.shape, dtype=probs.dtype)
        for r in range(probs.shape[0]):
            gen = torch.Generator()
            if params.seed is not None:
                # row r of a request with n completions: the engine seeds them seed + r
                gen.manual_seed(draw_seed(params.seed + r, position))
            else:
                gen.seed()
            noise[r].exponential_(generator=gen)
        return (probs / noise.to(probs.device)).argmax(dim=-1)

    def _decode(self, ids: list[int], params: SamplingParams) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=params.skip_special_tokens)

    def _ended(
        self, ids: list[int], params: SamplingParams
    ) -> tuple[str | None, int | str | None, str | None]:
        """(finish reason, stop reason, text when a stop string cut it) after the token just appended."""
        last = ids[-1]
        if last in params.stop_token_ids or last in self._eos:
            return "stop", last, None
        stops = [params.stop] if isinstance(params.stop, str) else (params.stop or [])
        if stops:
            text = self._decode(ids, params)
            for stop in stops:
                pos = text.find(stop)
                if pos != -1:
                    cut = text[: pos + len(stop)] if params.include_stop_str_in_output else text[:pos]
                    return "stop", stop, cut
        if len(ids) >= params.max_tokens:
            return "length", None, None
        return None, None, None


def _check(params: SamplingParams) -> None:
    for name, default in UNSUPPORTED_DEFAULTS.items():
        if getattr(params, name) != default:
            raise InvalidRequestError(
                f"grpo.on_policy exact: the exact engine does not implement {name}={getattr(params, name)!r} "
                f"(only n, temperature, seed, max_tokens, stop strings and token ids); leave {name} at "
                f"{default!r} or use grpo.on_policy: default"
            )
