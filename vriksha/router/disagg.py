"""The router's part in prefill/decode disaggregation: before a request goes to its decode replica, a prompt
whose uncached part there is longer than `pd_threshold_tokens` is computed on the least loaded prefill
replica and its K/V moved into the decode replica's radix tree (`POST /kv/pull` on the decode replica, which
asks the prefill replica and fetches). Short prompts, and prompts the decode replica mostly holds, skip it.
A failed transfer costs nothing but time, at most `pd_timeout_s`: the request is forwarded anyway and the
decode replica computes the prompt itself. The router calls /kv/pull with the internal key, never a
client's credentials.
"""

from __future__ import annotations

import asyncio
import logging
import time

import httpx

from vriksha.router.pool import ReplicaPool
from vriksha.router.replica import Replica

logger = logging.getLogger(__name__)


def least_loaded_prefill(replicas: list[Replica]) -> Replica:
    return min(replicas, key=lambda r: (r.in_flight, r.queue, r.load.kv_usage, r.index))


class Disaggregation:
    def __init__(self, pool: ReplicaPool, http: httpx.AsyncClient) -> None:
        self.pool = pool
        self.http = http

    def wanted(self, decode: Replica, tokens: list[int], predicted_cached: int) -> bool:
        """Whether the prompt's part `decode` lacks (as far as the policy or the replica's mirror knows; the
        decode replica checks against its own tree again) is over the threshold."""
        if not self.pool.has_prefill:
            return False
        ev = decode.events
        mirrored = ev.tree.match(tokens) if ev is not None and ev.synced else 0
        return len(tokens) - max(predicted_cached, mirrored) > self.pool.config.pd_threshold_tokens

    async def prefill(self, decode: Replica, tokens: list[int]) -> str:
        """Move the prompt's K/V to `decode`; returns the outcome (ok, skipped, failed, no_prefill)."""
        candidates = self.pool.healthy_prefill()
        metrics = self.pool.metrics
        if not candidates:
            metrics.pd_transfers.labels("", decode.url, "no_prefill").inc()
            return "no_prefill"
        p = least_loaded_prefill(candidates)
        body = {
            "token_ids": tokens,
            "prefill_url": p.url,
            "min_new_tokens": self.pool.config.pd_threshold_tokens,
        }
        t0 = time.perf_counter()
        p.in_flight += 1
        status = "failed"
        try:
            async with asyncio.timeout(self.pool.config.pd_timeout_s):  # the whole call, not each read
                resp = await self.http.post(
                    f"{decode.url}/kv/pull", json=body, headers=self.pool.internal_headers
                )
            if resp.status_code == 200:
                result = resp.json()
                status = "skipped" if result.get("skipped") else "ok"
                metrics.pd_tokens.labels(decode.url).inc(int(result.get("fetched", 0)))
            else:
                logger.warning(
                    "P/D transfer %s -> %s failed (%d): %s; the decode replica computes the prompt",
                    p.url,
                    decode.url,
                    resp.status_code,
                    resp.text[:300],
                )
        except TimeoutError:
            logger.warning(
                "P/D transfer to %s took over %g s (--pd-timeout); forwarding as is",
                decode.url,
                self.pool.config.pd_timeout_s,
            )
        except httpx.HTTPError as exc:
            logger.warning("P/D transfer to %s failed: %s; forwarding as is", decode.url, exc)
        finally:
            p.in_flight -= 1
            metrics.pd_transfers.labels(p.url, decode.url, status).inc()
            metrics.pd_seconds.observe(time.perf_counter() - t0)
        return status
