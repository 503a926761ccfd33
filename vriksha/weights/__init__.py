"""Weight transfer from a trainer to engine servers: data planes (shared memory, gloo buckets, files), the
version protocol's engine side, and the trainer's client. A leaf package: torch and the errors only."""

from vriksha.weights.client import PushResult, WeightSyncClient
from vriksha.weights.counters import CopyCounter
from vriksha.weights.plan import TensorSpec, WeightTransferError, digest
from vriksha.weights.protocol import NamedTensors, WeightReceiver, WeightSender

__all__ = [
    "CopyCounter",
    "NamedTensors",
    "PushResult",
    "TensorSpec",
    "WeightReceiver",
    "WeightSender",
    "WeightSyncClient",
    "WeightTransferError",
    "digest",
]
