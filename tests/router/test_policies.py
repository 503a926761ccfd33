"""The policies' choices on hand-made replica states (no processes)."""

from __future__ import annotations

import argparse

import pytest

from vriksha.errors import ConfigError
from vriksha.kv_events.token_tree import TokenTree
from vriksha.router.cli import config_from_args, register
from vriksha.router.config import ReplicaSpec, RouterConfig
from vriksha.router.policies import CacheAware, LeastLoad, Precise, RoundRobin
from vriksha.router.replica import Load, Replica
from vriksha.router.subscriber import EventSubscriber


def replicas(n: int = 2) -> list[Replica]:
    out = []
    for i in range(n):
        r = Replica(ReplicaSpec(f"http://r{i}"), i, healthy=True)
        r.events = EventSubscriber(r.url, "tcp://unused", "http://unused", http=None)  # type: ignore[arg-type]
        r.events.synced = True
        out.append(r)
    return out


def holding(r: Replica, tokens: list[int]) -> None:
    assert r.events is not None
    r.events.tree = TokenTree.from_paths([tokens])


def test_round_robin_and_least_load() -> None:
    rs = replicas(3)
    rr = RoundRobin(RouterConfig())
    assert [rr.choose([1], rs).replica.index for _ in range(4)] == [0, 1, 2, 0]
    rs[0].in_flight, rs[1].load, rs[2].in_flight = 3, Load(num_running=1, num_waiting=1), 1
    assert LeastLoad(RouterConfig()).choose([1], rs).replica.index == 2


def test_precise_follows_the_prefix_within_the_affinity_bound() -> None:
    rs = replicas()
    prompt = list(range(1000))
    holding(rs[1], prompt[:800])
    policy = Precise(RouterConfig(queue_cost_tokens=64, affinity_bound_tokens=512))
    d = policy.choose(prompt, rs)
    assert (d.replica.index, d.reason, d.cached_tokens) == (1, "prefix", 800)
    rs[1].in_flight = 5  # 200 uncached + 320 queue = 520 vs 1000: still the holder
    assert policy.choose(prompt, rs).replica.index == 1
    rs[1].in_flight = 30  # 200 + 1920 is worse than 1000 by more than 512: leave it
    d = policy.choose(prompt, rs)
    assert (d.replica.index, d.reason) == (0, "load")


def test_precise_spreads_prompts_that_share_only_a_few_leading_tokens() -> None:
    """Groups whose prompts agree on their first two tokens only (a common first word): the replica that saw
    the first group holds those two tokens of every later one, which must not make it take them all (its
    pool would then cycle through every group's prefix and keep none)."""
    rs = replicas()
    policy = Precise(RouterConfig(queue_cost_tokens=64, affinity_bound_tokens=512))
    groups = [[1, 2, *range(100 * g, 100 * g + 60)] for g in range(1, 5)]
    placed = []
    for prefix in groups:  # each group's first request, all still running
        prompt = [*prefix, 7, 8]
        d = policy.choose(prompt, rs)
        policy.routed(d, prompt)
        d.replica.in_flight += 1
        placed.append(d.replica.index)
    assert sorted(placed) == [0, 0, 1, 1], placed
    for g, prefix in enumerate(groups):  # the next request of each group finds its prefix
        d = policy.choose([*prefix, 9], rs)
        assert (d.replica.index, d.reason, d.cached_tokens) == (placed[g], "prefix", len(prefix))


def test_precise_counts_prompts_routed_but_not_yet_reported() -> None:
    rs = replicas()
    policy = Precise(RouterConfig())
    prompt = list(range(300))
    first = policy.choose(prompt, rs)
    policy.routed(first, prompt)
    again = policy.choose(prompt[:250] + [7] * 10, rs)
    assert again.replica is first.replica and again.cached_tokens == 250


def test_cache_aware_thresholds() -> None:
    rs = replicas()
    cfg = RouterConfig(cache_threshold=0.5, balance_abs_threshold=4, balance_rel_threshold=1.5)
    policy = CacheAware(cfg)
    a = list(range(100))
    d = policy.choose(a, rs)
    policy.routed(d, a)
    assert policy.choose(a[:90] + [5] * 10, rs).replica is d.replica  # 90% match
    other = policy.choose([9] * 100, rs)  # no match: the smaller tree
    assert other.replica is not d.replica and other.reason == "load"
    d.replica.in_flight = 10  # unbalanced: the least loaded, whatever it holds
    assert policy.choose(a, rs).reason == "balance"


def test_affinity_min_share_flag() -> None:
    parser = argparse.ArgumentParser()
    register(parser.add_subparsers())
    base = ["router", "--replica", "http://127.0.0.1:1"]
    assert config_from_args(parser.parse_args(base)).affinity_min_share == RouterConfig().affinity_min_share
    assert (
        config_from_args(parser.parse_args([*base, "--affinity-min-share", "0.5"])).affinity_min_share == 0.5
    )
    with pytest.raises(ConfigError, match="--affinity-min-share must be in 0..1"):
        config_from_args(parser.parse_args([*base, "--affinity-min-share", "1.5"]))


def test_queue_counts_the_routers_own_requests_exactly_and_others_from_the_poll() -> None:
    r = replicas(1)[0]
    # the last poll saw 3 running while the router had 3 open there; two of them have finished since
    r.load, r.in_flight = Load(num_running=3, router_in_flight=3), 1
    assert r.queue == 1  # not 3: a stale poll does not keep finished requests on the books
    # 2 more than the router's own are running there (direct clients, another router)
    r.load = Load(num_running=4, num_waiting=1, router_in_flight=3)
    assert r.queue == 1 + 2
    r.load = Load(num_running=1, router_in_flight=3)  # the poll answered before two of ours arrived
    assert r.queue == 1
