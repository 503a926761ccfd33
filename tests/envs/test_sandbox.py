"""The sandbox contains fork bombs, infinite loops, memory bombs, writes outside its directory and
network connections, and reports each; output is truncated with a marker."""

import os
import socket
import sys
import threading
import uuid
from pathlib import Path

import pytest

from vriksha.envs.sandbox import SandboxError, run_sandboxed

PY = sys.executable


def run_py(code: str, **kw):
    kw.setdefault("timeout_s", 5)
    return run_sandboxed([PY, "-c", code], **kw)


def test_runs_in_private_dir_with_scrubbed_env(monkeypatch):
    monkeypatch.setenv("SECRET_TOKEN", "hunter2")
    r = run_py(
        "import os,sys; print(os.getcwd()); print(sorted(os.environ)); print(open('in.txt').read())",
        files={"in.txt": "hello"},
    )
    assert r.exit_code == 0, r.stderr
    cwd, env_keys, content = r.stdout.splitlines()[:3]
    assert "vriksha-sbx-" in cwd and content == "hello"
    assert "SECRET_TOKEN" not in env_keys
    assert not Path(cwd).exists()  # removed afterwards
    assert r.duration_s > 0 and not r.timed_out and r.limit_hit is None


def test_infinite_loop_is_killed_on_timeout():
    r = run_py("while True: pass", timeout_s=1.5, cpu_s=30)
    assert r.timed_out and r.limit_hit == "timeout"
    assert r.exit_code is not None and r.exit_code < 0
    assert r.duration_s < 10


def test_cpu_limit():
    r = run_py("while True: pass", timeout_s=60, cpu_s=1)
    assert not r.timed_out and r.limit_hit == "cpu"  # CPU seconds, not wall time (the machine may be busy)
    assert r.exit_code < 0


def test_memory_bomb_contained():
    r = run_py("x = bytearray(8 * 1024**3)", memory_mb=256)
    assert r.exit_code != 0 and r.limit_hit == "memory"
    assert "MemoryError" in r.stderr


def test_fork_bomb_contained_and_cleaned_up():
    marker = f"vriksha-fork-{uuid.uuid4().hex[:8]}"
    code = f"import os,time\n# {marker}\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        time.sleep(0.01)\n"
    r = run_py(code, timeout_s=2, max_procs=16)
    assert r.timed_out or r.limit_hit == "processes"
    # nothing of it survives
    survivors = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            if marker.encode() in Path(f"/proc/{pid}/cmdline").read_bytes():
                survivors.append(pid)
        except OSError:
            pass
    assert survivors == []


def test_fork_limit_reported():
    code = "import os,time\nfor _ in range(100):\n    if os.fork() == 0:\n        time.sleep(3)\n        os._exit(0)\n"
    r = run_py(code, max_procs=8)
    assert r.limit_hit == "processes", r.stderr


def test_write_outside_workdir_contained(tmp_path):
    outside = tmp_path / "escape.txt"
    tmp_path.chmod(0o777)
    r = run_py(f"open({str(outside)!r}, 'w').write('x')")
    assert not outside.exists()
    assert r.exit_code != 0
    assert "Permission denied" in r.stderr or "No such file" in r.stderr or "Read-only" in r.stderr
    r = run_py(
        "open('../escape.txt','w').write('x'); open('inside.txt','w').write('ok')", collect=["inside.txt"]
    )
    assert r.files.get("inside.txt") == b"ok"


def test_file_size_limit():
    r = run_py("open('big','wb').write(b'x' * (8 * 1024 * 1024))", max_file_mb=1)
    assert r.exit_code != 0 and r.limit_hit == "file_size"


def test_network_cut_off():
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(1)
    port = server.getsockname()[1]
    accepted = []
    server.settimeout(3)

    def accept():
        try:
            accepted.append(server.accept())
        except OSError:
            pass

    t = threading.Thread(target=accept)
    t.start()
    code = f"import socket; socket.create_connection(('127.0.0.1', {port}), timeout=2); print('connected')"
    r = run_py(code)
    server.shutdown(socket.SHUT_RDWR)  # wakes the accept() if nothing connected
    t.join()
    server.close()
    if not r.network_isolated:
        pytest.fail(
            "this platform refused a network namespace; the result reports it: network_isolated=False"
        )
    assert r.network_isolated and accepted == [] and "connected" not in r.stdout
    assert r.exit_code != 0 and ("unreachable" in r.stderr or "refused" in r.stderr)
    # allow_network lets it through (and says the network was not isolated)
    r2 = run_sandboxed([PY, "-c", "print('ok')"], allow_network=True)
    assert r2.exit_code == 0 and not r2.network_isolated


def test_output_truncated_with_marker():
    r = run_py("print('y' * 500000)", max_output_bytes=1000)
    assert r.truncated and "[truncated" in r.stdout and len(r.stdout) < 1100


def test_stdin_and_exit_code():
    r = run_sandboxed([PY, "-c", "import sys; d=sys.stdin.read(); print(d[::-1]); sys.exit(3)"], stdin="abc")
    assert r.exit_code == 3 and r.stdout.strip() == "cba" and not r.ok


def test_bad_file_paths_rejected():
    with pytest.raises(SandboxError):
        run_sandboxed([PY, "-c", "0"], files={"../x": "no"})
    with pytest.raises(SandboxError):
        run_sandboxed([])
