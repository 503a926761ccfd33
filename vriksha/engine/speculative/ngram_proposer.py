"""Prompt lookup: draft tokens for speculative decoding from the sequence itself, with no draft model.

The sequence (prompt and output so far) ends in some n-gram; where that n-gram occurred earlier in the same
sequence, the tokens that followed it there are the proposal. The longest n in [min_n, max_n] that occurs
earlier wins, and among its occurrences the most recent one (an output that repeats itself, or copies a
part of the prompt, continues as it did last time).
"""

from __future__ import annotations

import numpy as np


class NgramProposer:
    def __init__(self, min_n: int, max_n: int) -> None:
        if not 1 <= min_n <= max_n:
            raise ValueError(f"need 1 <= min_n <= max_n, got min_n={min_n}, max_n={max_n}")
        self.min_n = min_n
        self.max_n = max_n

    def propose(self, token_ids: list[int], k: int) -> list[int]:
        """Up to `k` tokens that followed the latest earlier occurrence of the longest matching suffix n-gram
        (fewer where the sequence ends sooner after it); [] when no n-gram of at least `min_n` recurs."""
        length = len(token_ids)
        if k <= 0 or length <= self.min_n:
            return []
        tokens = np.asarray(token_ids, dtype=np.int64)
        # ends[i]: end index e (< length - 1) of an earlier run equal to the last n tokens, n growing
        ends = np.flatnonzero(tokens[: length - 1] == tokens[-1])
        best: np.ndarray | None = None
        n = 1
        while ends.size:
            if n >= self.min_n:
                best = ends
            if n == self.max_n or n == length - 1:
                break
            ends = ends[ends >= n]
            ends = ends[tokens[ends - n] == tokens[length - 1 - n]]
            n += 1
        if best is None:
            return []
        start = int(best[-1]) + 1
        return tokens[start : start + k].tolist()
