"""Where `ServerRollout` sends a session (no server started): every session of a family to one server, families
spread over the servers, the router when there is one; a close that fails is logged and reported, not raised."""

from __future__ import annotations

import logging
from types import SimpleNamespace

from torch import nn

from vriksha.net.launch import free_port
from vriksha.train.config import ModelConfig, RolloutConfig
from vriksha.train.server_rollout import ServerRollout


def _rollout(tmp_path, servers, router=None) -> ServerRollout:
    cfg = RolloutConfig(mode="server", servers=servers, router=router)
    # rank 1: no weight clients (rank 0 pushes the weights), nothing is contacted here
    return ServerRollout(cfg, ModelConfig(), nn.Linear(1, 1), SimpleNamespace(eos_token_id=2), tmp_path, 1, 0)


def test_a_session_family_stays_on_one_server_and_families_spread(tmp_path):
    urls = [f"http://127.0.0.1:{9000 + i}" for i in range(4)]
    rollout = _rollout(tmp_path, urls)
    try:
        chosen = set()
        for g in range(32):
            group = f"episode-abc-{g}"
            home = rollout.server_of(group)
            assert all(rollout.server_of(f"{group}/{m}") == home for m in range(8))
            chosen.add(home)
        assert chosen == set(urls)
        assert rollout.server_of(None, 0) != rollout.server_of(None, 1)  # no session: in turn
    finally:
        rollout.close()


def test_the_router_takes_every_session(tmp_path):
    rollout = _rollout(tmp_path, ["http://127.0.0.1:9000", "http://127.0.0.1:9001"], router="http://r:8/")
    try:
        assert {rollout.server_of(f"episode-x-{g}/0") for g in range(8)} == {"http://r:8"}
    finally:
        rollout.close()


def test_closing_a_session_on_a_server_that_is_gone_is_logged_not_raised(tmp_path, caplog):
    rollout = _rollout(tmp_path, [f"http://127.0.0.1:{free_port()}"])
    try:
        with caplog.at_level(logging.WARNING, logger="vriksha.train.server_rollout"):
            assert rollout.close_session("episode-y-0/1") is False
        assert "episode-y-0/1" in caplog.text
    finally:
        rollout.close()
