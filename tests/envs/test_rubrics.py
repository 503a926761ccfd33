"""Rubrics: named components with weights; sums, gates, sequences, trajectories; reward vs success."""

import pytest

from vriksha.envs.rubrics import Criterion, Gate, Sequence, TrajectoryRubric, WeightedSum

correct = Criterion("correct", lambda ep, a: a == ep)
fmt = Criterion("format", lambda ep, a: a.startswith("A:") if isinstance(a, str) else False)
short = Criterion("short", lambda ep, a: len(str(a)) < 10)


def test_criterion_values_and_errors_score_zero():
    s = correct("A:1", "A:1")
    assert (s.total, s.components, s.success) == (1.0, {"correct": 1.0}, True)
    boom = Criterion("boom", lambda ep, a: 1 / 0)
    assert boom(None, None).total == 0.0  # a crashing criterion never crashes the rollout
    nan = Criterion("nan", lambda ep, a: float("nan"))
    assert nan(None, None).total == 0.0
    partial = Criterion("frac", lambda ep, a: 0.5, threshold=0.5)
    assert partial(None, None).success


def test_weighted_sum_and_success_source():
    r = WeightedSum({"correct": (correct, 0.8), "format": (fmt, 0.2)}, success="correct")
    s = r("A:1", "A:1")
    assert s.total == pytest.approx(1.0) and s.success
    s = r("A:1", "A:2")
    assert s.total == pytest.approx(0.2) and not s.success and s.components == {"correct": 0.0, "format": 1.0}
    with pytest.raises(ValueError, match="success"):
        WeightedSum({"correct": (correct, 1.0)}, success="nope")
    with pytest.raises(ValueError, match="twice"):
        WeightedSum({"a": (correct, 1.0), "b": (Criterion("correct", lambda e, a: 0.5), 1.0)})("x", "x")


def test_gate_zeroes_but_reports():
    r = Gate(short, WeightedSum({"correct": (correct, 1.0)}))
    assert r("A:1", "A:1").total == 1.0
    long = "A:" + "1" * 20
    s = r(long, long)
    assert s.total == 0.0 and not s.success and s.components == {"short": 0.0, "correct": 1.0}


def test_sequence_stops_at_first_failure():
    ran = []
    expensive = Criterion("tests", lambda ep, a: ran.append(a) or 1.0)
    r = Sequence([(fmt, 0.1, 1.0), (expensive, 0.9, 1.0)])
    s = r(None, "A:ok")
    assert s.total == pytest.approx(1.0) and s.success and ran == ["A:ok"]
    s = r(None, "nope")
    assert s.total == 0.0 and s.components == {"format": 0.0, "tests": 0.0} and ran == ["A:ok"]


def test_trajectory_rubric_gate_and_shaping():
    used_tool = Criterion("used_tool", lambda ep, traj: any(a.startswith("CALL") for a in traj[:-1]))
    brevity = Criterion("brevity", lambda ep, traj: 1.0 if len(traj) <= 3 else 0.0)
    r = TrajectoryRubric(
        final=correct,
        shaping={"used_tool": (used_tool, 0.0), "brevity": (brevity, 0.2)},
        final_weight=0.8,
        gate="used_tool",
    )
    s = r("42", ["CALL 6*7", "42"])
    assert s.total == pytest.approx(1.0) and s.success
    assert s.components == {"correct": 1.0, "used_tool": 1.0, "brevity": 1.0}
    s = r("42", ["42"])  # right answer, no tool: the gate closes
    assert s.total == 0.0 and not s.success
    s = r("42", ["CALL a", "CALL b", "CALL c", "42"])
    assert s.total == pytest.approx(0.8)
