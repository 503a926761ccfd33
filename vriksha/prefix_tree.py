"""Pure helpers of the token prefix trees: the engine's radix cache (`engine/radix_cache.py`, nodes holding
KV slots) and the token tree that mirrors it from KV events (`kv_events/token_tree.py`, nodes without KV).

A leaf module (it imports nothing of vriksha), so the engine and the router's side share it without either
importing the other. A node is anything with `children: dict[int, node]` keyed by its first token.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol, TypeVar


class PrefixNode(Protocol):
    children: dict[int, Any]


N = TypeVar("N", bound=PrefixNode)


def common_length(key: list[int], tokens: Sequence[int], start: int) -> int:
    """How many leading tokens of `key` equal `tokens[start:]` (the caller has matched the first one)."""
    n = min(len(key), len(tokens) - start)
    run = tokens[start : start + n]
    if key[:n] == (run if isinstance(run, list) else list(run)):
        return n
    i = 0
    while key[i] == tokens[start + i]:
        i += 1
    return i


def subtree(top: N) -> list[N]:
    """`top` and every node below it (depth first)."""
    out, stack = [], [top]
    while stack:
        node = stack.pop()
        out.append(node)
        stack.extend(node.children.values())
    return out
