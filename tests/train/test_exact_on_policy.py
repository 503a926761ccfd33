"""`grpo.on_policy: exact`: the exact engine's sampling log-probs equal the update's log-probs bit for bit."""

from __future__ import annotations

import pytest
import torch

from tests.tiny_llama import embedded_tokenizer, tiny_llama
from tests.train.trainer_runs import eval_rows, metrics_rows, run_trainer, write_config
from vriksha import SamplingParams
from vriksha.errors import ConfigError, InvalidRequestError
from vriksha.train.batch import collate_groups
from vriksha.train.config import TrainConfig
from vriksha.train.exact_engine import ExactEngine
from vriksha.train.lockstep import lockstep_logprobs
from vriksha.train.logprobs import completion_logprobs
from vriksha.train.precision import TrainPrecision
from vriksha.train.rollout import Episode

PROMPTS = ["Compute 2 + 3.", "What is 7 times 8? Answer with a number only."]
CPU = torch.device("cpu")


@pytest.fixture(scope="module")
def tokenizer():
    return embedded_tokenizer()


def _play(model, tok, precision: TrainPrecision, max_tokens: int = 8, temperature: float = 1.0):
    """Two groups of three played on the exact engine (a fifth of the vocabulary stops a completion, so
    they end at different lengths), as the update's batch."""
    engine = ExactEngine(model, tok, precision=lambda: precision.autocast(CPU))
    prompts = [tok(p)["input_ids"] for p in PROMPTS]
    stops = list(range(0, len(tok), 5))
    params = [
        SamplingParams(n=3, temperature=temperature, seed=11 + i, max_tokens=max_tokens, stop_token_ids=stops)
        for i in range(len(prompts))
    ]
    outputs = engine.generate([{"prompt_token_ids": p} for p in prompts], params)
    groups = [
        [
            Episode(
                group=gi,
                member=c.index,
                seed=0,
                prompt_ids=prompt,
                completion_ids=list(c.token_ids),
                engine_logprobs=list(c.token_logprobs),
                loss_mask=[1] * len(c.token_ids),
                finish_reason=c.finish_reason,
            )
            for c in out.outputs
        ]
        for gi, (prompt, out) in enumerate(zip(prompts, outputs, strict=True))
    ]
    return collate_groups(groups, [[1.0, -1.0, 0.5]] * len(groups), tok.pad_token_id), outputs


def _assert_bitwise(model, batch, precision: TrainPrecision, backward: bool = True):
    with precision.autocast(CPU):
        out = lockstep_logprobs(model, batch, with_entropy=True)
    mask = batch.loss_mask.bool()
    assert out.logprobs.requires_grad
    assert torch.equal(out.logprobs[mask].detach(), batch.engine_logprobs[mask])
    if not backward:
        return out
    (out.logprobs * batch.loss_mask).sum().backward()
    assert all(p.grad is not None and p.grad.isfinite().all() for p in model.parameters() if p.requires_grad)
    return out


@pytest.mark.parametrize("mode", ["fp32", "bf16-autocast"])
@pytest.mark.parametrize("family", ["llama", "qwen2"])
def test_sampling_logprobs_equal_the_update_bit_for_bit(tokenizer, family, mode):
    model = tiny_llama(tokenizer, family=family).eval()
    precision = TrainPrecision(mode, "given", "given")
    batch, outputs = _play(model, tokenizer, precision)
    lengths = {len(c.token_ids) for out in outputs for c in out.outputs}
    assert len(lengths) > 1, "the completions should end at different lengths"
    out = _assert_bitwise(model, batch, precision)
    # the default update's batched forward computes the same numbers, but not the same bits
    with precision.autocast(CPU), torch.no_grad():
        batched = completion_logprobs(model, batch, chunk_tokens=0).logprobs
    mask = batch.loss_mask.bool()
    tol = {"rtol": 2e-2, "atol": 2e-2} if mode != "fp32" else {"rtol": 1e-4, "atol": 1e-5}
    torch.testing.assert_close(batched[mask], out.logprobs[mask].detach(), **tol)


@pytest.mark.slow
def test_the_embedded_model_fp32(tokenizer):
    from vriksha.loading import load_model

    model = load_model(None, dtype=torch.float32).model.eval()
    precision = TrainPrecision("fp32", "none", "given")
    batch, _ = _play(model, tokenizer, precision, max_tokens=4)
    _assert_bitwise(model, batch, precision, backward=False)


def test_greedy_and_seeded_draws_repeat(tokenizer):
    model = tiny_llama(tokenizer).eval()
    precision = TrainPrecision("fp32", "none", "given")
    first, a = _play(model, tokenizer, precision)
    again, b = _play(model, tokenizer, precision)
    assert torch.equal(first.completion_ids, again.completion_ids)
    greedy, g = _play(model, tokenizer, precision, temperature=0.0)
    for out in g:  # greedy rows of a group are the same completion
        assert len({tuple(c.token_ids) for c in out.outputs}) == 1
    _assert_bitwise(model, greedy, precision)


def test_unimplemented_sampling_options_are_refused(tokenizer):
    engine = ExactEngine(tiny_llama(tokenizer).eval(), tokenizer)
    with pytest.raises(InvalidRequestError, match="top_k"):
        engine.generate([{"prompt_token_ids": [1, 2]}], [SamplingParams(top_k=5, max_tokens=2)])


@pytest.mark.parametrize(
    ("section", "value", "named"),
    [
        ({"rollout": {"max_turns": 2}}, 2, "rollout.max_turns"),
        ({"rollout": {"mode": "server"}}, "server", "rollout.mode"),
        ({"rollout": {"max_staleness": 1}}, 1, "rollout.max_staleness"),
        ({"rollout": {"top_p": 0.9}}, 0.9, "rollout.top_p"),
    ],
)
def test_what_exact_cannot_do_is_refused_by_its_option(section, value, named):
    base = {"grpo": {"on_policy": "exact"}, "rollout": {"max_turns": 1}}
    data = {**base, **{k: {**base.get(k, {}), **v} for k, v in section.items()}}
    with pytest.raises(ConfigError, match=named):
        TrainConfig.from_dict(data)
    TrainConfig.from_dict(base)


@pytest.mark.slow
def test_a_training_run_has_no_logprob_gap(tiny_model_dir, tmp_path):
    """The real trainer (FSDP-wrapped policy, one process): every step's pi_old equals mu exactly, so nothing
    is clipped or masked by the importance correction."""
    config = write_config(tmp_path, tiny_model_dir, "exact", steps=2, checkpoint_interval=0, eval_episodes=2)
    sets = ["grpo.on_policy=exact", "rollout.max_turns=1", "rollout.max_new_tokens=3", "rollout.group_size=4"]
    sets.append("trainer.eval_samples=2")  # the held-out evaluation's pass@k, on the same engine
    run_trainer([str(config), *[a for s in sets for a in ("--set", s)]])
    rows = metrics_rows(tmp_path / "exact")
    assert [r["step"] for r in rows] == [1, 2]
    trained = [r for r in rows if r["groups/played_with_signal"] > 0]
    assert trained, "no step trained: no group had a reward spread"
    for row in trained:
        assert row["logprob_gap/mean"] == 0.0
        assert row["importance_weight/mean"] == 1.0
        assert row["importance_weight/clipped"] == 0.0
    evals = eval_rows(tmp_path / "exact")
    assert [e["step"] for e in evals] == [0, 2]
    for e in evals:
        assert e["pass@1"] == pytest.approx(e["avg@2"]) and e["pass@1"] <= e["pass@2"] <= 1.0
