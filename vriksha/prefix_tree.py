"""Pure helpers of the token prefix trees: the engine's radix cache (`engine/core/radix_cache.py`, nodes holding
KV slots) and the token tree that mirrors it from KV events (`kv_events/token_tree.py`, nodes without KV).

A leaf module (it imports nothing of vriksha), so the engine and the router's side share it without either
importing the other. A node is anything with a `key` (its run of tokens), `children` (a dict keyed by each
child's first token) and a `last_access` stamp.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Protocol, TypeVar


class PrefixNode(Protocol):
    key: list[int]
    children: dict[int, Any]
    last_access: int


N = TypeVar("N", bound=PrefixNode)


def common_prefix_len(a: Sequence[int], b: Sequence[int], start: int = 0) -> int:
    """How many leading items of `a` equal `b[start:]`'s, by slice comparisons (C speed) in a binary search
    rather than a Python loop per token."""
    n = min(len(a), len(b) - start)
    if n <= 0 or a[0] != b[start]:
        return 0
    if not isinstance(a, list):
        a = list(a)
    run = b[start : start + n]
    if a[:n] == (run if isinstance(run, list) else list(run)):
        return n
    lo, hi = 1, n - 1  # a[:lo] matches; a[:hi + 1] does not
    while lo < hi:
        mid = (lo + hi + 1) // 2
        part = b[start + lo : start + mid]
        if a[lo:mid] == (part if isinstance(part, list) else list(part)):
            lo = mid
        else:
            hi = mid - 1
    return lo


def common_length(key: list[int], tokens: Sequence[int], start: int) -> int:
    """How many leading tokens of `key` equal `tokens[start:]` (the caller has matched the first one)."""
    return common_prefix_len(key, tokens, start)


def walk(
    root: N,
    tokens: Sequence[int],
    now: int,
    split: Callable[[N, int], N] | None,
    entered: list[N] | None = None,
) -> tuple[N, int]:
    """Follow `tokens` down from `root`, stamping `last_access = now` on each node entered: the deepest node
    whose path is a prefix of `tokens`, and how many tokens it covers. Where the match ends inside a node,
    `split(node, n)` cuts it after n tokens so that the returned node ends exactly there; with no `split`,
    the walk stops above that node, the tokens matched into it counted. `entered` gets each node entered."""
    node, pos = root, 0
    while pos < len(tokens):
        child = node.children.get(tokens[pos])
        if child is None:
            break
        n = common_length(child.key, tokens, pos)
        if n < len(child.key):
            if split is None:
                return node, pos + n
            child = split(child, n)
        child.last_access = now
        if entered is not None:
            entered.append(child)
        node, pos = child, pos + n
    return node, pos


def subtree(top: N) -> list[N]:
    """`top` and every node below it (depth first)."""
    out, stack = [], [top]
    while stack:
        node = stack.pop()
        out.append(node)
        stack.extend(node.children.values())
    return out
