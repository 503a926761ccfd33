"""Config dataclasses that declare their own command-line flags: each option written once, with its help.

A component's options are one dataclass (`slots=True`) deriving from `Options`, whose fields are declared with
`option(default, help)`; a field declared with `section(OtherOptions, help)` holds a nested section, another
such dataclass (the engine's `platform` section). From the class:

- `add_arguments(parser)`: one flag per option of the class and of its sections, named after the option
  (`--max-num-seqs`, or `flag=`), booleans as `--x / --no-x`; only the flags given reach `given_args`.
- `given_args(args)`: the options given on the command line, by option name (a section's options by their own
  names: names are unique across a class and its sections).
- `from_args(args, **defaults)`, `from_flat(**options)`: a config from options by name, sections included.
- `from_dict(data)`: a config file's mapping; a section is a nested mapping under its field's name, or its
  options sit flat beside the others (as before the section existed); unknown keys and wrong types are named.
- `to_dict(changed_only=False)`: plain data, sections nested.

A subclass sets `options_label` (the word error messages use: "engine option ...") and `flag_dest_prefix`
(where its flags land in the parsed namespace, apart from a command's own options).
"""

from __future__ import annotations

import argparse
import dataclasses
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import field
from pathlib import Path
from typing import Any, ClassVar, TypeVar

from vriksha.errors import ConfigError

_TYPES = {"int": int, "float": float, "str": str, "bool": bool, "Path": Path}

OptionsT = TypeVar("OptionsT", bound="Options")


def option(
    default: Any, help: str, *, flag: str | None = None, choices: tuple[str, ...] | None = None
) -> Any:
    """A config field with its command-line help; `flag` overrides the flag's name (`--<flag>`)."""
    return field(default=default, metadata={"help": help, "flag": flag, "choices": choices})


def section(cls: type[Options], help: str) -> Any:
    """A nested section of options (another `Options` dataclass), defaulting to its own defaults."""
    return field(default_factory=cls, metadata={"help": help, "section": cls})


def _is_section(f: dataclasses.Field) -> bool:
    return "section" in f.metadata


def _kind(f: dataclasses.Field) -> type:
    names = [t.strip() for t in str(f.type).split("|") if t.strip() != "None"]
    return _TYPES[names[0]]


def _flag(f: dataclasses.Field) -> str:
    return f.metadata["flag"] or f.name.replace("_", "-")


def _shown(value: Any) -> str:
    return "on" if value is True else "off" if value is False else str(value)


