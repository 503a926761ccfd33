"""The trust model's parts without a server: which role a path needs and which credential grants it (a client
API key never grants the internal or the weights role), peers named by their origin only, the event stream's
CURVE keys admitting exactly the holders of the internal key, and the semantic cache scoped per end user."""

from __future__ import annotations

import time

import pytest
import zmq

from vriksha.errors import ConfigError
from vriksha.net.curve import CurveKeys, stop_authenticator
from vriksha.net.trust import check_keys
from vriksha.server.auth import INTERNAL, PUBLIC, USER, WEIGHTS, AccessPolicy
from vriksha.server.kv_roles import KVRoleConfig, peer_origin

API, INTERNAL_KEY, WEIGHTS_KEY = "sk-client", "i" * 20, "w" * 20


def scope(**headers: str) -> dict:
    return {"headers": [(k.encode(), v.encode()) for k, v in headers.items()]}


def bearer(key: str) -> dict:
    return scope(authorization=f"Bearer {key}")


def test_each_path_takes_its_own_role_key() -> None:
    policy = AccessPolicy(API, INTERNAL_KEY, WEIGHTS_KEY, frozenset({"/health"}))
    internal = scope(**{"x-vriksha-internal-key": INTERNAL_KEY})
    weights = scope(**{"x-vriksha-weights-key": WEIGHTS_KEY})
    for path in ("/kv/pull", "/kv/prefill", "/kv/transfers", "/kv_events/snapshot"):
        assert policy.role_of(bearer(API), path) is None
        assert policy.role_of(weights, path) is None
        assert policy.role_of(internal, path) == INTERNAL
        assert policy.role_of(bearer(INTERNAL_KEY), path) is None  # only in its own header
    for path in ("/pause", "/resume", "/update_weights", "/init_weight_transfer_engine", "/weight_digests"):
        assert policy.role_of(bearer(API), path) is None
        assert policy.role_of(internal, path) is None
        assert policy.role_of(weights, path) == WEIGHTS
    assert policy.role_of(bearer(API), "/load") == USER and policy.role_of(internal, "/load") == INTERNAL
    assert policy.role_of(bearer(API), "/weight_version") == USER
    assert policy.role_of(weights, "/weight_version") == WEIGHTS
    assert policy.role_of(internal, "/v1/completions") is None
    assert policy.role_of(scope(), "/health") == PUBLIC
    assert policy.role_of(bearer(API), "/v1/completions") == USER


def test_roles_without_a_key_are_closed_even_on_an_open_server() -> None:
    policy = AccessPolicy(None, None, None, frozenset({"/kv/pull", "/pause"}))  # exempt cannot open them
    assert policy.role_of(scope(), "/v1/completions") == USER
    weights = scope(**{"x-vriksha-weights-key": WEIGHTS_KEY})
    assert (
        AccessPolicy(None, None, WEIGHTS_KEY).role_of(weights, "/weight_version") == WEIGHTS
    )  # not just open
    for path in ("/kv/pull", "/kv_events/snapshot", "/pause", "/update_weights"):
        assert policy.role_of(scope(), path) is None
        status, message, code = policy.refusal(scope(), path)
        assert status == 403 and code == "endpoint_closed" and "started without" in message
    status, message, _ = AccessPolicy(API, INTERNAL_KEY).refusal(bearer(API), "/kv/pull")
    assert status == 401 and "x-vriksha-internal-key" in message


def test_keys_are_long_and_distinct() -> None:
    check_keys("short-is-fine-for-clients", INTERNAL_KEY, WEIGHTS_KEY)
    with pytest.raises(ConfigError, match="must differ"):
        check_keys(INTERNAL_KEY, INTERNAL_KEY)
    with pytest.raises(ConfigError, match="at least 16"):
        check_keys(None, "tiny")


def test_peers_are_matched_by_origin_only() -> None:
    cfg = KVRoleConfig(role="decode", peers=["http://127.0.0.1:8001/"], internal_key=INTERNAL_KEY)
    cfg.validate()
    assert cfg.allowed_peer("http://127.0.0.1:8001") == "http://127.0.0.1:8001"
    for url in (
        "http://127.0.0.1:8002",
        "http://evil@127.0.0.1:8001",
        "http://127.0.0.1:8001/other/path",
        "https://127.0.0.1:8001",
        "http://127.0.0.1.evil.example:8001",
        "file:///etc/passwd",
        "http://127.0.0.1:99999",
    ):
        assert cfg.allowed_peer(url) is None, url
    assert peer_origin("http://Replica.Local") == "http://replica.local:80"
    with pytest.raises(ConfigError, match="needs --internal-key"):
        KVRoleConfig(role="prefill").validate()


def test_curve_admits_only_the_same_internal_key() -> None:
    keys = CurveKeys.from_key(INTERNAL_KEY)
    ctx, cctx = zmq.Context(), zmq.Context()
    pub = ctx.socket(zmq.PUB)
    pub.setsockopt(zmq.LINGER, 0)
    keys.serve(pub)
    endpoint = f"tcp://127.0.0.1:{pub.bind_to_random_port('tcp://127.0.0.1')}"
    subs = {}
    for name, k in (("same", keys), ("other", CurveKeys.from_key("o" * 20)), ("plain", None)):
        sock = cctx.socket(zmq.SUB)
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.SUBSCRIBE, b"")
        if k is not None:
            k.connect(sock)
        sock.connect(endpoint)
        subs[name] = sock
    try:
        time.sleep(0.5)
        got: dict[str, bytes] = {}
        for _ in range(20):
            pub.send(b"SECRET")
            for name, sock in subs.items():
                if sock.poll(50):
                    got[name] = sock.recv()
        assert got == {"same": b"SECRET"}
    finally:
        for sock in subs.values():
            sock.close()
        pub.close()
        stop_authenticator(ctx)
        ctx.term()
        cctx.term()


def test_semantic_cache_scope_is_per_end_user() -> None:
    from vriksha.semantic.cache import scope_key

    def body(user: str | None) -> dict:
        b = {"messages": [{"role": "user", "content": "What is my balance?"}]}
        return b if user is None else {**b, "user": user}

    alice = scope_key("sk-shared", "pool", "/v1/chat/completions", body("alice"), "What is my balance?")
    bob = scope_key("sk-shared", "pool", "/v1/chat/completions", body("bob"), "What is my balance?")
    anon = scope_key("sk-shared", "pool", "/v1/chat/completions", body(None), "What is my balance?")
    assert len({alice, bob, anon}) == 3
    assert alice == scope_key(
        "sk-shared", "pool", "/v1/chat/completions", body("alice"), "What is my balance?"
    )
