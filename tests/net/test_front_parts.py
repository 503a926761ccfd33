"""The HTTP front's parts on their own: flags built from the config, the log rate limit, the descriptor limit,
and the body field types."""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import subprocess
import sys
import time

import pytest
from pydantic import ValidationError

from vriksha.errors import ConfigError
from vriksha.net import FrontConfig, add_flags, flag_name, from_args
from vriksha.net.fields import FiniteFloat, Seed, WireModel, find_invalid_text
from vriksha.net.logfilter import RepeatFilter


def test_every_front_option_is_a_flag_with_help_and_round_trips():
    parser = argparse.ArgumentParser()
    add_flags(parser, FrontConfig, "front")
    help_text = parser.format_help()
    for f in dataclasses.fields(FrontConfig):
        assert f.metadata.get("help"), f"{f.name} has no help text"
        assert flag_name(f.name) in help_text
    assert flag_name("header_timeout_s") == "--header-timeout"
    assert from_args(FrontConfig, parser.parse_args([])) == FrontConfig()
    args = parser.parse_args(["--max-connections", "7", "--header-timeout", "1.5", "--fd-limit", "300"])
    config = from_args(FrontConfig, args)
    assert (config.max_connections, config.header_timeout_s, config.fd_limit) == (7, 1.5, 300)


@pytest.mark.parametrize(
    "change", [{"max_connections": 0}, {"header_timeout_s": 0.0}, {"body_timeout_s": float("nan")}]
)
def test_bad_front_values_are_refused_by_name(change):
    config = dataclasses.replace(FrontConfig(), **change)
    with pytest.raises(ConfigError, match=next(iter(change))):
        config.validate()


def test_repeat_filter_bounds_a_flood_and_reports_what_it_dropped():
    filt = RepeatFilter(limit=3, window_s=0.2)
    logger = logging.getLogger("test.flood")

    def record(i: int) -> logging.LogRecord:
        return logger.makeRecord(logger.name, logging.ERROR, __file__, 1, "accept failed: %s", (i,), None)

    passed = [filt.filter(record(i)) for i in range(1000)]
    assert sum(passed) == 3
    other = logger.makeRecord(logger.name, logging.ERROR, __file__, 1, "another message", (), None)
    assert filt.filter(other)  # a different message has its own budget
    progress = logging.getLogger("vriksha.train").makeRecord(
        "vriksha.train", logging.INFO, "", 1, "step %d", (1,), None
    )
    assert all(filt.filter(progress) for _ in range(20))  # the application's info lines are not limited
    time.sleep(0.25)
    late = record(1001)
    assert filt.filter(late) and "997 more like this" in str(late.msg)


def test_fd_limit_is_raised_to_the_hard_limit_at_start():
    code = (
        "import json, resource; from vriksha.net.fdlimit import raise_fd_limit; "
        "hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]; "
        "print(json.dumps([list(raise_fd_limit(None)), hard]))"
    )

    def lower() -> None:
        import resource

        hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
        resource.setrlimit(resource.RLIMIT_NOFILE, (128, hard))

    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, preexec_fn=lower
    )
    assert out.returncode == 0, out.stderr
    (old, new), hard = json.loads(out.stdout)
    assert old == 128 and new == min(hard, 1 << 20) and new > old


class Body(WireModel):
    t: FiniteFloat | None = None
    seed: Seed | None = None
    data: dict | None = None


def test_fields_refuse_nan_big_seeds_and_unpaired_surrogates_saying_where():
    for bad in ({"t": float("nan")}, {"t": float("inf")}, {"seed": 2**64}, {"seed": -1}):
        with pytest.raises(ValidationError):
            Body.model_validate(bad)
    assert Body.model_validate({"t": 0.5, "seed": 2**63 - 1}).seed == 2**63 - 1
    with pytest.raises(ValidationError) as info:
        Body.model_validate({"data": {"messages": [{"content": "ok"}, {"content": "a\ud800"}]}})
    err = info.value.errors()[0]
    assert err["type"] == "invalid_unicode" and err["ctx"]["where"] == "data.messages[1].content", err
    assert err["ctx"]["code"] == "U+D800" and err["ctx"]["index"] == 1
    assert find_invalid_text({"emoji": "\U0001f600", "ids": [1, 2, 3]}) is None
