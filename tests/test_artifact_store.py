"""The first load on a machine says once that it compiles and times its paths; a cached choice says nothing."""

import logging

import vriksha.artifact_store
from vriksha.engine.platform import compute_dtype


def test_the_first_uncached_timing_is_announced_once(tmp_path, monkeypatch, caplog):
    monkeypatch.setenv("VRIKSHA_CACHE", str(tmp_path))
    monkeypatch.setattr(vriksha.artifact_store, "_announced", False)
    shapes = [compute_dtype.LinearShape(64, 64, count=2)]
    with caplog.at_level(logging.WARNING, logger="vriksha.artifact_store"):
        first = compute_dtype.choose_dtype(shapes, "cpu")
        vriksha.artifact_store.announce_first_load()
    announced = [r for r in caplog.records if "compiling and timing" in r.getMessage()]
    assert first.how == "measured" and len(announced) == 1
    assert str(tmp_path) in announced[0].getMessage()

    monkeypatch.setattr(vriksha.artifact_store, "_announced", False)
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="vriksha.artifact_store"):
        again = compute_dtype.choose_dtype(shapes, "cpu")
    assert again.how == "cached" and again.dtype == first.dtype
    assert not [r for r in caplog.records if "compiling and timing" in r.getMessage()]
