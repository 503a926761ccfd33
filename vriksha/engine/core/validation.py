"""What a request must be before the engine takes it: the prompt forms it accepts, and the checks against the
model's vocabulary and context and the KV pool (each failure says what to change)."""

from __future__ import annotations

from typing import Any

from vriksha.engine.core.sampling_params import SamplingParams
from vriksha.errors import InvalidRequestError, PromptTooLongError

# text, token ids, or {"prompt": ...} / {"prompt_token_ids": ...} / both (ids tokenized already, text kept)
Prompt = str | list[int] | dict


def tokenize_prompt(tokenizer: Any, prompt: Prompt) -> tuple[str | None, list[int]]:
    """(the prompt's text or None, its token ids)."""
    if isinstance(prompt, dict):
        if "prompt_token_ids" in prompt:
            text = prompt.get("prompt")
            _, ids = tokenize_prompt(tokenizer, prompt["prompt_token_ids"])
            return (text if isinstance(text, str) else None), ids
        if "prompt" in prompt:
            prompt = prompt["prompt"]
        else:
            raise InvalidRequestError("a prompt dict needs 'prompt' or 'prompt_token_ids'")
    if isinstance(prompt, str):
        if not prompt:
            raise InvalidRequestError("the prompt is empty; send at least one token of text")
        return prompt, tokenizer.encode(prompt, add_special_tokens=False)
    if isinstance(prompt, (list, tuple)) and all(isinstance(t, int) for t in prompt):
        return None, list(prompt)
    raise InvalidRequestError(
        f"a prompt must be a string, a list of token ids or a dict with 'prompt_token_ids', got "
        f"{type(prompt).__name__}"
    )


def check_request(
    ids: list[int], params: SamplingParams, vocab_size: int, max_model_len: int, kv_capacity: int
) -> None:
    params.validate()
    if not ids:
        raise InvalidRequestError("the prompt is empty; send at least one token")
    bad = [t for t in ids if not 0 <= t < vocab_size]
    if bad:
        raise InvalidRequestError(f"token id {bad[0]} is outside the vocabulary [0, {vocab_size})")
    bad = [t for t in params.token_ids_used() if not 0 <= t < vocab_size]
    if bad:
        raise InvalidRequestError(
            f"invalid sampling parameter: token id {bad[0]} (in logit_bias, allowed_token_ids or "
            f"stop_token_ids) is outside the vocabulary [0, {vocab_size})"
        )
    if len(ids) >= max_model_len:
        raise PromptTooLongError(
            f"the prompt has {len(ids)} tokens but the model's context is {max_model_len} tokens; "
            "shorten the prompt"
        )
    need = min(len(ids) + params.max_tokens, max_model_len)
    if need > kv_capacity:
        raise InvalidRequestError(
            f"the request needs {need} KV slots (prompt {len(ids)} + max_tokens {params.max_tokens}) but the "
            f"KV pool holds {kv_capacity}; raise kv_cache_memory_gb or lower max_tokens"
        )
