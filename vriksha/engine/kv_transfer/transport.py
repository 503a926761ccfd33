"""The K/V transfer interface between a prefill replica (the source) and a decode replica (the sink).

A transfer moves the K/V of a run of prompt tokens, `[start, end)`, out of the source's pool into slots the
sink reserved in its own pool. The source `offer`s the tokens (off the engine thread, while their slots are
locked in its radix tree) and answers with the transport's part of a `Descriptor`; the sink `fetch`es from
that descriptor straight into its slots; the source `withdraw`s the offer when the sink is done, when it
fails, or when the offer times out. A transport is one `KVSource` and one `KVSink` under one name, in a file
of its own; `register` makes it known (see docs/router.md: "adding a transport").
"""

from __future__ import annotations

import functools
import socket
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any

import torch

import vriksha.device as devices
from vriksha.engine.core.kv_layout import KVLayout, LayerKV
from vriksha.engine.core.kv_pool import KVPool
from vriksha.errors import KVTransferError as KVTransferError  # raised by every transport


@dataclass(frozen=True, slots=True)
class SlotView:
    """Some slots of a pool: the tokens a transfer reads (source) or writes (sink), in order."""

    pool: KVPool
    slots: torch.Tensor

    @property
    def num_tokens(self) -> int:
        return self.slots.numel()

    def read(self, layer: int) -> tuple[torch.Tensor, torch.Tensor]:
        """K and V of these tokens in `layer`, gathered into new contiguous tensors in host memory."""
        host = devices.host()
        k = self.pool.k[layer].index_select(0, self.slots)
        v = self.pool.v[layer].index_select(0, self.slots)
        return k.to(host), v.to(host)

    def read_into(self, layer: int, k: torch.Tensor, v: torch.Tensor) -> None:
        """Gather K and V of these tokens in `layer` straight into the host tensors `k` and `v` (views of shared
        memory): in place from a pool in host memory, through one device-to-host copy from an accelerator."""
        if devices.is_host(self.pool.device):
            torch.index_select(self.pool.k[layer], 0, self.slots, out=k)
            torch.index_select(self.pool.v[layer], 0, self.slots, out=v)
        else:
            k.copy_(self.pool.k[layer].index_select(0, self.slots))
            v.copy_(self.pool.v[layer].index_select(0, self.slots))

    def write(self, layer: int, k: torch.Tensor, v: torch.Tensor) -> None:
        """Scatter K and V (in host memory or on the pool's device) into these slots."""
        device = self.pool.device
        self.pool.write(layer, self.slots, k.to(device), v.to(device))


def describe_layout(layout: KVLayout, dtype: torch.dtype) -> dict[str, Any]:
    return {
        "dtype": str(dtype).removeprefix("torch."),
        "layers": [[x.kv_heads, x.k_dim, x.v_dim] for x in layout.layers],
    }


def check_layout(wire: dict[str, Any], pool: KVPool) -> None:
    """The source's K/V must be shaped as this pool's: the same model on both sides."""
    mine = describe_layout(pool.layout, pool.dtype)
    theirs = {"dtype": wire.get("dtype"), "layers": [list(x) for x in wire.get("layers", [])]}
    if theirs != mine:
        raise KVTransferError(
            f"the prefill replica's K/V layout ({theirs['dtype']}, {len(theirs['layers'])} layers) differs from "
            f"this replica's ({mine['dtype']}, {len(mine['layers'])} layers): prefill and decode replicas must "
            "serve the same model with the same --dtype and --kv-cache-dtype (auto may pick a bf16 pool on one CPU and "
            "not another: give it explicitly across unlike hosts)"
        )


def token_bytes(layer: LayerKV, dtype: torch.dtype) -> tuple[int, int]:
    size = torch.empty((), dtype=dtype).element_size()
    return layer.kv_heads * layer.k_dim * size, layer.kv_heads * layer.v_dim * size


@functools.cache
def host_id() -> str:
    """Names this machine (its hostname and boot): two processes with the same id share /dev/shm."""
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            boot = f.read().strip()
    except OSError:
        boot = ""
    return f"{socket.gethostname()}/{boot}"


