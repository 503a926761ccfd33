"""K/V transfer between a prefill replica and a decode replica: the interface (`transport`), its transports
(`shm` on one host, `stream` across hosts) and the two sides (`prefill`, `decode`)."""

from vriksha.engine.kv_transfer import shm, stream  # noqa: F401 - registers the transports
from vriksha.engine.kv_transfer.decode import DecodeSide, PrefillPeer, PullResult
from vriksha.engine.kv_transfer.prefill import PrefillSide
from vriksha.engine.kv_transfer.transport import (
    PREFERENCE,
    TRANSPORTS,
    Descriptor,
    KVSink,
    KVSource,
    KVTransferError,
    SlotView,
    accepted,
    host_id,
    register,
)

__all__ = [
    "PREFERENCE",
    "TRANSPORTS",
    "DecodeSide",
    "Descriptor",
    "KVSink",
    "KVSource",
    "KVTransferError",
    "PrefillPeer",
    "PrefillSide",
    "PullResult",
    "SlotView",
    "accepted",
    "host_id",
    "register",
]
