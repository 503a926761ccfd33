"""The prompt's token ids as the replicas' engine will see them: the same tokenizer, the same chat template
and the same request validation as `vriksha serve` (so a bad request gets the same 4xx here)."""

from __future__ import annotations

from typing import Any

from vriksha.server.prompts import completion_prompts, render_chat
from vriksha.server.protocol import ChatCompletionRequest, CompletionRequest, GenerateRequest


class PromptTokens:
    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer

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

    def generate(self, req: GenerateRequest) -> list[int]:
        if req.input_ids:
            first = req.input_ids[0]
            return list(first) if isinstance(first, list) else list(req.input_ids)  # type: ignore[arg-type]
        return self._encode(req.text or "")
