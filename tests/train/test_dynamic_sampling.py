"""Dynamic sampling: extra rounds of fresh prompts until a step's groups carry signal."""

import pytest

from tests.train.trainer_runs import read_rows, run_trainer, write_config
from vriksha.train.dynamic_sampling import sample_with_signal
from vriksha.train.grpo import has_signal
from vriksha.train.rollout import Episode


def _group(tag: int, rewards: list[float]) -> list[Episode]:
    return [Episode(group=tag, member=m, seed=tag, prompt_ids=[1], reward=r) for m, r in enumerate(rewards)]


class Rounds:
    """Round r returns the groups scripted for it; records which rounds were asked for."""

    def __init__(self, script: list[list[list[float]]]) -> None:
        self.script = script
        self.asked: list[int] = []

    def __call__(self, r: int) -> list[list[Episode]]:
        self.asked.append(r)
        return [_group(10 * r + i, rewards) for i, rewards in enumerate(self.script[r])]


def test_off_plays_one_round_and_keeps_its_groups():
    rounds = Rounds([[[0, 0], [1, 0]]])
    out = sample_with_signal(rounds, want=2, extra_rounds=0)
    assert rounds.asked == [0]
    assert (out.played, out.with_signal, out.rounds) == (2, 1, 1)
    assert sorted(g[0].seed for g in out.groups) == [0, 1]


def test_plays_until_enough_groups_have_signal_and_puts_them_first():
    rounds = Rounds([[[0, 0], [1, 0]], [[1, 1], [0, 0]], [[0, 1], [1, 1]], [[0, 1], [0, 1]]])
    out = sample_with_signal(rounds, want=2, extra_rounds=5)
    assert rounds.asked == [0, 1, 2]  # round 2 brings the second group with signal: no round 3
    assert (out.played, out.with_signal, out.rounds) == (6, 2, 3)
    assert [g[0].seed for g in out.groups] == [1, 20]
    assert all(has_signal(g) for g in out.groups)


def test_rounds_are_bounded_and_the_batch_is_filled_without_signal():
    rounds = Rounds([[[0, 0], [0, 0]], [[1, 1], [0, 1]], [[0, 1], [0, 1]]])
    out = sample_with_signal(rounds, want=2, extra_rounds=1)
    assert rounds.asked == [0, 1]
    assert (out.played, out.with_signal, out.rounds) == (4, 1, 2)
    assert len(out.groups) == 2 and has_signal(out.groups[0]) and not has_signal(out.groups[1])


@pytest.mark.slow
def test_trainer_plays_extra_rounds_and_counts_them(tiny_model_dir, tmp_path):
    cfg = write_config(tmp_path, tiny_model_dir, "dyn", steps=2, eval_episodes=0, export=False)
    run_trainer([str(cfg), "--set", "rollout.dynamic_sampling_rounds=3"])
    rows = read_rows(tmp_path / "dyn")
    assert [r["step"] for r in rows] == [1, 2]
    for r in rows:
        assert r["groups/total"] == 4  # prompts_per_step, whatever was played
        assert r["groups/played"] in (4, 8, 12, 16)  # whole rounds of 4 fresh prompts
        with_signal_trained = r["groups/total"] - r["groups/zero_variance"]
        assert with_signal_trained == min(4, r["groups/played_with_signal"])
        # the rule: rounds stop once 4 groups have signal, or when all 1 + 3 are played
        assert r["groups/played_with_signal"] >= 4 or r["groups/played"] == 16
