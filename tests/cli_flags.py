"""Every `vriksha` command's flags and their defaults, as its parser declares them (hidden flags included): a
snapshot of this table (tests/cli_flags.json) keeps each command's flags and defaults as users know them while
the parsers' code moves. A flag declared by a config class shows its default in its help (`{"declared": ...}`
here). `python -m tests.cli_flags > tests/cli_flags.json` rewrites the snapshot after a
deliberate change."""

from __future__ import annotations

import argparse
import json
import sys

from vriksha.cli import build_parser


def _default(value: object) -> object:
    if value is None or isinstance(value, bool | int | float | str):
        return value
    if isinstance(value, list | tuple):
        return [_default(v) for v in value]
    return repr(value)


def _declared_default(action: argparse.Action) -> object:
    """A flag declared by a config class (`vriksha.options`) has no parser default: its help says it."""
    text = action.help or ""
    if "(default: " not in text:
        return None
    return text.rsplit("(default: ", 1)[1].split(")")[0]


def shown(value: object) -> object:
    """A default as a config class's help shows it."""
    return None if value is None else "on" if value is True else "off" if value is False else str(value)


def flag_table(parser: argparse.ArgumentParser | None = None, prefix: str = "vriksha") -> dict[str, dict]:
    """{command: {flag: default}} for `parser` and every subcommand under it."""
    parser = parser or build_parser()
    table: dict[str, dict] = {}
    flags: dict[str, object] = {}
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                table.update(flag_table(sub, f"{prefix} {name}"))
        elif action.option_strings and not isinstance(action, argparse._HelpAction):
            for flag in action.option_strings:
                if action.default is argparse.SUPPRESS:
                    flags[flag] = {"declared": _declared_default(action)}
                else:
                    flags[flag] = _default(action.default)
    table[prefix] = dict(sorted(flags.items()))
    return dict(sorted(table.items()))


if __name__ == "__main__":
    json.dump(flag_table(), sys.stdout, indent=1)
    sys.stdout.write("\n")
