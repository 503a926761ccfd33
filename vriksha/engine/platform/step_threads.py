"""How many threads an engine step runs on: small steps leave a core to a front end in the same process.

A step's parallel regions wait at their barriers for every thread of the OpenMP team. When the team holds
every core, each wake-up of the server's event loop (one per streamed token) or of a client on the same
machine preempts a team thread, and the whole step waits for it: on the 2-core Zen 4 EPYC a one-stream decode
step took 15.4 ms inside the server against about 5 ms with one thread fewer. Large steps (prompt chunks,
big batches) are bound by arithmetic and gain more from the last core than the preemptions cost them, so
they keep every thread. `front_end_core` (an engine option, its choices checked by `EngineConfig`): `on`
runs steps of at most SMALL_STEP_TOKENS tokens on one thread fewer; `auto` does so where a front end shares
the process (the async engine a server drives) on the CPU; `off` never.
"""

from __future__ import annotations

import torch

SMALL_STEP_TOKENS = 16  # a step of at most this many tokens (decode rows, prompt tokens, drafts) is small


class StepThreads:
    def __init__(self, mode: str, host: bool) -> None:
        """`host`: the engine computes on this machine's CPU threads (not an accelerator, not tensor-parallel
        ranks, which set their own threads)."""
        self.mode = mode
        self.host = host
        self.front_end = False  # set by the async engine: a server's event loop shares the process
        self.full: int | None = None  # the stepping thread's own thread count, read at its first step

    @property
    def enabled(self) -> bool:
        return self.host and (self.mode == "on" or (self.mode == "auto" and self.front_end))

    def apply(self, tokens: int) -> None:
        """Set the stepping thread's team for a step of `tokens` tokens."""
        if not self.enabled:
            return
        if self.full is None:
            self.full = torch.get_num_threads()
        want = self.full if tokens > SMALL_STEP_TOKENS else max(1, self.full - 1)
        if torch.get_num_threads() != want:
            torch.set_num_threads(want)

    def describe(self) -> str:
        if not self.enabled:
            return f"every step on all engine threads (front_end_core {self.mode})"
        full = self.full if self.full is not None else torch.get_num_threads()
        return (
            f"steps of at most {SMALL_STEP_TOKENS} tokens on {max(1, full - 1)} thread(s), larger ones on {full}"
            f" (front_end_core {self.mode})"
        )
