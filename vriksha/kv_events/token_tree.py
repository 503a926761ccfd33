"""A token radix tree without KV: the router's copy of a replica's prefix cache (rebuilt from KV events), the
approximate per-replica tree of the `cache_aware` policy (LRU-trimmed to a size bound), and the publisher's
view for translating removals into vLLM blocks."""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from vriksha.prefix_tree import subtree, walk


@dataclass(eq=False, slots=True)
class _Node:
    key: list[int]
    parent: _Node | None = None
    children: dict[int, _Node] = field(default_factory=dict)
    last_access: int = 0

    def __len__(self) -> int:
        return len(self.key)


class TokenTree:
    def __init__(self) -> None:
        self.root = _Node(key=[])
        self.size = 0  # tokens held
        self._clock = itertools.count(1)

    def clear(self) -> None:
        self.root = _Node(key=[])
        self.size = 0

    @classmethod
    def from_paths(cls, paths: Iterable[Sequence[int]]) -> TokenTree:
        tree = cls()
        for p in paths:
            tree.insert(p)
        return tree

    def _walk(self, tokens: Sequence[int], split: bool) -> tuple[_Node, int]:
        """The deepest node whose path is a prefix of `tokens` and how many tokens it covers; with `split`,
        a node the match ends inside is cut so that the returned node ends exactly there."""
        return walk(self.root, tokens, next(self._clock), self._split if split else None)

    def _split(self, child: _Node, n: int) -> _Node:
        parent = child.parent
        assert parent is not None
        upper = _Node(
            key=child.key[:n], parent=parent, children={child.key[n]: child}, last_access=child.last_access
        )
        parent.children[child.key[0]] = upper
        child.key = child.key[n:]
        child.parent = upper
        return upper

    def match(self, tokens: Sequence[int]) -> int:
        """How many leading tokens of `tokens` the tree holds."""
        return self._walk(tokens, split=False)[1]

    def insert(self, tokens: Sequence[int]) -> int:
        """Add the path `tokens`; returns how many leading tokens were held already."""
        node, pos = self._walk(tokens, split=True)
        if pos < len(tokens):
            leaf = _Node(key=list(tokens[pos:]), parent=node, last_access=next(self._clock))
            node.children[tokens[pos]] = leaf
            self.size += len(leaf)
        return pos

    def remove(self, tokens: Sequence[int], num_tokens: int) -> int:
        """Drop the last `num_tokens` of the path `tokens` and everything below them; returns tokens dropped."""
        start = len(tokens) - num_tokens
        if num_tokens <= 0 or start < 0:
            return 0
        node, pos = self._walk(tokens[:start], split=True)
        if pos < start:
            return 0  # not held: nothing to drop
        child = node.children.pop(tokens[start], None) if start < len(tokens) else None
        if child is None:
            return 0
        dropped = sum(len(n) for n in subtree(child))
        self.size -= dropped
        return dropped

    def paths_below(self, tokens: Sequence[int], start: int) -> list[list[int]]:
        """The leaf paths that `remove(tokens, len(tokens) - start)` would cut (those through `tokens[: start + 1]`)."""
        if not 0 <= start < len(tokens):
            return []
        node, pos = self._walk(tokens[:start], split=True)
        child = node.children.get(tokens[start]) if pos == start else None
        if child is None:
            return []
        out: list[list[int]] = []
        stack: list[tuple[_Node, list[int]]] = [(child, list(tokens[:start]))]
        while stack:
            n, pre = stack.pop()
            path = pre + n.key
            if not n.children:
                out.append(path)
            stack.extend((c, path) for c in n.children.values())
        return out

    def evict_to(self, max_tokens: int) -> None:
        """Drop least recently used leaves until at most `max_tokens` remain."""
        while self.size > max_tokens:
            leaves = [n for n in subtree(self.root)[1:] if not n.children]
            if not leaves:
                return
            for leaf in sorted(leaves, key=lambda n: n.last_access):
                if self.size <= max_tokens:
                    return
                assert leaf.parent is not None
                del leaf.parent.children[leaf.key[0]]
                self.size -= len(leaf)

    def paths(self) -> set[tuple[int, ...]]:
        """Every leaf's token path: equal sets mean equal cached token sets."""
        out: set[tuple[int, ...]] = set()
        stack: list[tuple[_Node, tuple[int, ...]]] = [(self.root, ())]
        while stack:
            node, prefix = stack.pop()
            path = prefix + tuple(node.key)
            if not node.children and node is not self.root:
                out.add(path)
            stack.extend((c, path) for c in node.children.values())
        return out
