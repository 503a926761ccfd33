"""A tiny pytest plugin loaded into the project's venv (stdlib + pytest only).

Environment variables:
- VRIKSHA_R2E_OUT: write {"tests": {nodeid: {"outcome", "duration", "message"}}, "coverage": {...}} here.
- VRIKSHA_R2E_SELECT: a file of node ids, one a line: run only those (others are deselected).
- VRIKSHA_R2E_TRACE: a directory; record, per test, which functions defined under it were called
  (through sys.setprofile, call events only) as "relpath::qualname".
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time

import pytest

_OUT = os.environ.get("VRIKSHA_R2E_OUT")
_SELECT = os.environ.get("VRIKSHA_R2E_SELECT")
_TRACE = os.environ.get("VRIKSHA_R2E_TRACE")
_MAX_MSG = 4000

_results: dict[str, dict] = {}
_coverage: dict[str, list[str]] = {}
_current: set[str] | None = None
_code_keys: dict[object, str | None] = {}


def _key(code) -> str | None:
    try:
        return _code_keys[code]
    except KeyError:
        pass
    key = None
    fn = code.co_filename
    if _TRACE and fn.startswith(_TRACE):
        rel = os.path.relpath(fn, _TRACE)
        key = f"{rel}::{getattr(code, 'co_qualname', code.co_name)}"
    _code_keys[code] = key
    return key


def _profile(frame, event, arg):
    if event == "call" and _current is not None:
        key = _key(frame.f_code)
        if key is not None:
            _current.add(key)


def pytest_collection_modifyitems(session, config, items):
    if not _SELECT:
        return
    with open(_SELECT, encoding="utf-8") as fh:
        wanted = {line.rstrip("\n") for line in fh if line.strip()}
    keep = [it for it in items if it.nodeid in wanted]
    drop = [it for it in items if it.nodeid not in wanted]
    if drop:
        config.hook.pytest_deselected(items=drop)
    items[:] = keep


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    global _current
    if _TRACE:
        _current = set()
        sys.setprofile(_profile)
        threading.setprofile(_profile)
    try:
        yield
    finally:
        if _TRACE:
            sys.setprofile(None)
            threading.setprofile(None)
            _coverage[item.nodeid] = sorted(_current or ())
            _current = None


def pytest_runtest_logreport(report):
    rec = _results.setdefault(report.nodeid, {"outcome": "passed", "duration": 0.0, "message": ""})
    rec["duration"] += float(getattr(report, "duration", 0.0) or 0.0)
    if report.when == "call":
        if report.passed:
            outcome = "xpassed" if hasattr(report, "wasxfail") else "passed"
        elif report.skipped:
            outcome = "xfailed" if hasattr(report, "wasxfail") else "skipped"
        else:
            outcome = "failed"
        if rec["outcome"] == "passed":
            rec["outcome"] = outcome
    elif report.failed:
        rec["outcome"] = "error"
    elif report.skipped and report.when == "setup":
        rec["outcome"] = "xfailed" if hasattr(report, "wasxfail") else "skipped"
    if report.failed and not rec["message"]:
        try:
            rec["message"] = str(report.longreprtext)[-_MAX_MSG:]
        except Exception:
            rec["message"] = "failed"


def pytest_collectreport(report):
    if report.failed:
        _results[report.nodeid or "<collection>"] = {
            "outcome": "collection_error",
            "duration": 0.0,
            "message": str(report.longreprtext)[-_MAX_MSG:],
        }


def pytest_sessionfinish(session, exitstatus):
    if not _OUT:
        return
    payload = {"tests": _results, "coverage": _coverage, "exitstatus": int(exitstatus), "time": time.time()}
    tmp = _OUT + ".tmp"
    with open(tmp, "w", encoding="utf-8") as fh:
        json.dump(payload, fh)
    os.replace(tmp, _OUT)
