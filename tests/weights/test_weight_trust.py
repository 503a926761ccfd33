"""Weight updates under their own authority, checked and atomic, attacked as a client or a rogue caller would:
a client API key cannot pause, resume or push; a transfer's update belongs to the transfer that began it;
a wrong-shaped, short or partial push is refused whole with a 400 naming the problem, the weights and version
stay as they were and generation resumes; the version never moves backwards by accident; an abandoned update
is rolled back."""

from __future__ import annotations

import time
from collections.abc import Iterator

import httpx
import pytest
import torch

from tests.server.conftest import WEIGHTS, ServerProcess
from tests.weights.conftest import SERVER_ARGS
from tests.weights.test_weight_server import PROMPT, _trainer_model
from vriksha.weights import WeightSyncClient, WeightTransferError
from vriksha.weights.counters import CopyCounter
from vriksha.weights.shm import ShmSender, shm_available

pytestmark = [pytest.mark.slow, pytest.mark.skipif(not shm_available(), reason="no /dev/shm")]

API_KEY = "sk-weights-test-client"
USER = {"authorization": f"Bearer {API_KEY}"}


@pytest.fixture(scope="module")
def server(tiny_model_dir, tmp_path_factory) -> Iterator[ServerProcess]:
    """A server with a client API key and (from the environment, tests/weights/conftest.py) a weights key."""
    log = tmp_path_factory.mktemp("weight-trust") / "server.log"
    s = ServerProcess(["--model", str(tiny_model_dir), *SERVER_ARGS], log, api_key=API_KEY)
    try:
        yield s
    finally:
        s.stop()


def _generate(url: str) -> dict:
    body = {"input_ids": PROMPT, "sampling_params": {"temperature": 0, "max_new_tokens": 4}}
    resp = httpx.post(f"{url}/generate", json=body, headers=USER, timeout=30)  # paused: 30 s would pass
    assert resp.status_code == 200, resp.text
    return resp.json()


def _state(url: str) -> dict:
    return httpx.get(f"{url}/weight_version", headers=WEIGHTS, timeout=10).json()


def _digests(url: str) -> dict:
    return httpx.get(f"{url}/weight_digests", headers=WEIGHTS, timeout=60).json()


def _post(url: str, path: str, client: WeightSyncClient, **body: object) -> httpx.Response:
    payload = {"client_id": client.client_id, "token": client.token, **body}
    return httpx.post(f"{url}{path}", json=payload, headers=WEIGHTS, timeout=60)


def _unchanged(url: str, version: int, digests: dict) -> None:
    """Nothing of a refused update took effect: same version (never -1), same bytes, generation running."""
    state = _state(url)
    assert state["version"] == version and not state["updating"] and not state["paused"]
    assert _digests(url) == digests
    assert _generate(url)["weight_version"] == version


def test_a_client_key_cannot_pause_resume_or_update(server) -> None:
    url = server.base_url
    for path in ("/pause", "/resume", "/reset_prefix_cache", "/start_weight_update", "/update_weights"):
        resp = httpx.post(f"{url}{path}", json={}, headers=USER, timeout=10)
        assert resp.status_code == 401, (path, resp.text)
    init = {"client_id": "mallory", "backend": "shm", "init_info": {}}
    assert (
        httpx.post(f"{url}/init_weight_transfer_engine", json=init, headers=USER, timeout=10).status_code
        == 401
    )
    assert httpx.get(f"{url}/weight_digests", headers=USER, timeout=10).status_code == 401
    public = httpx.get(f"{url}/weight_version", headers=USER, timeout=10).json()
    assert "owner" not in public and public["paused"] is False  # who trains is for trainers only
    assert _generate(url)["outputs"][0]["token_ids"]


