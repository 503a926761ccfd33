"""Command-line flags built from a config dataclass: one declaration per option (type, default, help)."""

from __future__ import annotations

import argparse
import dataclasses
import types
import typing
from typing import Any, TypeVar

T = TypeVar("T")


def flag_name(field_name: str) -> str:
    """`header_timeout_s` -> `--header-timeout`: seconds are said in the help, not in the flag."""
    name = field_name[:-2] if field_name.endswith("_s") else field_name
    return "--" + name.replace("_", "-")


def _scalar(tp: Any) -> tuple[type, bool]:
    """(the scalar type, whether None is allowed) of an annotation such as `int | None`."""
    if typing.get_origin(tp) in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        if len(args) != 1:
            raise TypeError(f"a flag needs one scalar type, got {tp}")
        return args[0], True
    return tp, False


def add_flags(parser: argparse.ArgumentParser | Any, cls: type, title: str | None = None) -> None:
    """Add a `--flag` per field of the dataclass `cls` (to a new argument group when `title` is given)."""
    target = parser.add_argument_group(title) if title else parser
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        help_text = f.metadata.get("help")
        if help_text is None:
            continue
        tp, _ = _scalar(hints[f.name])
        default = f.default if f.default is not dataclasses.MISSING else f.default_factory()  # type: ignore[misc]
        shown = "none" if default is None else default
        if tp is bool:
            target.add_argument(
                flag_name(f.name),
                dest=f.name,
                action=argparse.BooleanOptionalAction,
                default=default,
                help=f"{help_text} (default: {shown})",
            )
            continue
        target.add_argument(
            flag_name(f.name),
            dest=f.name,
            type=tp,
            default=default,
            metavar=f.metadata.get("metavar"),
            help=f"{help_text} (default: {shown})",
        )


def from_args(cls: type[T], args: argparse.Namespace) -> T:
    """The dataclass `cls` with every field that has a flag taken from `args` (the others at defaults)."""
    kw = {
        f.name: getattr(args, f.name)
        for f in dataclasses.fields(cls)  # type: ignore[arg-type]
        if f.metadata.get("help") is not None and hasattr(args, f.name)
    }
    return cls(**kw)
