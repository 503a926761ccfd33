"""The teacher of on-policy distillation (`algorithm: opd`): log pi_teacher of the student's sampled tokens.

Local (a path, a packaged model's name, or null for the embedded model): a second model in the trainer,
frozen and sharded like the reference model, whose forward the update runs on each micro-batch (the
`Learner` takes it as an `nn.Module`). Remote (an http(s) URL of `vriksha serve`): each micro-batch's
sequences go to the server as token-id prompts in one `/v1/completions` request with `echo`, `logprobs`
and `max_tokens: 0`, which returns the log-probability of every prompt token after the first; the
completion's part of each is what the loss takes. Either way the teacher must share the student's
tokenizer: the scores are of the student's token ids.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor

from vriksha.errors import ConfigError
from vriksha.train.batch import GroupBatch
from vriksha.train.config import ModelConfig, OPDConfig

if TYPE_CHECKING:
    from transformers import PreTrainedModel

logger = logging.getLogger(__name__)

__all__ = ["RemoteTeacher", "is_remote", "load_local_teacher"]


def is_remote(teacher: str | None) -> bool:
    return teacher is not None and teacher.startswith(("http://", "https://"))


def _check_tokenizer(student: Any, teacher: Any, where: str) -> None:
    if student.get_vocab() != teacher.get_vocab():
        raise ConfigError(
            f"opd.teacher: {where}'s tokenizer differs from the student's (vocabularies of {len(teacher)} and "
            f"{len(student)} tokens or different ids): the teacher scores the student's token ids, so both "
            "must share one tokenizer"
        )


def load_local_teacher(cfg: OPDConfig, student_tokenizer: Any, seed: int) -> PreTrainedModel:
    """The teacher as a frozen Transformers model (the caller places and shards it)."""
    from vriksha.train.policy import load_policy

    model, tokenizer = load_policy(ModelConfig(path=cfg.teacher, dtype=cfg.teacher_dtype), seed)
    _check_tokenizer(student_tokenizer, tokenizer, cfg.teacher or "the embedded model")
    return model.requires_grad_(False)


class RemoteTeacher:
    """Scores micro-batches on a `vriksha serve` (see the module's docstring)."""

    def __init__(self, cfg: OPDConfig, student_tokenizer: Any) -> None:
        from openai import OpenAI

        assert cfg.teacher is not None
        base = cfg.teacher.rstrip("/")
        base = base if base.endswith("/v1") else f"{base}/v1"
        self.client = OpenAI(base_url=base, api_key="none", timeout=cfg.request_timeout_s, max_retries=2)
        try:
            self.model = self.client.models.list().data[0].id
        except Exception as exc:  # noqa: BLE001 - any failure to reach it is the same remedy
            raise ConfigError(
                f"opd.teacher: cannot reach a server at {cfg.teacher} ({type(exc).__name__}: {exc}); start "
                "`vriksha serve --model TEACHER` there or give a local model path"
            ) from None
        self.student_vocab = len(student_tokenizer)

    def __call__(self, batch: GroupBatch) -> Tensor:
        rows, lengths = [], []
        for j in range(batch.num_sequences):
            g = j // batch.group_size
            prompt = batch.prompt_ids[g][batch.prompt_mask[g].bool()].tolist()
            n = int(batch.completion_mask[j].sum())
            rows.append(prompt + batch.completion_ids[j, :n].tolist())
            lengths.append(n)
        answer = self.client.completions.create(
            model=self.model, prompt=rows, max_tokens=0, echo=True, logprobs=0, temperature=0.0
        )
        out = torch.zeros(batch.completion_ids.shape, dtype=torch.float32)
        choices = sorted(answer.choices, key=lambda c: c.index)
        if len(choices) != len(rows):
            raise RuntimeError(f"the teacher answered {len(choices)} choices for {len(rows)} sequences")
        for j, (choice, n) in enumerate(zip(choices, lengths, strict=True)):
            scores = choice.logprobs.token_logprobs if choice.logprobs is not None else None
            if scores is None or len(scores) != len(rows[j]):
                raise RuntimeError(
                    f"the teacher returned {0 if scores is None else len(scores)} prompt log-probs for "
                    f"{len(rows[j])} tokens; does the server support echo with logprobs?"
                )
            if n:
                out[j, :n] = torch.tensor([float("nan") if s is None else s for s in scores[-n:]])
        return out.to(batch.completion_ids.device)
