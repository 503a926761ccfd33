"""The GRPO update's completion log-probs with and without length sub-batches, side by side, one process.

One micro-batch of the embedded model shaped like the demo's: 3 groups x 8 completions, one completion at
the 32-token limit and the rest 9 long. Each round runs the forward and backward once in one piece (every row
padded to the longest) and once split by length (`grpo.logprob_split_overhead_tokens`, default 64), in
alternating order; prints both times (rounds' medians), their ratio, and the largest log-prob difference.

    python benchmarks/update_padding.py
    python benchmarks/update_padding.py --long 64 --short 12 --rounds 5
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--long", type=int, default=32, help="tokens of the one long completion")
    parser.add_argument("--short", type=int, default=9, help="tokens of every other completion")
    parser.add_argument("--prompt", type=int, default=40, help="prompt tokens")
    parser.add_argument("--rounds", type=int, default=2, help="A/B rounds")
    args = parser.parse_args()

    from vriksha.engine.platform.cpu_features import cpu_features
    from vriksha.loading import load_model
    from vriksha.train.batch import GroupBatch
    from vriksha.train.config import SUB_BATCH_OVERHEAD_TOKENS
    from vriksha.train.logprobs import completion_logprobs

    torch.manual_seed(0)
    model = load_model(None, dtype=torch.float32).model.train()
    groups, size = 3, 8
    n = groups * size
    lengths = [args.long] + [args.short] * (n - 1)
    prompt_ids = torch.randint(100, 1000, (groups, args.prompt))
    completion_ids = torch.randint(100, 1000, (n, args.long))
    mask = (torch.arange(args.long)[None] < torch.tensor(lengths)[:, None]).long()
    batch = GroupBatch(
        prompt_ids,
        torch.ones_like(prompt_ids),
        completion_ids,
        mask,
        mask.float(),
        torch.zeros(n, args.long),
        torch.ones(n),
        size,
    )
    overheads = {"one piece": 10**9, "by length": SUB_BATCH_OVERHEAD_TOKENS}
    times: dict[str, list[float]] = {name: [] for name in overheads}
    logprobs: dict[str, torch.Tensor] = {}
    for r in range(args.rounds):
        for name in overheads if r % 2 == 0 else reversed(overheads):
            model.zero_grad()
            start = time.perf_counter()
            out = completion_logprobs(model, batch, overhead_tokens=overheads[name])
            (out.logprobs * batch.loss_mask).sum().backward()
            times[name].append(time.perf_counter() - start)
            logprobs[name] = out.logprobs.detach()
    diff = float(((logprobs["one piece"] - logprobs["by length"]) * batch.loss_mask).abs().max())
    one, split = (statistics.median(times[name]) for name in overheads)
    print(f"cpu: {cpu_features().summary()}, {torch.get_num_threads()} threads")
    print(
        f"micro-batch: {n} completions, one of {args.long} tokens, the rest {args.short}; prompts {args.prompt}"
    )
    print(f"forward + backward, one piece: {one:.2f} s; by length: {split:.2f} s ({one / split:.2f}x)")
    print(f"largest log-prob difference on real tokens: {diff:.2e}")


if __name__ == "__main__":
    main()
