"""Each command keeps its flags and their defaults (tests/cli_flags.py explains the snapshot)."""

import json
from pathlib import Path

import pytest

from tests.cli_flags import flag_table
from vriksha.cli import build_parser

SNAPSHOT = Path(__file__).with_name("cli_flags.json")


def test_every_command_keeps_its_flags_and_defaults():
    want, have = json.loads(SNAPSHOT.read_text()), flag_table()
    assert sorted(have) == sorted(want), "the commands changed"
    for command in want:
        gone = sorted(set(want[command]) - set(have[command]))
        new = sorted(set(have[command]) - set(want[command]))
        assert not gone and not new, f"{command}: flags gone {gone}, new {new}"
        moved = {
            f: (want[command][f], have[command][f])
            for f in want[command]
            if want[command][f] != have[command][f]
        }
        assert not moved, f"{command}: defaults changed (was, now): {moved}"


def test_the_removed_sandbox_flag_says_why(capsys):
    with pytest.raises(SystemExit):
        build_parser().parse_args(["repo2env", "validate", "DIR", "--sandbox"])
    assert "--sandbox is gone: every test run is sandboxed already" in capsys.readouterr().err
