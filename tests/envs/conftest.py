"""Shared fixtures for the environment tests."""

import pytest

from vriksha.envs import Environment, Observation, TextAction, Tool, register_env
from vriksha.envs.registry import unregister_env
from vriksha.envs.rubrics import Criterion


class CountdownEnv(Environment):
    """Say the secret-free number: reply with the seed's digit count of 'x'; two turns at most."""

    name = "test_countdown"
    action_type = TextAction
    max_turns = 2

    def _reset(self, seed, options):
        self._target = seed % 7 + 1
        return Observation(text=f"Write the letter x exactly {self._target} times.")

    def _step(self, action):
        score = Criterion("exact", lambda ep, a: a.strip() == "x" * ep)(self._target, action.text)
        done = score.success
        return score.result(Observation(text="" if done else "try again"), terminated=done)

    def tools(self):
        return [
            Tool(
                "echo",
                "Echo a word.",
                {
                    "type": "object",
                    "properties": {"word": {"type": "string"}},
                    "required": ["word"],
                    "additionalProperties": False,
                },
                fn=lambda word: word.upper(),
            )
        ]


@pytest.fixture
def countdown_env():
    register_env(CountdownEnv)
    yield CountdownEnv
    unregister_env(CountdownEnv.name)
