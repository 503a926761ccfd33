"""Reading a YAML config safely: PyYAML's safe loader without aliases."""

from __future__ import annotations

from typing import Any

import yaml

from vriksha.errors import ConfigError

__all__ = ["load_yaml"]


def _key_of(index: Any) -> str | None:
    """The mapping key (or sequence position) a node is composed under; None for the document."""
    if isinstance(index, yaml.ScalarNode):
        return str(index.value)
    return str(index) if isinstance(index, int) else None


class _NoAliasLoader(yaml.SafeLoader):
    """PyYAML's safe loader, refusing aliases (`*name`, and so `<<: *name` merges) where they appear.

    An alias shares a node, so nine nested lists of ten aliases ("billion laughs") load in a moment
    but are a billion values to anything that walks them (the deep copy of `--set`, validation).
    The error names the key under which the alias stands."""

    def __init__(self, stream: str, keys: list[str]) -> None:
        super().__init__(stream)
        self._keys = list(keys)

    def compose_node(self, parent: Any, index: Any) -> Any:
        key = _key_of(index)
        if self.check_event(yaml.AliasEvent):
            event = self.peek_event()
            where = ".".join([*self._keys, key] if key is not None else self._keys) or "the top level"
            mark = event.start_mark
            raise ConfigError(
                f"{where}: the YAML alias *{event.anchor} (line {mark.line + 1}, column {mark.column + 1}) is "
                "not allowed in a training config (aliases can expand a small file into billions of values); "
                "write the value out"
            )
        if key is not None:
            self._keys.append(key)
        try:
            return super().compose_node(parent, index)
        finally:
            if key is not None:
                self._keys.pop()


def load_yaml(text: str, under: list[str] | None = None) -> Any:
    """The YAML document in `text`, without aliases (`ConfigError` naming the key where one stands;
    `under`: the keys the document sits under, for a `--set` value)."""
    loader = _NoAliasLoader(text, under or [])
    try:
        return loader.get_single_data()
    finally:
        loader.dispose()