def test_an_update_belongs_to_the_transfer_that_began_it(server, tiny_model_dir) -> None:
    url = server.base_url
    trainer = WeightSyncClient(url, "trainer-a", backend="shm")
    try:
        trainer.connect()
        version = _state(url)["version"]
        assert _post(url, "/start_weight_update", trainer, version=version + 1).status_code == 200
        assert _state(url)["paused"] is True
        rogue = httpx.post(f"{url}/resume", headers=WEIGHTS, timeout=10)
        assert rogue.status_code == 409 and _state(url)["paused"] is True
        for path in (
            "/update_weights",
            "/finish_weight_update",
            "/close_communicator",
            "/start_weight_update",
        ):
            body = {"client_id": "trainer-a", "token": "guessed", "version": 99, "update_info": {}}
            resp = httpx.post(f"{url}{path}", json=body, headers=WEIGHTS, timeout=10)
            assert resp.status_code == 409, (path, resp.text)
        other = {"client_id": "trainer-b", "backend": "shm", "init_info": {}}
        resp = httpx.post(f"{url}/init_weight_transfer_engine", json=other, headers=WEIGHTS, timeout=10)
        assert resp.status_code == 409
        assert _state(url)["updating"] is True  # the trainer's update is untouched
        assert _post(url, "/close_communicator", trainer).status_code == 200  # its own token ends it
        assert _state(url)["paused"] is False and _state(url)["version"] == version
    finally:
        trainer.close()


def _shm_push(
    url: str, client: WeightSyncClient, tensors: list, version: int, **tamper: object
) -> httpx.Response:
    """start, then update_weights with `tensors` packed into shared memory (`tamper`: fields of the update
    info replaced, as a broken or hostile sender would send them)."""
    sender = ShmSender()
    try:
        info = sender.prepare(tensors, CopyCounter())
        info.update(tamper)
        assert _post(url, "/start_weight_update", client, version=version).status_code == 200
        return _post(url, "/update_weights", client, update_info=info)
    finally:
        sender.close()


def test_bad_pushes_are_refused_whole_and_generation_resumes(server, tiny_model_dir) -> None:
    url = server.base_url
    model = _trainer_model(tiny_model_dir, seed=41)
    good = [(n, p.detach()) for n, p in model.named_parameters()]
    client = WeightSyncClient(url, "trainer-a", backend="shm")
    try:
        client.connect()
        version, digests = _state(url)["version"], _digests(url)
        # a wrong shape: refused by name before any copy (it used to crash the handler, generation paused)
        name, t = good[-1]
        wrong = [*good[:-1], (name, torch.zeros(t.shape[0] + 1, *t.shape[1:], dtype=t.dtype))]
        resp = _shm_push(url, client, wrong, version + 1)
        assert resp.status_code == 400 and name in resp.json()["error"]["message"], resp.text
        _unchanged(url, version, digests)
        # specs claiming more bytes than the buffer holds
        resp = _shm_push(url, client, good, version + 1, size=64)
        assert resp.status_code == 400 and "smaller" in resp.json()["error"]["message"], resp.text
        _unchanged(url, version, digests)
        # a partial push: half the tensors arrive, the update finishes: nothing of it is applied
        resp = _shm_push(url, client, good[: len(good) // 2], version + 1)
        assert resp.status_code == 200, resp.text
        done = _post(url, "/finish_weight_update", client)
        assert done.status_code == 400 and "did not send" in done.json()["error"]["message"], done.text
        _unchanged(url, version, digests)
        # the full push after all that still lands
        assert client.push(model, version + 1).version == version + 1
        assert _digests(url) != digests and _generate(url)["weight_version"] == version + 1
    finally:
        client.close()


def test_versions_move_forward_and_abandoned_updates_roll_back(server, tiny_model_dir) -> None:
    url = server.base_url
    model = _trainer_model(tiny_model_dir, seed=42)
    client = WeightSyncClient(url, "trainer-a", backend="shm")
    try:
        client.push(model, _state(url)["version"] + 5)
        version, digests = _state(url)["version"], _digests(url)
        with pytest.raises(WeightTransferError, match="behind the served version"):
            client.push(_trainer_model(tiny_model_dir, seed=43), version - 1)
        _unchanged(url, version, digests)
        # a trainer that dies mid-update does not hold generation paused: its update expires
        resp = _post(url, "/start_weight_update", client, version=version + 1, timeout_s=1.0)
        assert resp.status_code == 200 and _state(url)["paused"] is True
        time.sleep(2.0)
        _unchanged(url, version, digests)
        # restoring older weights on purpose says so
        assert client.push(model, version - 1, rewind=True).version == version - 1
    finally:
        client.close()
