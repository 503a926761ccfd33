"""The prompt's token ids as the replicas' engine will see them: the same tokenizer, the same chat template
and the same request validation as `vriksha serve` (so a bad request gets the same 4xx here).

Tokenizing is most of the router's own time per request, so encoding goes straight to the Rust tokenizer
(the `transformers` wrapper around it costs as much again) and the ids of recent prompt texts are kept:
a retried request, or the same prompt sent n times (sampling several answers, RL rollouts), is tokenized once.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Any

from vriksha.server.prompts import completion_prompts, render_chat
from vriksha.server.protocol import ChatCompletionRequest, CompletionRequest, GenerateRequest
from vriksha.server.protocol_responses import ResponsesRequest


class CachedEncoder:
    """A tokenizer whose `encode(text, add_special_tokens=False)` is memoised (LRU, bounded in entries and
    characters) and, where the tokenizer has a Rust backend, bypasses the Python wrapper; everything else is
    the tokenizer's own."""

    def __init__(self, tokenizer: Any, max_entries: int = 2048, max_chars: int = 8 << 20) -> None:
        self._tok = tokenizer
        self._backend = getattr(tokenizer, "backend_tokenizer", None)
        self._cache: OrderedDict[str, list[int]] = OrderedDict()
        self._chars = 0
        self._lock = threading.Lock()
        self.max_entries, self.max_chars = max_entries, max_chars
        self.hits = self.misses = 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self._tok, name)

    def encode(self, text: str, add_special_tokens: bool = True, **kwargs: Any) -> list[int]:
        if add_special_tokens or kwargs or not isinstance(text, str):
            return self._tok.encode(text, add_special_tokens=add_special_tokens, **kwargs)
        with self._lock:  # large prompts are tokenized on worker threads, small ones on the event loop
            ids = self._cache.get(text)
            if ids is not None:
                self._cache.move_to_end(text)
                self.hits += 1
                return list(ids)
            self.misses += 1
        if self._backend is not None:
            ids = self._backend.encode(text, add_special_tokens=False).ids
        else:
            ids = self._tok.encode(text, add_special_tokens=False)
        if len(text) <= self.max_chars // 4:
            with self._lock:
                if text not in self._cache:
                    self._chars += len(text)
                self._cache[text] = ids
                while len(self._cache) > self.max_entries or self._chars > self.max_chars:
                    old, _ = self._cache.popitem(last=False)
                    self._chars -= len(old)
        return list(ids)


class PromptTokens:
    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer if isinstance(tokenizer, CachedEncoder) else CachedEncoder(tokenizer)

    @classmethod
    def for_model(cls, model: str | None) -> PromptTokens:
        from vriksha.loading.loader import load_tokenizer, resolve_model_path

        return cls(load_tokenizer(resolve_model_path(model)))

    def _encode(self, prompt: str | list[int]) -> list[int]:
        if isinstance(prompt, str):
            return self.tokenizer.encode(prompt, add_special_tokens=False)
        return list(prompt)

    def completion(self, req: CompletionRequest) -> list[int]:
        """The first prompt's tokens (a batch of prompts goes to one replica)."""
        return self._encode(completion_prompts(req)[0])

    def chat(self, req: ChatCompletionRequest) -> list[int]:
        return render_chat(self.tokenizer, req)

    def responses(self, req: ResponsesRequest) -> list[int]:
        """The instructions and input items (a previous response's conversation is on the replica that
        stored it: not counted)."""
        from vriksha.server.responses_items import input_messages

        messages = input_messages(req.input)
        if not messages:
            return []
        if req.instructions:
            messages.insert(0, {"role": "system", "content": req.instructions})
        chat = ChatCompletionRequest.model_validate({"model": req.model, "messages": messages})
        return render_chat(self.tokenizer, chat)

    def generate(self, req: GenerateRequest) -> list[int]:
        if req.input_ids:
            first = req.input_ids[0]
            return list(first) if isinstance(first, list) else list(req.input_ids)  # type: ignore[arg-type]
        return self._encode(req.text or "")
