"""A code-editing workload whose outputs copy the prompt (where n-gram speculation pays off).

Each prompt shows one small synthetic Python function before and after a rename, then a second function and
the header of its renamed version: the model writes the second function out again, identifier renamed, so
most of its output copies the prompt. Prompts are raw text (no chat template), tokenised with the model's
tokenizer; each request asks for as many new tokens as the second function has.
"""

from __future__ import annotations

import random

_NOUNS = ["price", "count", "total", "width", "height", "score", "index", "offset", "weight", "amount"]
_VERBS = ["compute", "update", "merge", "scale", "check", "collect", "render", "parse", "filter", "load"]


def _function(rng: random.Random) -> tuple[str, str, str]:
    """(source, an identifier in it, its new name)."""
    verb, a, b, c = rng.choice(_VERBS), *rng.sample(_NOUNS, 3)
    old, new = f"{a}_{b}", f"new_{a}"
    lines = [f"def {verb}_{c}(items, {old}):", "    result = []"]
    for i in range(rng.randint(3, 6)):
        op = rng.choice(["+", "-", "*"])
        lines += [
            f"    for item in items[{i}:]:",
            f"        if item.{c} > {old}:",
            f"            result.append(item.{c} {op} {old} * {i + 1})",
        ]
    lines += [f"    {old} = len(result) + {old}", f"    return result, {old}"]
    return "\n".join(lines) + "\n", old, new


def code_edit_prompts(tokenizer, n: int, seed: int = 0) -> tuple[list[list[int]], list[int]]:
    """n prompts (token ids) and the new tokens each asks for."""
    rng = random.Random(seed)
    prompts, new_tokens = [], []
    for _ in range(n):
        first, old1, new1 = _function(rng)
        second, old2, new2 = _function(rng)
        text = (
            f"# Before:\n{first}\n# After renaming {old1} to {new1}:\n{first.replace(old1, new1)}\n"
            f"# Before:\n{second}\n# After renaming {old2} to {new2}:\n"
        )
        prompts.append(tokenizer.encode(text, add_special_tokens=False))
        new_tokens.append(len(tokenizer.encode(second.replace(old2, new2), add_special_tokens=False)))
    return prompts, new_tokens
