"""ZMQ CURVE for the sockets replicas and routers share (the KV cache event stream, the K/V stream transport),
keyed by the internal key: both keypairs are derived from it, the binding side is the CURVE server, and a
ZAP handler on its context admits only the client keypair derived from the same key. A subscriber or sink
without the internal key cannot complete the handshake, so it reads nothing; what crosses the network is
encrypted.

Derivation: secret key = z85(sha256("vriksha-curve/<role>\\0" + internal key)) for role `server` and `client`
(any 32 bytes are a Curve25519 secret key); the public keys follow from them (`zmq.curve_public`).
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import threading
from dataclasses import dataclass
from typing import Any

from vriksha.errors import ConfigError

logger = logging.getLogger(__name__)

_authenticators: dict[int, Any] = {}  # id(context) -> its ZAP handler (one per context)
_lock = threading.Lock()


def available() -> bool:
    import zmq

    return bool(zmq.has("curve"))


def _secret(key: str, role: str) -> bytes:
    from zmq.utils import z85

    return z85.encode(hashlib.sha256(f"vriksha-curve/{role}\0{key}".encode()).digest())


@dataclass(frozen=True, slots=True)
class _Admit:
    """A ZAP credentials provider for one domain: it admits one client public key."""

    client_public: bytes

    def callback(self, domain: str, key: bytes) -> bool:
        ok = hmac.compare_digest(key, self.client_public)
        if not ok:
            logger.warning("refused a ZMQ peer without the internal key (CURVE domain %s)", domain)
        return ok


@dataclass(frozen=True, slots=True)
class CurveKeys:
    server_secret: bytes
    server_public: bytes
    client_secret: bytes
    client_public: bytes

    @classmethod
    def from_key(cls, internal_key: str) -> CurveKeys:
        import zmq

        if not available():
            raise ConfigError(
                "this pyzmq's libzmq has no CURVE support, which the internal key's ZMQ sockets need; install "
                "pyzmq's wheel (it bundles libzmq with CURVE)"
            )
        ss, cs = _secret(internal_key, "server"), _secret(internal_key, "client")
        return cls(ss, zmq.curve_public(ss), cs, zmq.curve_public(cs))

    @property
    def domain(self) -> str:
        return "vriksha-" + hashlib.sha256(self.server_public).hexdigest()[:16]

    def serve(self, sock: Any) -> None:
        """Make `sock` (before bind) a CURVE server that admits only holders of the same internal key."""
        _authenticator(sock.context).configure_curve_callback(
            self.domain, credentials_provider=_Admit(self.client_public)
        )
        sock.curve_secretkey = self.server_secret
        sock.curve_publickey = self.server_public
        sock.curve_server = True
        sock.zap_domain = self.domain.encode()

    def connect(self, sock: Any) -> None:
        """Make `sock` (before connect) a CURVE client of a server keyed by the same internal key."""
        sock.curve_secretkey = self.client_secret
        sock.curve_publickey = self.client_public
        sock.curve_serverkey = self.server_public


def _authenticator(context: Any) -> Any:
    """The ZAP handler of `context`, started on first use."""
    from zmq.auth.thread import ThreadAuthenticator

    with _lock:
        auth = _authenticators.get(id(context))
        if auth is None:
            auth = ThreadAuthenticator(context, log=logging.getLogger("vriksha.net.curve.zap"))
            auth.start()
            _authenticators[id(context)] = auth
        return auth


def stop_authenticator(context: Any) -> None:
    """Stop the ZAP handler of `context` (before the context is terminated)."""
    with _lock:
        auth = _authenticators.pop(id(context), None)
    if auth is not None:
        auth.stop()