@dataclass(slots=True)
class Descriptor:
    """What the sink needs to fetch a transfer: sent by the prefill replica to the decode replica (JSON)."""

    transfer_id: str
    transport: str
    num_tokens: int  # the source holds K/V for tokens [start, num_tokens) of the prompt
    start: int
    layout: dict[str, Any]
    host_id: str
    info: dict[str, Any] = field(default_factory=dict)  # the transport's own part (segment name, endpoint)

    def to_dict(self) -> dict[str, Any]:
        return {
            "transfer_id": self.transfer_id,
            "transport": self.transport,
            "num_tokens": self.num_tokens,
            "start": self.start,
            "layout": self.layout,
            "host_id": self.host_id,
            "info": self.info,
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Descriptor:
        try:
            return cls(
                transfer_id=str(d["transfer_id"]),
                transport=str(d["transport"]),
                num_tokens=int(d["num_tokens"]),
                start=int(d["start"]),
                layout=dict(d["layout"]),
                host_id=str(d["host_id"]),
                info=dict(d.get("info") or {}),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise KVTransferError(f"malformed transfer descriptor from the prefill replica: {exc}") from exc


class KVSource(ABC):
    """The prefill side of a transport."""

    name = "transport"
    # True: the offer reads the pool when the sink fetches, so the slots stay locked until `withdraw`;
    # False: `offer` copied the K/V out, and the slots are unlocked at once.
    holds_slots = True

    @abstractmethod
    def offer(self, transfer_id: str, kv: SlotView) -> dict[str, Any]:
        """Make `kv` fetchable under `transfer_id`; return the descriptor's `info`. Runs off the engine thread
        while the slots are locked."""

    @abstractmethod
    def withdraw(self, transfer_id: str) -> None:
        """Forget the offer and free what it holds (harmless for an unknown id)."""

    def close(self) -> None:  # noqa: B027 - most sources hold nothing past their offers
        """Withdraw everything; the source takes no more offers."""


class KVSink(ABC):
    """The decode side of a transport."""

    name = "transport"

    @abstractmethod
    def fetch(self, desc: Descriptor, begin: int, into: SlotView, timeout_s: float) -> None:
        """Copy the source's K/V of tokens `[begin, begin + into.num_tokens)` into `into`'s slots; raise
        `KVTransferError` on failure or after `timeout_s`."""

    def close(self) -> None:  # noqa: B027 - most sinks hold nothing between fetches
        """Free what the sink keeps between fetches."""


TRANSPORTS: dict[str, tuple[type[KVSource], type[KVSink]]] = {}
PREFERENCE: list[str] = []  # "auto" takes the first of these that both sides can use
SAME_HOST_ONLY: set[str] = set()


def register(name: str, source: type[KVSource], sink: type[KVSink], same_host_only: bool = False) -> None:
    """Make a transport known under `name`; same-host transports come first in "auto"."""
    TRANSPORTS[name] = (source, sink)
    if name not in PREFERENCE:
        PREFERENCE.insert(0 if same_host_only else len(PREFERENCE), name)
    if same_host_only:
        SAME_HOST_ONLY.add(name)


def accepted(wanted: str) -> list[str]:
    """The transports a decode replica asks for, best first: all of them for "auto", else the one named."""
    if wanted == "auto":
        return list(PREFERENCE)
    if wanted not in TRANSPORTS:
        raise KVTransferError(f"unknown K/V transport {wanted!r}; pick auto or one of {sorted(TRANSPORTS)}")
    return [wanted]


def choose_transport(wanted: list[str], available: list[str], sink_host: str) -> str:
    """On the prefill side: the first transport the decode replica on `sink_host` asks for that this side
    runs and that reaches it (a same-host transport only when the hosts are one)."""
    for name in wanted:
        if name in available and (name not in SAME_HOST_ONLY or sink_host == host_id()):
            return name
    raise KVTransferError(
        f"no K/V transport in common: the decode replica asks for {wanted} (on host {sink_host!r}), this "
        f"prefill replica runs {available} (on host {host_id()!r}); pass --kv-transport auto to both"
    )
