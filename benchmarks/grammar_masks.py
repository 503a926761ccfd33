"""Where a constrained step's grammar time goes, without the model: llguidance filling the batch's masks, then
the masks applied to [batch, vocab] fp32 logits by the native kernel and by the numpy unpacking it replaced.

Sequences walk the benchmark's JSON schema (`structured_outputs.py`) on random logits under their masks and
start again when done; per-part medians over the steps are printed, in ms.

    python benchmarks/grammar_masks.py                       # batch 16, 300 steps
    python benchmarks/grammar_masks.py --batch 1 --steps 20  # a smoke run
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch

from vriksha.engine.core.grammar import GrammarEngine
from vriksha.engine.core.logits_processing import apply_bitmask, apply_bitmask_unpacked
from vriksha.engine.core.structured_outputs import StructuredOutputsParams
from vriksha.engine.platform.native.bitmask import bitmask_kernel
from vriksha.loading import load_tokenizer, resolve_model_path

try:
    from structured_outputs import SCHEMA  # run from benchmarks/ or with it on the path
except ImportError:
    from benchmarks.structured_outputs import SCHEMA


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default=None, help="HF directory or .gguf whose tokenizer is used")
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--steps", type=int, default=300)
    args = ap.parse_args()
    tokenizer = load_tokenizer(resolve_model_path(args.model))
    vocab = len(tokenizer)
    engine = GrammarEngine(tokenizer, vocab, frozenset({tokenizer.eos_token_id}))
    spec = StructuredOutputsParams(json=SCHEMA)
    matchers = [engine.matcher(spec) for _ in range(args.batch)]
    rows = list(range(args.batch))
    kernel = bitmask_kernel()
    gen = torch.Generator().manual_seed(0)
    parts: dict[str, list[float]] = {"fill": [], "apply_native": [], "apply_numpy": [], "consume": []}
    for _ in range(args.steps):
        logits = torch.randn(args.batch, vocab, generator=gen)
        t0 = time.perf_counter()
        masks = engine.masks(matchers)
        t1 = time.perf_counter()
        reference, native = logits.clone(), logits.clone()  # both warm in the cache alike
        t2 = time.perf_counter()
        apply_bitmask_unpacked(reference, rows, masks)
        t3 = time.perf_counter()
        apply_bitmask(native, rows, masks, kernel=kernel)
        t4 = time.perf_counter()
        assert torch.equal(native, reference)
        ids = native.argmax(dim=-1).tolist()
        t5 = time.perf_counter()
        for m, token in zip(matchers, ids, strict=True):
            m.advance(token)
        t6 = time.perf_counter()
        for k, v in zip(parts, (t1 - t0, t3 - t2, t4 - t3, t6 - t5), strict=True):
            parts[k].append(v)
        matchers = [m if not (m.done or m.error) else engine.matcher(spec) for m in matchers]
    out = {k: round(1000 * statistics.median(v), 3) for k, v in parts.items()}
    print(json.dumps({"batch": args.batch, "steps": args.steps, "threads": torch.get_num_threads(), **out}))


if __name__ == "__main__":
    main()
