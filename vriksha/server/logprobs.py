"""Engine log-probabilities -> OpenAI's two logprobs shapes (completions and chat)."""

from __future__ import annotations

from typing import Any

from vriksha.server.responses import ChoiceLogprobs, CompletionLogprobs, TokenLogprob, TopLogprob


class TokenText:
    """Decodes single token ids, cached (the same ids recur in every step's alternatives)."""

    def __init__(self, tokenizer: Any) -> None:
        self._tok = tokenizer
        self._cache: dict[int, str] = {}

    def __call__(self, token_id: int) -> str:
        s = self._cache.get(token_id)
        if s is None:
            s = self._tok.decode([token_id])
            if len(self._cache) < 200_000:
                self._cache[token_id] = s
        return s


def _top(step: dict[int, float] | None, k: int) -> list[tuple[int, float]]:
    if not step or k <= 0:
        return []
    return sorted(step.items(), key=lambda kv: kv[1], reverse=True)[:k]


def completion_logprobs(
    text_of: TokenText,
    token_ids: list[int],
    token_lps: list[float],
    steps: list[dict[int, float]] | None,
    k: int,
    offset: int = 0,
) -> CompletionLogprobs:
    out = CompletionLogprobs()
    for i, tid in enumerate(token_ids):
        tok = text_of(tid)
        out.tokens.append(tok)
        out.token_logprobs.append(token_lps[i] if i < len(token_lps) else None)
        step = steps[i] if steps is not None and i < len(steps) else None
        out.top_logprobs.append({text_of(t): lp for t, lp in _top(step, k)} if k > 0 else None)
        out.text_offset.append(offset)
        offset += len(tok)
    return out


def chat_logprobs(
    text_of: TokenText,
    token_ids: list[int],
    token_lps: list[float],
    steps: list[dict[int, float]] | None,
    k: int,
) -> ChoiceLogprobs:
    content = []
    for i, tid in enumerate(token_ids):
        tok = text_of(tid)
        step = steps[i] if steps is not None and i < len(steps) else None
        top = [
            TopLogprob(token=text_of(t), logprob=lp, bytes=list(text_of(t).encode()))
            for t, lp in _top(step, k)
        ]
        lp = token_lps[i] if i < len(token_lps) else float("nan")
        content.append(TokenLogprob(token=tok, logprob=lp, bytes=list(tok.encode()), top_logprobs=top))
    return ChoiceLogprobs(content=content)


def prompt_completion_logprobs(
    text_of: TokenText, prompt_ids: list[int], steps: list[dict[int, float] | None], k: int
) -> CompletionLogprobs:
    """The prompt's part of `echo` with `logprobs`: the first token has none, as in OpenAI's answers."""
    lps: list[float | None] = [None] + [
        s[t] if s else None for t, s in zip(prompt_ids[1:], steps[1:], strict=True)
    ]
    out = CompletionLogprobs()
    offset = 0
    for i, tid in enumerate(prompt_ids):
        tok = text_of(tid)
        out.tokens.append(tok)
        out.token_logprobs.append(lps[i])
        out.top_logprobs.append(
            {text_of(t): lp for t, lp in _top(steps[i], k)} if steps[i] and k > 0 else None
        )
        out.text_offset.append(offset)
        offset += len(tok)
    return out


def vllm_prompt_logprobs(
    text_of: TokenText, prompt_ids: list[int], steps: list[dict[int, float] | None] | None
) -> list[dict[str, dict[str, Any]] | None] | None:
    """vLLM's `prompt_logprobs` shape: per position None or {token id: {logprob, rank, decoded_token}}."""
    if steps is None:
        return None
    out: list[dict[str, dict[str, Any]] | None] = []
    for step in steps:
        if step is None:
            out.append(None)
            continue
        ranked = sorted(step.items(), key=lambda kv: kv[1], reverse=True)
        out.append(
            {
                str(t): {"logprob": lp, "rank": r + 1, "decoded_token": text_of(t)}
                for r, (t, lp) in enumerate(ranked)
            }
        )
    return out
