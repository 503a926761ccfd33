"""`EnvClient` / `AsyncEnvClient` against a real server: typed results, errors, timeouts, reconnect."""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from typing import Any

import pytest

from vriksha.envs.client import AsyncEnvClient, EnvClient
from vriksha.envs.core import Environment, Observation, State, StepResult, Tool, ToolSpec
from vriksha.envs.protocol import EnvConnectionError, RemoteEnvError
from vriksha.envs.server import EnvServerConfig, ServerThread, create_app
from vriksha.net.launch import free_port

pytestmark = pytest.mark.timeout(120)


class TallyEnv(Environment):
    name = "tally"
    max_turns = 100

    def _reset(self, seed: int, options: dict[str, Any]) -> Observation:
        self.n = 0
        return Observation(text=f"start {seed}")

    def _step(self, action: Any) -> StepResult:
        if action.text.startswith("sleep"):
            time.sleep(float(action.text.split()[1]))
        self.n += 1
        return StepResult(
            observation=Observation(text=f"{action.text}:{self.n}"),
            reward=0.25,
            info={"reward_components": {"a": 0.25}, "success": False},
        )

    def tools(self) -> list[Tool]:
        return [Tool("count", "Steps so far.", {"type": "object", "properties": {}}, lambda: self.n)]


@pytest.fixture(scope="module")
def url():
    with ServerThread(create_app(TallyEnv, EnvServerConfig(max_sessions=12, heartbeat_s=0.3))) as base:
        yield base


def test_sync_client_typed_api(url):
    with EnvClient(url) as env:
        assert env.hello["max_sessions"] == 12 and env.session_id
        first = env.reset(seed=2)
        assert isinstance(first, StepResult) and first.observation.text == "start 2"
        out = env.step({"text": "go"})
        assert out.observation.text == "go:1" and out.reward == 0.25 and not out.done
        assert out.info["reward_components"] == {"a": 0.25}
        state = env.state()
        assert isinstance(state, State) and state.step_count == 1 and state.seed == 2
        assert env.tools() == [
            ToolSpec(
                name="count", description="Steps so far.", parameters={"type": "object", "properties": {}}
            )
        ]
        assert env.call_tool("count") == "1"
        assert env.ping() > 0


def test_remote_errors_carry_codes(url):
    with EnvClient(url) as env:
        with pytest.raises(RemoteEnvError) as err:
            env.step({"text": "too early"})
        assert err.value.code == "episode_state"
        env.reset(seed=0)
        with pytest.raises(RemoteEnvError) as err:
            env.step({"text": 5})
        assert err.value.code == "invalid_action" and "text" in err.value.remote_message
        assert env.step({"text": "fine"}).observation.text == "fine:1"


def test_timeout_never_desynchronises_answers(url):
    with EnvClient(url, request_timeout_s=0.3) as env:
        env.reset(seed=0)
        with pytest.raises(TimeoutError):
            env.step({"text": "sleep 0.8"})
        # the late answer to the timed-out step arrives first, but carries the old id: it is dropped
        env.aclient.request_timeout_s = 5.0
        state = env.state()
        assert isinstance(state, State) and state.step_count == 1
        assert env.step({"text": "next"}).observation.text == "next:2"


def test_async_clients_run_concurrently_and_in_isolation(url):
    async def one(seed: int) -> list[str]:
        async with AsyncEnvClient(url) as env:
            await env.reset(seed=seed)
            return [(await env.step({"text": str(seed)})).observation.text for _ in range(5)]

    async def main() -> list[list[str]]:
        return await asyncio.gather(*(one(s) for s in range(8)))

    for seed, texts in enumerate(asyncio.run(main())):
        assert texts == [f"{seed}:{i}" for i in range(1, 6)]


