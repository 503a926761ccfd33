"""Session ownership on a real loopback server: the resume token, not the bare id, resumes, drives
or deletes a session; malformed WebSocket requests each get a coded answer and break nothing."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from typing import Any

import httpx
import pytest
from websockets.exceptions import ConnectionClosed
from websockets.sync.client import connect

from tests.envs.test_server import WS, CounterEnv
from vriksha.envs.client import EnvClient
from vriksha.envs.protocol import EnvConnectionError
from vriksha.envs.server import EnvServerConfig, ServerThread, create_app
from vriksha.net.launch import free_port

pytestmark = pytest.mark.timeout(120)

TOKEN = "X-Vriksha-Resume-Token"


@pytest.fixture(scope="module")
def url():
    config = EnvServerConfig(max_sessions=16, heartbeat_s=5, idle_timeout_s=60, detach_grace_s=5)
    with ServerThread(create_app(CounterEnv, config)) as base:
        yield base


def _refused(url: str, query: str, headers: dict[str, str] | None = None) -> dict[str, Any]:
    """Open a WebSocket that the server must refuse: returns its error and checks the close."""
    ws = connect(url.replace("http://", "ws://") + "/v1/ws" + query, additional_headers=headers)
    try:
        msg = json.loads(ws.recv(timeout=10))
        assert msg["event"] == "error", msg
        with pytest.raises(ConnectionClosed):
            ws.recv(timeout=5)
        assert ws.close_code == 1008
        return msg["error"]
    finally:
        ws.close()


def test_every_session_gets_its_own_secret_token(url):
    a, b = WS(url), WS(url)
    made = httpx.post(url + "/v1/sessions").json()
    try:
        tokens = [a.hello["resume_token"], b.hello["resume_token"], made["resume_token"]]
        assert len(set(tokens)) == 3 and all(len(t) >= 40 for t in tokens)
        assert a.hello["resume_token"] != a.hello["session_id"]
        assert (
            "resume_token" in httpx.get(url + "/schema").json()["protocol"]["messages"]["hello"]["required"]
        )
    finally:
        a.close()
        b.close()
        httpx.delete(f"{url}/v1/sessions/{made['session_id']}", headers={TOKEN: made["resume_token"]})


def test_a_live_session_cannot_be_taken_over_with_its_id(url):
    owner = WS(url)
    sid = owner.hello["session_id"]
    try:
        owner.ask(0, "reset", seed=1)
        owner.ask(1, "step", action={"text": "a"})
        bare = _refused(url, f"?session={sid}")
        assert bare["code"] == "session_forbidden" and "resume token" in bare["message"]
        wrong = _refused(url, f"?session={sid}", {TOKEN: "guess" * 9})
        assert wrong["code"] == "session_forbidden" and "does not match" in wrong["message"]
        assert _refused(url, f"?session={sid}&token=guess")["code"] == "session_forbidden"
        # the owner was never disturbed: no closing event, and its episode goes on
        assert owner.ask(2, "step", action={"text": "b"})["result"]["observation"]["text"] == "b#2"
        assert not [e for e in owner.events if e["event"] == "closing"]
    finally:
        owner.close()


def test_a_dropped_session_resumes_only_with_its_token(url):
    first = WS(url)
    sid, token = first.hello["session_id"], first.hello["resume_token"]
    first.ask(0, "reset", seed=2)
    first.ask(1, "step", action={"text": "a"})
    first.ws.close()  # dropped without "close": resumable, but only by its owner
    time.sleep(0.1)
    assert _refused(url, f"?session={sid}")["code"] == "session_forbidden"
    again = WS(url, f"?session={sid}&token={token}")  # the query form, for clients without headers
    try:
        assert again.hello["resumed"] is True and again.hello["session_id"] == sid
        assert again.ask(2, "state")["result"]["step_count"] == 1
    finally:
        again.ask(3, "close")
        again.close()


def test_http_calls_and_deletes_need_the_token(url):
    made = httpx.post(url + "/v1/sessions").json()
    sid, mine = made["session_id"], {TOKEN: made["resume_token"]}
    ws = WS(url)
    with httpx.Client(base_url=url) as http:
        try:
            assert http.post(f"/v1/sessions/{sid}/reset", json={"seed": 1}, headers=mine).status_code == 200
            for method, path, body in [
                ("POST", "/reset", {"seed": 1}),
                ("POST", "/step", {"action": {"text": "x"}}),
                ("GET", "/state", None),
                ("GET", "/tools", None),
                ("POST", "/tools/total", {}),
                ("DELETE", "", None),
            ]:
                for headers in ({}, {TOKEN: "not-it"}):
                    r = http.request(method, f"/v1/sessions/{sid}{path}", json=body, headers=headers)
                    assert r.status_code == 403, (method, path, r.text)
                    assert r.json()["error"]["code"] == "session_forbidden"
            # deleting another client's WebSocket session by its id is refused as well
            r = http.delete(f"/v1/sessions/{ws.hello['session_id']}")
            assert r.status_code == 403 and r.json()["error"]["code"] == "session_forbidden"
            assert ws.ask(0, "reset", seed=0)["ok"] and not ws.events
            # the owner's session is untouched by all of that
            assert http.get(f"/v1/sessions/{sid}/state", headers=mine).json()["step_count"] == 0
            assert http.delete(f"/v1/sessions/{sid}", headers=mine).json()["closed"] is True
            gone = http.get(f"/v1/sessions/{sid}/state", headers=mine)
            assert gone.status_code == 404 and gone.json()["error"]["code"] == "unknown_session"
            # the WebSocket's owner may end its own session over HTTP
            own = {TOKEN: ws.hello["resume_token"]}
            assert http.delete(f"/v1/sessions/{ws.hello['session_id']}", headers=own).status_code == 200
        finally:
            ws.ws.close()


_MALFORMED: list[tuple[str | bytes, str, Any]] = [  # payload, code, the id the answer echoes
    ("{not json", "invalid_json", None),
    ('{"id": 1, "op": "step", "action": NaN}', "invalid_json", None),
    (b"\xff\xfe{", "invalid_json", None),
    ('["a list"]', "invalid_message", None),
    ('"a string"', "invalid_message", None),
    ("42", "invalid_message", None),
    ("null", "invalid_message", None),
    ('{"id": [1], "op": "ping"}', "invalid_message", None),
    ('{"id": {"a": 1}, "op": "ping"}', "invalid_message", None),
    ('{"id": [1], "op": "step", "action": {"text": "x"}}', "invalid_message", None),
    ('{"id": true, "op": "state"}', "invalid_message", None),
    ('{"id": 1.5, "op": "state"}', "invalid_message", None),
    (json.dumps({"id": "x" * 300, "op": "state"}), "invalid_message", None),
    ('{"op": "state"}', "invalid_message", None),
    ('{"id": 1}', "invalid_message", 1),
    ('{"id": 2, "op": ["step"]}', "invalid_message", 2),
    ('{"id": 3, "op": 7}', "invalid_message", 3),
    ('{"id": 4, "op": "dance"}', "unknown_op", 4),
    ('{"id": 5, "op": "step"}', "invalid_message", 5),
    ('{"id": 6, "op": "step", "action": "42"}', "invalid_action", 6),
    ('{"id": 7, "op": "reset", "seed": "7"}', "invalid_message", 7),
    ('{"id": 8, "op": "reset", "seed": -1}', "invalid_message", 8),
    ('{"id": 9, "op": "reset", "seed": 1.5}', "invalid_message", 9),
    ('{"id": 10, "op": "reset", "seed": true}', "invalid_message", 10),
    ('{"id": 12, "op": "reset", "options": [1]}', "invalid_message", 12),
    ('{"id": 13, "op": "call_tool", "name": 5}', "invalid_message", 13),
    ('{"id": 14, "op": "call_tool"}', "invalid_message", 14),
    ('{"id": 15, "op": "call_tool", "name": "total", "arguments": [1]}', "invalid_message", 15),
]


def test_every_malformed_request_gets_a_coded_answer(url):
    s, other = WS(url), WS(url)
    try:
        s.ask("r", "reset", seed=1)
        other.ask("r", "reset", seed=2)
        for payload, code, rid in _MALFORMED:
            s.send_raw(payload)
            answer = s.recv_answer()
            assert answer["ok"] is False and answer["error"]["code"] == code, (payload, answer)
            assert answer["error"]["message"] and answer["id"] == rid, (payload, answer)
        assert "string or an integer" in json.dumps(_answer(s, '{"id": [1], "op": "ping"}'))
        # a binary frame with a good request is answered like a text one
        s.ws.send(json.dumps({"id": "bin", "op": "state"}).encode())
        assert s.recv_answer()["result"]["step_count"] == 0
        # the session, and its neighbour, still work
        assert s.ask("ok", "step", action={"text": "fine"})["result"]["observation"]["text"] == "fine#1"
        assert other.ask(1, "step", action={"text": "x"})["result"]["observation"]["text"] == "x#1"
        assert s.ask("p", "ping")["ok"]
    finally:
        s.close()
        other.close()


def _answer(s: WS, payload: str) -> dict[str, Any]:
    s.send_raw(payload)
    return s.recv_answer()


def test_an_id_less_ping_stays_a_silent_heartbeat(url):
    s = WS(url)
    try:
        s.send_raw('{"op": "ping"}')
        s.send_raw('{"id": null, "op": "ping"}')
        assert s.ask("next", "state")["error"]["code"] == "episode_state"  # no answer came before it
    finally:
        s.close()


def test_client_holds_the_token_and_a_refused_resume_is_a_clear_error(url):
    with EnvClient(url, reconnect_backoff_s=0.05, reconnect_attempts=1) as env:
        env.reset(seed=0)
        assert env.resume_token == env.hello["resume_token"]
        env.aclient.resume_token = "stolen-or-stale"
        env._call(env.aclient._drop())  # the connection drops; the next request resumes
        with pytest.raises(EnvConnectionError, match="refused to resume"):
            env.step({"text": "a"})


@pytest.mark.slow
def test_ownership_on_vriksha_env_serve_with_an_openenv_client_alongside(tmp_path):
    """The real `vriksha env serve` process: a stranger with the id is refused, the owner and an
    openenv-core client (per-connection sessions, no token) go on working."""
    from openenv.core.generic_client import GenericEnvClient

    port = free_port()
    env = {**os.environ, "PYTHONPATH": os.getcwd() + os.pathsep + os.environ.get("PYTHONPATH", "")}
    cmd = [sys.executable, "-m", "vriksha.cli", "env", "serve", "arithmetic", "--port", str(port)]
    log = (tmp_path / "server.log").open("w")
    proc = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            assert proc.poll() is None, (tmp_path / "server.log").read_text()
            try:
                if httpx.get(base + "/health", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline, "server did not start"
            time.sleep(0.2)
        with EnvClient(base) as owner, GenericEnvClient(base_url=base).sync() as oe:
            first = owner.reset(seed=4).observation.text
            assert oe.reset(seed=4).observation["text"] == first
            sid = owner.session_id
            assert _refused(base, f"?session={sid}")["code"] == "session_forbidden"
            r = httpx.delete(f"{base}/v1/sessions/{sid}")
            assert r.status_code == 403 and r.json()["error"]["code"] == "session_forbidden"
            raw = WS(base)
            raw.send_raw('{"id": [1], "op": "ping"}')
            assert raw.recv_answer()["error"]["code"] == "invalid_message"
            raw.close()
            assert owner.step({"text": "the answer is 0"}).terminated
            assert oe.step({"text": "the answer is 0"}).done is True
            assert owner.state().step_count == 1
    finally:
        proc.terminate()
        proc.wait(15)
        log.close()
