"""Environments in other packages are found through `vriksha.environments` entry points; the registry
names no package above it."""

import inspect
import logging
import sys
import textwrap
import threading
import tomllib
import types
from pathlib import Path

import pytest

from vriksha.envs import registry
from vriksha.envs.registry import ENTRY_POINT_GROUP, get_env_class, list_envs, unregister_env

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def plugin_dist(tmp_path, monkeypatch):
    """A real installed distribution on sys.path: a dist-info with entry points, and its module."""
    (tmp_path / "plugged_envs.py").write_text(
        textwrap.dedent(
            """
            from vriksha.envs import Environment, Observation, StepResult

            class PluggedEnv(Environment):
                name = "test_plugged"

                def _reset(self, seed, options):
                    return Observation(text=f"plugged {seed}")

                def _step(self, action):
                    return StepResult(observation=Observation(), terminated=True, success=True)
            """
        )
    )
    info = tmp_path / "plugged_envs-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: plugged-envs\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(
        f"[{ENTRY_POINT_GROUP}]\ntest_plugged = plugged_envs:PluggedEnv\ntest_broken = no_such_module_here:Env\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    yield
    for name in ("test_plugged", "test_broken"):
        unregister_env(name)
    registry._loaded.difference_update({k for k in registry._loaded if "plugged_envs" in k or "no_such" in k})


def test_an_entry_point_environment_is_found_by_name_and_listed(plugin_dist, caplog):
    cls = get_env_class("test_plugged")
    assert cls.__module__ == "plugged_envs" and cls().reset(seed=4).observation.text == "plugged 4"
    with caplog.at_level(logging.WARNING, logger="vriksha.envs.registry"):
        names = list_envs()  # the broken entry point is reported, the others still listed
    assert "test_plugged" in names and "arithmetic" in names and "test_broken" not in names
    assert any("no_such_module_here" in r.getMessage() for r in caplog.records)


def test_the_repo_environment_is_declared_as_an_entry_point_not_named_by_the_registry():
    declared = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["entry-points"][
        ENTRY_POINT_GROUP
    ]
    module, _, attr = declared["repo"].partition(":")
    cls = get_env_class(f"{module}:{attr}")
    assert cls.name == "repo"
    assert "repo2env" not in inspect.getsource(registry)


def test_a_second_thread_waits_for_the_provider_the_first_is_importing(tmp_path, monkeypatch):
    """While one thread imports a provider (slowly), another looking up the same environment waits for it
    instead of finding the module marked loaded and the registry still without the name."""
    gate = types.ModuleType("slow_env_gate")
    gate.importing, gate.release = threading.Event(), threading.Event()
    monkeypatch.setitem(sys.modules, "slow_env_gate", gate)
    (tmp_path / "slow_envs.py").write_text(
        textwrap.dedent(
            """
            import slow_env_gate
            from vriksha.envs import Environment, Observation, StepResult, register_env

            slow_env_gate.importing.set()
            slow_env_gate.release.wait(10)

            @register_env
            class SlowEnv(Environment):
                name = "test_slow_import"

                def _reset(self, seed, options):
                    return Observation(text="slow")

                def _step(self, action):
                    return StepResult(observation=Observation(), terminated=True, success=True)
            """
        )
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("VRIKSHA_ENV_MODULES", "slow_envs")
    found: dict[str, object] = {}

    def look_up(who: str) -> None:
        try:
            found[who] = get_env_class("test_slow_import").name
        except Exception as exc:  # recorded, then asserted on
            found[who] = exc

    first = threading.Thread(target=look_up, args=("first",))
    second = threading.Thread(target=look_up, args=("second",))
    try:
        first.start()
        assert gate.importing.wait(10), "the provider module was never imported"
        second.start()
        second.join(1.0)  # without the lock it fails at once; with it, it waits for the import
        gate.release.set()
        first.join(10)
        second.join(10)
        assert found == {"first": "test_slow_import", "second": "test_slow_import"}
    finally:
        gate.release.set()
        for t in (first, second):
            if t.ident is not None:
                t.join(10)
        unregister_env("test_slow_import")
        registry._loaded.discard("slow_envs")
        sys.modules.pop("slow_envs", None)
