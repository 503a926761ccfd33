"""The classifier head: multinomial logistic regression (one torch Linear) over the sentence embeddings,
fitted full-batch with L-BFGS and an L2 penalty, stored as safetensors with its labels in the metadata."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import torch

from vriksha.errors import ConfigError


@dataclass(slots=True)
class Head:
    labels: list[str]
    weight: torch.Tensor  # (labels, dim)
    bias: torch.Tensor  # (labels,)

    def probs(self, emb: torch.Tensor) -> torch.Tensor:
        return torch.softmax(emb @ self.weight.T + self.bias, dim=-1)

    def save(self, path: Path, meta: dict[str, str] | None = None) -> None:
        from safetensors.torch import save_file

        path.parent.mkdir(parents=True, exist_ok=True)
        metadata = {"labels": json.dumps(self.labels), **(meta or {})}
        save_file({"weight": self.weight.contiguous(), "bias": self.bias.contiguous()}, str(path), metadata)

    @classmethod
    def load(cls, path: Path, expect_labels: list[str] | None = None, mode: str | None = None) -> Head:
        """`mode`: the embedding mode the head must have been fitted on (a head without one: transformer)."""
        from safetensors import safe_open

        if not path.is_file():
            raise ConfigError(
                f"the classifier head {path} does not exist: fit it with `vriksha route fit ROUTES EXAMPLES`"
            )
        try:
            with safe_open(str(path), "pt") as f:
                meta = f.metadata() or {}
                labels = json.loads(meta["labels"])
                weight, bias = f.get_tensor("weight").float(), f.get_tensor("bias").float()
        except (OSError, KeyError, ValueError) as exc:
            raise ConfigError(
                f"{path} is not a classifier head ({exc}); refit it with `vriksha route fit`"
            ) from None
        if expect_labels is not None and sorted(labels) != sorted(expect_labels):
            raise ConfigError(
                f"{path} was fitted for labels {labels}, the config lists {expect_labels}: refit it"
            )
        fitted = meta.get("mode", "transformer")
        if mode is not None and fitted != mode:
            raise ConfigError(
                f"{path} was fitted on {fitted} embeddings, the config's embedding.mode is {mode}: refit it "
                "with `vriksha route fit`, or set classifier.head to a head fitted in this mode"
            )
        return cls(labels, weight, bias)


def fit_head(
    emb: torch.Tensor, targets: torch.Tensor, labels: list[str], l2: float = 1e-3, steps: int = 200
) -> Head:
    """Fit softmax regression: deterministic (full batch, zero init), converges in a fraction of a second."""
    torch.manual_seed(0)
    linear = torch.nn.Linear(emb.shape[1], len(labels))
    torch.nn.init.zeros_(linear.weight)
    torch.nn.init.zeros_(linear.bias)
    opt = torch.optim.LBFGS(linear.parameters(), lr=1.0, max_iter=steps, line_search_fn="strong_wolfe")

    def closure() -> torch.Tensor:
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(linear(emb), targets) + l2 * linear.weight.square().sum()
        loss.backward()
        return loss

    opt.step(closure)
    return Head(labels, linear.weight.detach().clone(), linear.bias.detach().clone())
