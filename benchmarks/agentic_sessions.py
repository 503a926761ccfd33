"""Agentic rollouts over a KV pool too small for them: the prefix cache's hit rate, recomputed tokens and
trajectories per minute with LRU only, with sessions, with sessions and the second KV tier, and with a pool
large enough for everything, side by side in one process.

Each trajectory shares a system prompt, adds its own task, then runs `--turns` turns: the model writes
`--gen-tokens` tokens (greedy), a tool answers after `--tool-ms` (uniform between its two bounds) with
`--tool-tokens` tokens, and the next turn generates over the whole history. `--trajectories` run at once
through the async engine (as a server or the trainer drives it). The pool is sized to `--pool-fraction` of the
trajectories' K/V at their end (the working set); the tier, when on, holds the whole working set. With sessions
each trajectory is a session, closed at its end.

    python benchmarks/agentic_sessions.py                            # embedded model, pool = half the set
    python benchmarks/agentic_sessions.py --pool-fraction 0.25       # working set 4x the pool
    python benchmarks/agentic_sessions.py --tiny                     # a tiny random Llama (seconds)

Hit rate: prompt tokens served from the cache (pool or tier) / prompt tokens, over every turn.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import time
from dataclasses import asdict, dataclass

MODES = ("lru", "sessions", "sessions+tier", "unbounded")


@dataclass(slots=True)
class Workload:
    trajectories: int = 32
    turns: int = 4
    system_tokens: int = 64
    task_tokens: int = 48
    gen_tokens: int = 16
    tool_tokens: int = 32
    tool_ms: tuple[float, float] = (30.0, 300.0)
    seed: int = 0

    @property
    def tokens_per_trajectory(self) -> int:
        return self.system_tokens + self.task_tokens + self.turns * (self.gen_tokens + self.tool_tokens)


@dataclass(slots=True)
class Result:
    mode: str
    pool_tokens: int
    tier_tokens: int
    prompt_tokens: int
    cached_tokens: int
    recomputed_tokens: int
    hit_rate: float
    tier_loaded_tokens: int
    seconds: float
    trajectories_per_minute: float
    final_tokens_digest: int  # a digest of every trajectory's tokens: equal across modes when outputs are


def build_engine(tiny: bool, pool_tokens: int, tier_tokens: int, tier_dtype: str, pin_fraction: float):
    from vriksha.engine.config import EngineConfig
    from vriksha.engine.core.llm_engine import LLMEngine

    options = dict(
        kv_cache_tokens=pool_tokens,
        kv_tier_tokens=tier_tokens,
        kv_tier_dtype=tier_dtype,
        session_pin_fraction=pin_fraction,
        max_model_len=2048,
        max_num_seqs=64,
    )
    if not tiny:
        return LLMEngine(EngineConfig.from_flat(**options))
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from vriksha.loading import load_tokenizer, resolve_model_path

    tokenizer = load_tokenizer(resolve_model_path(None))
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=2048,
    )
    torch.manual_seed(0)
    model = LlamaForCausalLM(config).eval()
    return LLMEngine.from_module(model, tokenizer, EngineConfig.from_flat(**options))


async def run_mode(mode: str, work: Workload, pool_tokens: int, tier_tokens: int, args) -> Result:
    from vriksha import SamplingParams
    from vriksha.engine.core.async_engine import AsyncEngine

    use_sessions = mode in ("sessions", "sessions+tier")
    tier = tier_tokens if mode == "sessions+tier" else 0
    engine = AsyncEngine(build_engine(args.tiny, pool_tokens, tier, args.tier_dtype, args.pin_fraction))
    await engine.start()
    vocab = engine.engine.vocab_size
    rng = random.Random(work.seed)

    def draw(n: int) -> list[int]:
        return [rng.randrange(200, vocab - 200) for _ in range(n)]

    system = draw(work.system_tokens)
    tasks = [draw(work.task_tokens) for _ in range(work.trajectories)]
    tools = [[draw(work.tool_tokens) for _ in range(work.turns)] for _ in range(work.trajectories)]
    waits = [[rng.uniform(*work.tool_ms) / 1000 for _ in range(work.turns)] for _ in range(work.trajectories)]
    params = SamplingParams(temperature=0, max_tokens=work.gen_tokens, ignore_eos=True)
    finals: list[list[int]] = [[] for _ in range(work.trajectories)]

    async def trajectory(i: int) -> None:
        history = system + tasks[i]
        session = f"traj-{i}" if use_sessions else None
        for t in range(work.turns):
            last = None
            async for out in engine.generate({"prompt_token_ids": history}, params, session_id=session):
                last = out
            assert last is not None and last.finished
            await asyncio.sleep(waits[i][t])
            history = history + last.outputs[0].token_ids + tools[i][t]
        finals[i] = history
        if session is not None:
            await engine.close_session(session)

    before = engine.stats()
    start = time.perf_counter()
    await asyncio.gather(*(trajectory(i) for i in range(work.trajectories)))
    seconds = time.perf_counter() - start
    after = engine.stats()
    await engine.shutdown()
    engine.engine.close()
    prompt = after.prompt_tokens - before.prompt_tokens
    cached = after.cached_prompt_tokens - before.cached_prompt_tokens
    return Result(
        mode=mode,
        pool_tokens=pool_tokens,
        tier_tokens=tier,
        prompt_tokens=prompt,
        cached_tokens=cached,
        recomputed_tokens=prompt - cached,
        hit_rate=cached / max(1, prompt),
        tier_loaded_tokens=after.kv_tier_loaded_tokens - before.kv_tier_loaded_tokens,
        seconds=seconds,
        trajectories_per_minute=work.trajectories / seconds * 60,
        final_tokens_digest=hash(tuple(tuple(f) for f in finals)) & 0xFFFFFFFF,
    )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--trajectories", type=int, default=32, help="trajectories in flight (16-64)")
    parser.add_argument("--turns", type=int, default=4, help="model turns per trajectory")
    parser.add_argument("--gen-tokens", type=int, default=16, help="tokens the model writes per turn")
    parser.add_argument("--tool-tokens", type=int, default=32, help="tokens a tool result adds")
    parser.add_argument(
        "--tool-ms", type=float, nargs=2, default=(30.0, 300.0), help="tool latency bounds (ms)"
    )
    parser.add_argument("--pool-fraction", type=float, default=0.5, help="pool / working set")
    parser.add_argument("--pin-fraction", type=float, default=0.5, help="--session-pin-fraction")
    parser.add_argument("--tier-dtype", default="int8", choices=("int8", "float32"), help="--kv-tier-dtype")
    parser.add_argument("--modes", nargs="+", default=list(MODES), choices=MODES, help="which to run")
    parser.add_argument(
        "--tiny", action="store_true", help="a tiny random Llama instead of the embedded model"
    )
    parser.add_argument("--seed", type=int, default=0, help="workload seed")
    parser.add_argument("--json", action="store_true", help="print one JSON line per mode")
    args = parser.parse_args()
    work = Workload(
        trajectories=args.trajectories,
        turns=args.turns,
        gen_tokens=args.gen_tokens,
        tool_tokens=args.tool_tokens,
        tool_ms=tuple(args.tool_ms),
        seed=args.seed,
    )
    working_set = work.trajectories * work.tokens_per_trajectory
    pool = int(working_set * args.pool_fraction)
    print(
        f"{work.trajectories} trajectories x {work.turns} turns, working set {working_set} tokens, "
        f"pool {pool} ({args.pool_fraction:.2f}), tier {working_set} ({args.tier_dtype})"
    )
    for mode in args.modes:
        pool_tokens = 4 * working_set if mode == "unbounded" else pool
        r = asyncio.run(run_mode(mode, work, pool_tokens, working_set, args))
        if args.json:
            print(json.dumps(asdict(r)))
        else:
            print(
                f"{r.mode:14s} hit {r.hit_rate:6.1%}  recomputed {r.recomputed_tokens:6d} of {r.prompt_tokens:6d}"
                f"  tier loads {r.tier_loaded_tokens:6d}  {r.trajectories_per_minute:7.1f} traj/min"
                f"  ({r.seconds:.1f} s)  digest {r.final_tokens_digest:08x}"
            )


if __name__ == "__main__":
    main()
