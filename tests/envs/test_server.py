"""The environment server on a real loopback port, driven by raw WebSocket and HTTP clients."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from typing import Any

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from websockets.exceptions import ConnectionClosed
from websockets.sync.client import connect

from vriksha.envs.core import Environment, Observation, StepResult, Tool
from vriksha.envs.server import EnvServerConfig, ServerThread, create_app
from vriksha.net.launch import free_port

pytestmark = pytest.mark.timeout(120)


class CounterEnv(Environment):
    """Counts steps; `slow` sleeps, `boom` raises, anything else echoes."""

    name = "counter"
    max_turns = 1000

    def _reset(self, seed: int, options: dict[str, Any]) -> Observation:
        self.total = 0
        return Observation(text=f"seed={seed}")

    def _step(self, action: Any) -> StepResult:
        if action.text == "slow":
            time.sleep(1.0)
        if action.text == "boom":
            raise RuntimeError("kaboom")
        self.total += 1
        return StepResult(
            observation=Observation(text=f"{action.text}#{self.total}"),
            reward=1.0,
            info={"reward_components": {"count": 1.0}, "success": True},
        )

    def tools(self) -> list[Tool]:
        return [Tool("total", "Steps so far.", {"type": "object", "properties": {}}, lambda: self.total)]


class WS:
    """A bare WebSocket session: sends requests, collects answers by id, records events."""

    def __init__(self, url: str, query: str = "", token: str | None = None) -> None:
        headers = {"X-Vriksha-Resume-Token": token} if token else None
        self.ws = connect(url.replace("http://", "ws://") + "/v1/ws" + query, additional_headers=headers)
        self.hello = json.loads(self.ws.recv(timeout=10))
        self.events: list[dict[str, Any]] = []

    def send_raw(self, text: str) -> None:
        self.ws.send(text)

    def recv_answer(self, timeout: float = 10) -> dict[str, Any]:
        while True:
            msg = json.loads(self.ws.recv(timeout=timeout))
            if "event" in msg:
                self.events.append(msg)
                continue
            return msg

    def ask(self, rid: Any, op: str, **fields: Any) -> dict[str, Any]:
        self.ws.send(json.dumps({"id": rid, "op": op, **fields}))
        answer = self.recv_answer()
        assert answer["id"] == rid
        return answer

    def close(self) -> None:
        """A clean goodbye (`close` op), which frees the session at once."""
        try:
            self.ws.send('{"id": "bye", "op": "close"}')
        except ConnectionClosed:
            pass
        self.ws.close()


@pytest.fixture(scope="module")
def url():
    app = create_app(
        CounterEnv, EnvServerConfig(max_sessions=16, heartbeat_s=0.2, idle_timeout_s=60, detach_grace_s=2.0)
    )
    with ServerThread(app) as base:
        yield base


def test_health_metadata_schema(url):
    assert httpx.get(url + "/health").json()["status"] == "healthy"
    meta = httpx.get(url + "/metadata").json()
    assert meta["name"] == "counter"
    assert meta["server"]["max_sessions"] == 16  # the cap is reported up front
    assert meta["server"]["endpoints"]["websocket"] == "/v1/ws"
    schema = httpx.get(url + "/schema").json()
    assert schema["action"]["required"] == ["text"]
    assert {"observation", "state", "step_result", "protocol"} <= set(schema)
    assert "capacity_reached" in schema["protocol"]["error_codes"]


def test_hello_ids_echoed_and_episode_flow(url):
    s = WS(url)
    try:
        assert s.hello["event"] == "hello" and s.hello["max_sessions"] == 16 and s.hello["session_id"]
        r = s.ask("a-1", "reset", seed=7)
        assert r["ok"] and r["result"]["observation"]["text"] == "seed=7"
        assert r["result"]["observation"]["tools"][0]["name"] == "total"
        r = s.ask(42, "step", action={"text": "hi"})  # integer ids work too
        assert r["ok"] and r["result"]["observation"]["text"] == "hi#1"
        assert r["result"]["info"]["reward_components"] == {"count": 1.0}
        assert s.ask("st", "state")["result"]["step_count"] == 1
        assert s.ask("t", "call_tool", name="total", arguments={})["result"] == {"output": "1"}
        assert s.ask("p", "ping")["result"]["pong"] > 0
        # pipelined requests come back in order, each with its own id
        for i in range(5):
            s.send_raw(json.dumps({"id": f"p{i}", "op": "step", "action": {"text": "x"}}))
        assert [s.recv_answer()["id"] for _ in range(5)] == [f"p{i}" for i in range(5)]
        assert s.ask("c", "close")["result"] == {"closed": True}
    finally:
        s.close()


def test_heartbeats_flow_without_requests(url):
    s = WS(url)
    try:
        time.sleep(0.7)
        s.ask(1, "ping")
        beats = [e for e in s.events if e["event"] == "heartbeat"]
        assert len(beats) >= 2 and all(b["t"] > 0 for b in beats)
    finally:
        s.close()


def test_bad_messages_get_clear_errors_and_the_session_survives(url):
    s, other = WS(url), WS(url)
    try:
        s.ask(0, "reset", seed=1)
        other.ask(0, "reset", seed=2)
        s.send_raw("{not json")
        err = s.recv_answer()
        assert err["id"] is None and err["error"]["code"] == "invalid_json"
        s.send_raw('["a list"]')
        assert s.recv_answer()["error"]["code"] == "invalid_message"
        s.send_raw('{"op": "step", "action": {"text": "x"}}')
        missing = s.recv_answer()
        assert missing["error"]["code"] == "invalid_message" and "'id'" in missing["error"]["message"]
        assert s.ask(1, "dance")["error"]["code"] == "unknown_op"
        bad = s.ask(2, "step", action={"txt": "x"})
        assert bad["error"]["code"] == "invalid_action" and "text" in bad["error"]["message"]
        assert s.ask(3, "step")["error"]["code"] == "invalid_message"
        assert s.ask(4, "call_tool", name="nope")["error"]["code"] == "tool_error"
        boom = s.ask(5, "step", action={"text": "boom"})
        assert boom["error"]["code"] == "env_error" and "kaboom" in boom["error"]["message"]
        # the same session still works, and the other session never noticed
        assert s.ask(6, "step", action={"text": "ok"})["ok"]
        assert other.ask(1, "step", action={"text": "fine"})["result"]["observation"]["text"] == "fine#1"
    finally:
        s.close()
        other.close()


def _reject(name: str) -> None:
    raise ValueError(f"{name} is not JSON")


_json = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda kids: st.lists(kids, max_size=4) | st.dictionaries(st.text(max_size=8), kids, max_size=4),
    max_leaves=12,
)
_requests = st.fixed_dictionaries(
    {},
    optional={
        "id": st.one_of(
            st.text(max_size=8), st.integers(), st.none(), st.booleans(), st.lists(st.integers())
        ),
        "op": st.one_of(
            st.sampled_from(["reset", "step", "state", "tools", "call_tool", "ping"]), st.text(max_size=8)
        ),
        "action": _json,
        "seed": _json,
        "options": _json,
        "name": _json,
        "arguments": _json,
    },
)


@pytest.fixture(scope="module")
def fuzz_ws(url):
    s = WS(url)  # one session takes every example
    yield s
    s.close()


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(payload=st.one_of(_requests.map(json.dumps), st.text(max_size=40), _json.map(json.dumps)))
def test_fuzzed_messages_get_an_answer_or_error_and_never_break_the_session(fuzz_ws, payload):
    s = fuzz_ws
    s.send_raw(payload)
    try:  # strict JSON, as the server reads it: no NaN or Infinity
        msg = json.loads(payload, parse_constant=_reject)
    except ValueError:
        msg = None
    if not (isinstance(msg, dict) and msg.get("op") == "ping" and msg.get("id") is None):
        answer = s.recv_answer()  # everything but an id-less ping is answered
        assert answer["ok"] or answer["error"]["code"] in {
            "invalid_json",
            "invalid_message",
            "unknown_op",
            "invalid_action",
            "episode_state",
            "tool_error",
        }, answer
    assert s.ask("probe", "ping")["ok"]  # the session is still healthy


def test_slow_session_does_not_block_others(url):
    slow, fast = WS(url), WS(url)
    try:
        slow.ask(0, "reset", seed=0)
        fast.ask(0, "reset", seed=0)
        slow.send_raw(json.dumps({"id": "s", "op": "step", "action": {"text": "slow"}}))
        time.sleep(0.05)
        t0 = time.perf_counter()
        for i in range(20):
            assert fast.ask(i + 1, "step", action={"text": "f"})["ok"]
        assert time.perf_counter() - t0 < 0.8  # the slow step takes 1 s and runs in its own thread
        assert slow.recv_answer()["id"] == "s"
    finally:
        slow.close()
        fast.close()


def test_capacity_cap_reported_and_enforced():
    app = create_app(CounterEnv, EnvServerConfig(max_sessions=2, heartbeat_s=5))
    with ServerThread(app) as base:
        a, b = WS(base), WS(base)
        try:
            assert b.hello["active_sessions"] == 2 and b.hello["max_sessions"] == 2
            ws = connect(base.replace("http://", "ws://") + "/v1/ws")
            msg = json.loads(ws.recv(timeout=10))
            assert msg["event"] == "error" and msg["error"]["code"] == "capacity_reached"
            assert msg["error"]["max_sessions"] == 2 and "--max-sessions" in msg["error"]["message"]
            with pytest.raises(ConnectionClosed):
                ws.recv(timeout=5)
            assert ws.close_code == 1013
            r = httpx.post(base + "/v1/sessions")
            assert r.status_code == 503 and r.json()["error"]["code"] == "capacity_reached"
            # the sessions that exist are unaffected, and closing one frees a slot
            assert a.ask(1, "reset", seed=0)["ok"]
            assert b.ask(1, "close")["ok"]
            time.sleep(0.2)
            assert httpx.post(base + "/v1/sessions").status_code == 201
        finally:
            a.close()
            b.close()


def test_http_session_api(url):
    with httpx.Client(base_url=url) as http:
        made = http.post("/v1/sessions")
        assert made.status_code == 201 and made.json()["max_sessions"] == 16
        sid = made.json()["session_id"]
        http.headers["X-Vriksha-Resume-Token"] = made.json()["resume_token"]
        early = http.post(f"/v1/sessions/{sid}/step", json={"action": {"text": "x"}})
        assert early.status_code == 409 and early.json()["error"]["code"] == "episode_state"
        r = http.post(f"/v1/sessions/{sid}/reset", json={"seed": 3})
        assert r.status_code == 200 and r.json()["observation"]["text"] == "seed=3"
        r = http.post(f"/v1/sessions/{sid}/step", json={"action": {"text": "a"}})
        assert r.json()["observation"]["text"] == "a#1" and r.json()["reward"] == 1.0
        assert http.get(f"/v1/sessions/{sid}/state").json()["step_count"] == 1
        assert http.get(f"/v1/sessions/{sid}/tools").json()[0]["name"] == "total"
        assert http.post(f"/v1/sessions/{sid}/tools/total", json={}).json() == {"output": "1"}
        bad = http.post(f"/v1/sessions/{sid}/step", json={"action": {"nope": 1}})
        assert bad.status_code == 422 and bad.json()["error"]["code"] == "invalid_action"
        assert (
            http.post(f"/v1/sessions/{sid}/step", content=b"{oops").json()["error"]["code"] == "invalid_json"
        )
        assert http.post(f"/v1/sessions/{sid}/reset", json={"seed": -1}).status_code == 400
        assert http.delete(f"/v1/sessions/{sid}").json()["closed"] is True
        gone = http.post(f"/v1/sessions/{sid}/step", json={"action": {"text": "a"}})
        assert gone.status_code == 404 and gone.json()["error"]["code"] == "unknown_session"


def test_idle_sessions_are_reaped():
    app = create_app(
        CounterEnv, EnvServerConfig(max_sessions=4, idle_timeout_s=0.6, heartbeat_s=5, detach_grace_s=0.3)
    )
    with ServerThread(app) as base:
        sid = httpx.post(base + "/v1/sessions").json()["session_id"]
        s = WS(base)
        s.ask(0, "reset", seed=0)
        dropped = WS(base)
        dropped.ws.close()  # gone without "close": resumable for detach_grace_s, then reaped
        time.sleep(1.5)
        r = httpx.post(f"{base}/v1/sessions/{sid}/reset", json={})
        assert r.status_code == 404 and "reaped" in r.json()["error"]["message"]
        assert httpx.get(base + "/health").json()["active_sessions"] == 0
        with pytest.raises(ConnectionClosed):  # the idle WebSocket was told and closed
            s.recv_answer(timeout=2)
        assert any(e["event"] == "closing" and e["reason"] == "idle" for e in s.events)
        ws = connect(base.replace("http://", "ws://") + "/v1/ws?session=" + dropped.hello["session_id"])
        assert json.loads(ws.recv(timeout=10))["error"]["code"] == "unknown_session"
        ws.close()


def test_resume_after_drop_and_resend_is_not_run_twice(url):
    s = WS(url)
    sid = s.hello["session_id"]
    s.ask(0, "reset", seed=5)
    s.ask("once", "step", action={"text": "a"})
    s.ws.close()  # the connection drops without "close"
    time.sleep(0.1)
    again = WS(url, f"?session={sid}", token=s.hello["resume_token"])
    try:
        assert again.hello["resumed"] is True and again.hello["session_id"] == sid
        replay = again.ask("once", "step", action={"text": "a"})  # a re-send after reconnecting
        assert replay["result"]["observation"]["text"] == "a#1"
        assert again.ask(1, "state")["result"]["step_count"] == 1  # the step ran once
        assert again.ask(2, "step", action={"text": "b"})["result"]["observation"]["text"] == "b#2"
    finally:
        again.ask(3, "close")
        again.close()
    ws = connect(url.replace("http://", "ws://") + "/v1/ws?session=" + sid)
    msg = json.loads(ws.recv(timeout=10))
    assert msg["event"] == "error" and msg["error"]["code"] == "unknown_session"
    ws.close()


def test_resume_takes_over_a_stale_connection(url):
    old = WS(url)
    sid = old.hello["session_id"]
    old.ask(0, "reset", seed=1)
    old.send_raw(json.dumps({"id": "slow", "op": "step", "action": {"text": "slow"}}))
    time.sleep(0.1)  # the step is running when the client gives up on this connection
    new = WS(url, f"?session={sid}", token=old.hello["resume_token"])
    try:
        assert new.hello["resumed"] is True
        # re-sending the in-flight request waits for it instead of running it again
        assert new.ask("slow", "step", action={"text": "slow"})["result"]["observation"]["text"] == "slow#1"
        assert new.ask(1, "state")["result"]["step_count"] == 1
        with pytest.raises(ConnectionClosed):
            old.recv_answer(timeout=5)
        assert any(e["event"] == "closing" for e in old.events)
    finally:
        new.ask(2, "close")
        new.close()


@pytest.mark.slow
def test_cli_serves_arithmetic_in_a_subprocess():
    port = free_port()
    env = {**os.environ, "PYTHONPATH": os.getcwd() + os.pathsep + os.environ.get("PYTHONPATH", "")}
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "vriksha.cli",
            "env",
            "serve",
            "arithmetic",
            "--port",
            str(port),
            "--max-sessions",
            "3",
        ],
        env=env,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        base = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 60
        while True:
            assert proc.poll() is None, proc.stderr.read() if proc.stderr else ""
            try:
                if httpx.get(base + "/health", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline, "server did not start"
            time.sleep(0.2)
        assert httpx.get(base + "/metadata").json()["server"]["max_sessions"] == 3
        s = WS(base)
        first = s.ask(1, "reset", seed=11)["result"]["observation"]["text"]
        assert first and s.ask(2, "reset", seed=11)["result"]["observation"]["text"] == first
        scored = s.ask(3, "step", action={"text": "the answer is 0"})["result"]
        assert 0.0 <= scored["reward"] <= 1.0 and "correct" in scored["components"]
        assert scored["terminated"] is True
        s.close()
    finally:
        proc.terminate()
        proc.wait(15)


def test_many_concurrent_sessions_are_isolated():
    errors: list[BaseException] = []
    server = ServerThread(create_app(CounterEnv, EnvServerConfig(max_sessions=8)))
    url = server.start()

    def one(seed: int) -> None:
        try:
            s = WS(url)
            s.ask(0, "reset", seed=seed)
            for i in range(1, 11):
                text = s.ask(i, "step", action={"text": str(seed)})["result"]["observation"]["text"]
                assert text == f"{seed}#{i}"
            s.ask("c", "close")
            s.close()
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=one, args=(k,)) for k in range(5)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    server.stop()
    assert not errors, errors