class Options:
    """The base of config dataclasses built from `option()` and `section()` fields (see the module)."""

    __slots__ = ()
    options_label: ClassVar[str] = "config"
    flag_dest_prefix: ClassVar[str] = ""

    # ---- the declared options ----------------------------------------------------------------------
    @classmethod
    def sections(cls) -> dict[str, type[Options]]:
        """Each section's field name and class."""
        return {f.name: f.metadata["section"] for f in dataclasses.fields(cls) if _is_section(f)}

    @classmethod
    def option_fields(cls) -> Iterator[tuple[str | None, dataclasses.Field]]:
        """(section name or None, field) of every option of the class and of its sections."""
        for f in dataclasses.fields(cls):
            if _is_section(f):
                for sub in dataclasses.fields(f.metadata["section"]):
                    yield f.name, sub
            else:
                yield None, f

    @classmethod
    def option_names(cls) -> list[str]:
        return [f.name for _, f in cls.option_fields()]

    @classmethod
    def option_path(cls, name: str) -> str:
        """Where option `name` sits in a config file's mapping: `name`, or `section.name`."""
        for where, f in cls.option_fields():
            if f.name == name:
                return f"{where}.{name}" if where else name
        raise ConfigError(f"unknown {cls.options_label} option {name}")

    # ---- command line ------------------------------------------------------------------------------
    @classmethod
    def add_arguments(
        cls, parser: argparse.ArgumentParser, exclude: Iterable[str] = (), title: str | None = None
    ) -> None:
        """One flag per option (booleans as --x / --no-x); only flags given reach `given_args`. The options
        of a section go to a group of their own, titled by the section's help."""
        skip = set(exclude)
        groups: dict[str | None, Any] = {}
        for where, f in cls.option_fields():
            if f.name in skip:
                continue
            if where not in groups:
                head = title or cls.options_label
                groups[where] = parser.add_argument_group(
                    head if where is None else f"{head}: {cls._section_help(where)}"
                )
            groups[where].add_argument(f"--{_flag(f)}", **cls._argument(f))

    @classmethod
    def _section_help(cls, name: str) -> str:
        return next(f.metadata["help"] for f in dataclasses.fields(cls) if f.name == name)

    @classmethod
    def _argument(cls, f: dataclasses.Field) -> dict[str, Any]:
        kind = _kind(f)
        help_text = f.metadata["help"]
        if f.default is not None and "(default" not in help_text:
            help_text += f" (default: {_shown(f.default)})"
        kwargs: dict[str, Any] = {
            "dest": cls._dest(f.name),
            "default": argparse.SUPPRESS,
            "help": help_text.replace("%", "%%"),
        }
        if kind is bool:
            kwargs["action"] = argparse.BooleanOptionalAction
        else:
            kwargs["type"] = kind
            kwargs["metavar"] = f.name.upper() if f.metadata["choices"] is None else None
            if f.metadata["choices"] is not None:
                kwargs["choices"] = f.metadata["choices"]
        return kwargs

    @classmethod
    def _dest(cls, name: str) -> str:
        return f"{cls.flag_dest_prefix}{name}"

    @classmethod
    def given_args(cls, args: argparse.Namespace) -> dict[str, Any]:
        """The options given on the command line, by option name."""
        return {n: getattr(args, cls._dest(n)) for n in cls.option_names() if hasattr(args, cls._dest(n))}

    @classmethod
    def from_args(cls: type[OptionsT], args: argparse.Namespace, **defaults: Any) -> OptionsT:
        """The config from parsed flags; `defaults` (options by name) apply where a flag was not given."""
        return cls.from_flat(**{**defaults, **cls.given_args(args)})

    # ---- construction from data --------------------------------------------------------------------
    @classmethod
    def from_flat(cls: type[OptionsT], **options: Any) -> OptionsT:
        """The config from options by name, a section's among them (or a section given whole, by its field)."""
        return cls(**cls._gather(options, check=False))

    def replace(self: OptionsT, **options: Any) -> OptionsT:
        """A copy with `options` (by name, as `from_flat` takes them) changed; the rest as they are."""
        sections = type(self).sections()
        owner = {f.name: where for where, f in type(self).option_fields() if where is not None}
        top: dict[str, Any] = {}
        per_section: dict[str, dict[str, Any]] = {}
        for key, value in options.items():
            if key in owner:
                per_section.setdefault(owner[key], {})[key] = value
            else:
                top[key] = value
        for where, values in per_section.items():
            base = top.get(where, getattr(self, where))
            top[where] = dataclasses.replace(
                base if isinstance(base, sections[where]) else sections[where](**base), **values
            )
        return dataclasses.replace(self, **top)

    @classmethod
    def from_dict(cls: type[OptionsT], data: Mapping[str, Any] | None) -> OptionsT:
        """The config from a mapping (a config file's section); unknown keys and wrong types are named."""
        return cls(**cls._gather(dict(data or {}), check=True))

    @classmethod
    def _gather(cls, data: dict[str, Any], check: bool) -> dict[str, Any]:
        """Constructor arguments from options by name: a section's options (flat, or nested under the
        section's name) become that section's object. `check`: names and types are checked (data read
        from a file)."""
        known = {f.name: f for f in dataclasses.fields(cls) if not _is_section(f)}
        sections = cls.sections()
        owner = {f.name: where for where, f in cls.option_fields() if where is not None}
        unknown = sorted(k for k in data if k not in known and k not in sections and k not in owner)
        if unknown:
            raise ConfigError(
                f"unknown {cls.options_label} option{'s' if len(unknown) > 1 else ''} {', '.join(unknown)}; "
                f"the options are {', '.join(cls.option_names())}"
            )
        out: dict[str, Any] = {}
        nested: dict[str, dict[str, Any]] = {}
        for key, value in data.items():
            if key not in sections:
                continue
            if isinstance(value, sections[key]):
                out[key] = value
            elif isinstance(value, Mapping):
                nested[key] = dict(value)
            else:
                raise ConfigError(
                    f"{cls.options_label} option {key} is a section: give a mapping of its options, got {value!r}"
                )
        for key, value in data.items():
            if key in sections:
                continue
            if key in owner:
                where = owner[key]
                if key in nested.get(where, {}) or where in out:
                    raise ConfigError(
                        f"{cls.options_label} option {key} is given twice: in the {where} section and beside it"
                    )
                nested.setdefault(where, {})[key] = value
            else:
                out[key] = cls._checked(known[key], value) if check else value
        for where, values in nested.items():
            sub = sections[where]
            out[where] = sub.from_dict(values) if check else sub(**values)
        return out

    @classmethod
    def _checked(cls, f: dataclasses.Field, value: Any) -> Any:
        kind = _kind(f)
        if value is None and f.default is None:
            return value
        if kind is float and isinstance(value, int) and not isinstance(value, bool):
            return float(value)
        if kind is Path and isinstance(value, str):
            return Path(value)
        if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
            raise ConfigError(f"{cls.options_label} option {f.name} must be a {kind.__name__}, got {value!r}")
        return value

    # ---- back to data ------------------------------------------------------------------------------
    def to_dict(self, changed_only: bool = False) -> dict[str, Any]:
        """The options as plain data, sections nested; `changed_only`: those that differ from the defaults
        (a section with no change left out)."""
        out: dict[str, Any] = {}
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if _is_section(f):
                sub = value.to_dict(changed_only)
                if sub or not changed_only:
                    out[f.name] = sub
            elif not changed_only or value != f.default:
                out[f.name] = value
        return out

    def to_args(self, changed_only: bool = True, exclude: Iterable[str] = ()) -> list[str]:
        """The command-line flags that give these options (`changed_only`: those differing from the defaults),
        sections included: what `from_args` reads back."""
        skip = set(exclude)
        flags: list[str] = []
        for where, f in type(self).option_fields():
            value = getattr(getattr(self, where) if where else self, f.name)
            if f.name in skip or (changed_only and value == f.default):
                continue
            if isinstance(value, bool):
                flags.append(f"--{_flag(f)}" if value else f"--no-{_flag(f)}")
            elif value is not None:
                flags += [f"--{_flag(f)}", str(value)]
        return flags
