"""The child-process launcher under `vriksha fleet`, the benchmarks and the test harnesses: ready on its health
URL, a clear error naming the child when it dies or never answers, and a stop that kills what ignores SIGTERM."""

from __future__ import annotations

import sys
import time

import pytest

from vriksha.net.launch import Child, StartupError, free_port, stop_all, vriksha_command

HEALTHY = """
import http.server, sys
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200 if self.path == "/health" else 404)
        self.end_headers()
    def log_message(self, *a):
        pass
print("serving", flush=True)
http.server.HTTPServer(("127.0.0.1", int(sys.argv[1])), H).serve_forever()
"""
DEAF = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); print('deaf', flush=True); time.sleep(60)"


def test_vriksha_command_names_this_interpreter_and_the_log_level() -> None:
    assert vriksha_command("serve", "--port", "1") == [
        sys.executable,
        "-m",
        "vriksha.cli",
        "serve",
        "--port",
        "1",
    ]
    assert vriksha_command("router", log_level="INFO")[3:] == ["--log-level", "INFO", "router"]


def test_a_child_is_ready_on_its_health_url_and_stops_on_sigterm(tmp_path) -> None:
    port = free_port()
    child = Child(
        [sys.executable, "-c", HEALTHY, str(port)],
        "web",
        f"http://127.0.0.1:{port}/health",
        log_path=tmp_path / "web.log",
    ).start()
    try:
        child.wait_healthy(30)
        assert child.proc is not None and child.proc.poll() is None
        assert "serving" in child.log_tail()
    finally:
        child.stop(10)
    assert child.proc.returncode is not None


def test_a_child_that_exits_during_startup_is_named_with_its_log(tmp_path) -> None:
    code = "import sys; print('no model here', flush=True); sys.exit(3)"
    child = Child(
        [sys.executable, "-c", code], "replica 0", "http://127.0.0.1:9/health", log_path=tmp_path / "r.log"
    )
    child.start()
    with pytest.raises(
        StartupError, match=r"replica 0 exited with status 3 during startup:\n(.|\n)*no model here"
    ):
        child.wait_healthy(30)
    child.stop()


def test_a_child_that_never_answers_times_out_with_the_hint(tmp_path) -> None:
    child = Child(
        [sys.executable, "-c", "import time; time.sleep(30)"], "router", f"http://127.0.0.1:{free_port()}/h"
    )
    child.start()
    try:
        with pytest.raises(StartupError, match=r"router was not healthy after 1 s; raise --startup-timeout$"):
            child.wait_healthy(1.0, hint="; raise --startup-timeout")
    finally:
        child.stop(5)


def test_stop_all_kills_a_child_that_ignores_sigterm(tmp_path) -> None:
    deaf = Child(
        [sys.executable, "-c", DEAF], "deaf", "http://127.0.0.1:9/health", log_path=tmp_path / "d.log"
    )
    deaf.start()
    deadline = time.monotonic() + 30
    while "deaf" not in deaf.log_tail() and time.monotonic() < deadline:  # SIGTERM is ignored from here on
        time.sleep(0.05)
    stop_all([deaf], timeout_s=0.5)
    assert deaf.proc is not None and deaf.proc.returncode == -9


def test_free_ports_lie_below_the_ephemeral_range_and_never_repeat():
    """Outgoing connections take their source ports from the ephemeral range, so a port picked there could be
    taken before the server binds it; and two picks in one process must differ."""
    from vriksha.net import launch

    start = launch._ephemeral_start()
    ports = [free_port() for _ in range(100)]
    assert len(set(ports)) == len(ports)
    if start > launch._PORTS_FROM + 1000:
        assert all(launch._PORTS_FROM <= p < start for p in ports), (start, sorted(ports)[-3:])
