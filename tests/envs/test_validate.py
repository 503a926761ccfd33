"""`validate` passes the built-ins and catches broken environments for the right reason."""

import random

import pytest

from vriksha.cli import main
from vriksha.envs import Environment, Observation, StepResult, TextAction
from vriksha.envs.validate import validate_env


def _checks(report):
    return {c.name: c for c in report.checks}


@pytest.mark.parametrize("name", ["arithmetic", "calculator_tools"])
def test_builtins_validate_clean(name):
    report = validate_env(name)
    assert report.ok, [(c.name, c.detail) for c in report.failed()]
    assert len(report.checks) == 10


@pytest.mark.slow
def test_python_functions_validates_clean():
    report = validate_env("python_functions", seeds=6, adversarial_episodes=2)
    assert report.ok, [(c.name, c.detail) for c in report.failed()]


class _Base(Environment):
    action_type = TextAction

    def _reset(self, seed, options):
        rng = random.Random(seed)
        self._answer = rng.randint(100, 999)
        return Observation(text=f"Guess the number (seed {seed}).")

    def _step(self, action):
        ok = action.text.strip() == str(self._answer)
        return StepResult(
            observation=Observation(),
            reward=float(ok),
            terminated=True,
            components={"ok": float(ok)},
            success=ok,
        )

    def _validation_ground_truth(self):
        return [str(self._answer)]


class Leaky(_Base):
    name = "test_leaky"

    def _reset(self, seed, options):
        obs = super()._reset(seed, options)
        obs.metadata["debug"] = {"expected": self._answer}
        return obs


class Generous(_Base):
    name = "test_generous"

    def _step(self, action):
        return StepResult(
            observation=Observation(),
            reward=1.0 if action.text else 0.0,
            terminated=True,
            components={"nonempty": 1.0},
            success=True,
        )


class Flaky(_Base):
    name = "test_flaky"

    def _reset(self, seed, options):
        self._answer = random.randint(100, 999)
        return Observation(text=f"Guess {random.random()}")


class OutOfBounds(_Base):
    name = "test_out_of_bounds"

    def _step(self, action):
        return StepResult(observation=Observation(), reward=-3.0, terminated=True, info={})


def test_catches_ground_truth_leak():
    c = _checks(validate_env(Leaky, seeds=3, adversarial_episodes=1))
    assert not c["no_ground_truth_reachable"].ok and "visible" in c["no_ground_truth_reachable"].detail
    assert c["determinism_by_seed"].ok


def test_catches_reward_for_nonsense():
    c = _checks(validate_env(Generous, seeds=3, adversarial_episodes=1))
    assert not c["adversarial_floor"].ok and "garbage scored" in c["adversarial_floor"].detail
    assert c["no_ground_truth_reachable"].ok


def test_catches_nondeterminism():
    c = _checks(validate_env(Flaky, seeds=3, adversarial_episodes=1))
    assert not c["determinism_by_seed"].ok


def test_catches_out_of_range_rewards_and_missing_info():
    c = _checks(validate_env(OutOfBounds, seeds=3, adversarial_episodes=1))
    assert not c["adversarial_floor"].ok and "outside" in c["adversarial_floor"].detail
    assert not c["reward_bounds"].ok


@pytest.mark.slow
def test_cli_validate_and_list(capsys):
    assert main(["env", "validate", "arithmetic", "--json"]) == 0
    out = capsys.readouterr().out
    assert '"ok": true' in out
    assert main(["env", "list", "--json"]) == 0
    out = capsys.readouterr().out
    assert '"arithmetic"' in out and '"calculator_tools"' in out and '"python_functions"' in out
    assert main(["env", "validate", "no_such_env"]) == 1
