"""The `algorithm` field and its sections: defaults, and what each algorithm refuses by the option to change."""

from __future__ import annotations

import pytest

from vriksha.errors import ConfigError
from vriksha.train.config import TrainConfig


def test_grpo_is_the_default_and_sft_and_opd_are_chosen_by_name():
    assert TrainConfig().algorithm == "grpo"
    cfg = TrainConfig.from_dict({"algorithm": "sft", "sft": {"data": ["a.jsonl"]}})
    assert cfg.sft.data == ["a.jsonl"] and cfg.sft.only_successful
    cfg = TrainConfig.from_dict({"algorithm": "opd", "opd": {"teacher": "http://127.0.0.1:8000"}})
    assert cfg.opd.teacher == "http://127.0.0.1:8000" and cfg.opd.kl_coef == 1.0


@pytest.mark.parametrize(
    "data, message",
    [
        ({"algorithm": "sft"}, r"sft\.data: algorithm sft trains on JSONL files"),
        ({"algorithm": "sft", "sft": {"data": [" "]}}, r"sft\.data: an empty path"),
        (
            {"algorithm": "opd", "grpo": {"kl_coef": 0.1}},
            r"grpo\.kl_coef: algorithm opd's KL is to the teacher",
        ),
        ({"algorithm": "dpo"}, r"algorithm: Input should be 'grpo', 'sft' or 'opd'"),
        ({"algorithm": "opd", "opd": {"kl_coef": 0}}, r"opd\.kl_coef"),
    ],
)
def test_bad_choices_are_named(data, message):
    with pytest.raises(ConfigError, match=message):
        TrainConfig.from_dict(data)
