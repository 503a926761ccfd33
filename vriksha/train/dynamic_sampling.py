"""Dynamic sampling (DAPO's): a step trains on the groups that carry a learning signal.

A group whose rewards are all equal has zero advantage and adds nothing to the update; once a policy
solves or fails most prompts outright, most groups are like that and a step learns from a few. With
`rollout.dynamic_sampling_rounds` K > 0, a rank whose groups lack signal plays up to K more rounds
of fresh prompts (as many per round as its share of `prompts_per_step`) and keeps the groups with
signal first. It returns as many groups as it was asked for, filled with signal-less ones when K
rounds did not find enough, so the counts the update relies on (micro-batches, tensor-parallel
gathers) are the same as without it; the signal-less ones are skipped by the update as before.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from vriksha.envs.play import Episode
from vriksha.train.grpo import has_signal

__all__ = ["SampledGroups", "sample_with_signal"]


@dataclass(slots=True)
class SampledGroups:
    groups: list[list[Episode]]  # `want` groups, those with signal first
    played: int  # groups played in all rounds, the discarded ones included
    with_signal: int  # of those played
    rounds: int  # rounds played (1: no extra round was needed or allowed)


def sample_with_signal(
    play_round: Callable[[int], list[list[Episode]]], want: int, extra_rounds: int
) -> SampledGroups:
    """`play_round(r)` plays round r's prompts (round 0 is the step's own); `want` groups come back."""
    played = play_round(0)
    rounds = 1
    while rounds <= extra_rounds and sum(has_signal(g) for g in played) < want:
        played += play_round(rounds)
        rounds += 1
    signal = [g for g in played if has_signal(g)]
    rest = [g for g in played if not has_signal(g)]
    return SampledGroups((signal + rest)[:want], len(played), len(signal), rounds)