def test_capacity_error_surfaces():
    with ServerThread(create_app(TallyEnv, EnvServerConfig(max_sessions=1))) as base:
        with EnvClient(base):
            other = EnvClient(base)
            with pytest.raises(RemoteEnvError) as err:
                other.connect()
            assert err.value.code == "capacity_reached" and err.value.details["max_sessions"] == 1
            other.close()


def test_connection_refused_is_clear():
    env = EnvClient(f"http://127.0.0.1:{free_port()}", connect_timeout_s=2, reconnect_attempts=0)
    with pytest.raises(EnvConnectionError, match="cannot connect"):
        env.reset()
    env.close()


class Proxy:
    """A loopback TCP proxy whose live connections can be cut, to simulate a network drop."""

    def __init__(self, target_port: int) -> None:
        self.target = target_port
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.conns: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            upstream = socket.create_connection(("127.0.0.1", self.target))
            self.conns += [client, upstream]
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pipe, args=(a, b), daemon=True).start()

    @staticmethod
    def _pipe(src: socket.socket, dst: socket.socket) -> None:
        try:
            while data := src.recv(65536):
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def cut(self) -> None:
        for s in self.conns:
            try:
                s.shutdown(socket.SHUT_RDWR)
                s.close()
            except OSError:
                pass
        self.conns.clear()

    def close(self) -> None:
        self.cut()
        self.listener.close()


def test_reconnect_resumes_the_same_session_after_a_drop(url):
    proxy = Proxy(int(url.rsplit(":", 1)[1]))
    try:
        with EnvClient(f"http://127.0.0.1:{proxy.port}", reconnect_backoff_s=0.05) as env:
            sid = env.session_id
            env.reset(seed=4)
            env.step({"text": "a"})
            proxy.cut()
            time.sleep(0.2)
            out = env.step({"text": "b"})  # reconnects, resumes, and runs the step once
            assert out.observation.text == "b:2"
            assert env.session_id == sid and env.aclient.reconnects == 1
            assert env.state().step_count == 2
    finally:
        proxy.close()


def test_server_heartbeats_keep_last_seen_fresh(url):
    with EnvClient(url) as env:
        env.reset(seed=0)
        before = env.aclient.last_seen
        time.sleep(0.8)
        assert env.aclient.last_seen > before  # heartbeats arrived with no request in flight


def test_client_against_builtin_arithmetic():
    from vriksha.envs.builtin import ArithmeticEnv

    with ServerThread(create_app(ArithmeticEnv, EnvServerConfig(max_sessions=2))) as base:
        with EnvClient(base) as env:
            prompt = env.reset(seed=5, options={"split": "test"}).observation.text
            assert prompt and env.reset(seed=5, options={"split": "test"}).observation.text == prompt
            out = env.step({"text": "garbage"})
            assert out.terminated and out.reward == 0.0 and out.success is False


class BoardObservation(Observation):
    board: list[int] = []


class BoardEnv(TallyEnv):
    name = "board"
    observation_type = BoardObservation

    def _reset(self, seed: int, options: dict[str, Any]) -> Observation:
        self.n = 0
        return BoardObservation(text="board", board=[seed, seed + 1])


def test_observation_subclass_fields_reach_the_client():
    with ServerThread(create_app(BoardEnv, EnvServerConfig(max_sessions=2))) as base:
        with EnvClient(base, observation_type=BoardObservation) as env:
            first = env.reset(seed=3)
            assert isinstance(first.observation, BoardObservation) and first.observation.board == [3, 4]


def test_a_reaped_session_is_reported_clearly():
    config = EnvServerConfig(max_sessions=2, idle_timeout_s=0.5, heartbeat_s=30, detach_grace_s=0.5)
    with ServerThread(create_app(TallyEnv, config)) as base:
        with EnvClient(base, reconnect_backoff_s=0.05) as env:
            env.reset(seed=0)
            time.sleep(1.5)  # no request and no heartbeat within the idle timeout
            with pytest.raises(EnvConnectionError, match="idle"):
                env.step({"text": "late"})
