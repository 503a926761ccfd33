"""Checkpoint integrity in-process: manifests written at save, corrupt and partial checkpoints named
and skipped, a bad `latest` pointer repaired, a checkpoint from an older version still resumed."""

from __future__ import annotations

import json
import logging
import shutil
from pathlib import Path

import pytest
import torch

from vriksha.train.checkpoint import (
    CheckpointError,
    find_checkpoint,
    latest_checkpoint,
    load_checkpoint,
    save_checkpoint,
)
from vriksha.train.checkpoint_manifest import MANIFEST

pytestmark = [pytest.mark.timeout(120), pytest.mark.filterwarnings("ignore:torch.distributed is disabled")]


def _parts(seed: int = 0):
    torch.manual_seed(seed)
    model = torch.nn.Linear(8, 4)
    opt = torch.optim.AdamW(model.parameters(), lr=0.1)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda i: 1.0 / (1 + i))
    return model, opt, sched


def _train(model, opt, sched) -> None:
    model(torch.randn(3, 8)).pow(2).sum().backward()
    opt.step()
    sched.step()
    opt.zero_grad()


def _run_with_checkpoints(out: Path, steps: list[int], keep: int = 3) -> dict[int, torch.Tensor]:
    model, opt, sched = _parts()
    weights = {}
    for step in steps:
        _train(model, opt, sched)
        save_checkpoint(out, step, model, opt, sched, {"tag": step}, rank=0, keep=keep)
        weights[step] = model.weight.detach().clone()
    return weights


def _step_dir(out: Path, step: int) -> Path:
    return out / "checkpoints" / f"step_{step:06d}"


def _largest(path: Path) -> Path:
    return max(
        (p for p in path.iterdir() if p.is_file() and p.name != MANIFEST), key=lambda p: p.stat().st_size
    )


def _resume(out: Path) -> tuple[dict, torch.nn.Linear]:
    model, opt, sched = _parts(seed=99)  # different weights: the load must replace them
    state = load_checkpoint(find_checkpoint(out), model, opt, sched, rank=0)
    return state, model


def test_save_writes_a_manifest_of_every_file(tmp_path):
    _run_with_checkpoints(tmp_path, [1])
    path = _step_dir(tmp_path, 1)
    manifest = json.loads((path / MANIFEST).read_text())
    on_disk = {p.name for p in path.iterdir() if p.is_file() and p.name != MANIFEST}
    assert set(manifest["files"]) == on_disk and {"trainer.json", "rng_rank0.pt", ".metadata"} <= on_disk
    assert manifest["step"] == 1 and manifest["world_size"] == 1
    for name, entry in manifest["files"].items():
        assert entry["bytes"] == (path / name).stat().st_size and len(entry["sha256"]) == 64
    assert latest_checkpoint(tmp_path) == path


@pytest.mark.parametrize("damage", ["flip", "truncate", "delete"])
def test_a_corrupt_newest_checkpoint_is_named_and_the_previous_one_resumed(tmp_path, caplog, damage):
    weights = _run_with_checkpoints(tmp_path, [1, 2])
    victim = _largest(_step_dir(tmp_path, 2))
    if damage == "flip":
        data = bytearray(victim.read_bytes())
        data[len(data) // 2] ^= 0xFF
        victim.write_bytes(bytes(data))
    elif damage == "truncate":
        victim.write_bytes(victim.read_bytes()[:-7])
    else:
        victim.unlink()
    with caplog.at_level(logging.WARNING, logger="vriksha.train.checkpoint"):
        state, model = _resume(tmp_path)
    assert state["step"] == 1 and state["tag"] == 1
    assert torch.equal(model.weight, weights[1])
    warned = caplog.text
    assert str(_step_dir(tmp_path, 2)) in warned and victim.name in warned
    assert {"flip": "sha256", "truncate": "bytes", "delete": "missing"}[damage] in warned
    assert (tmp_path / "checkpoints" / "latest").read_text() == "step_000001"


def test_a_partial_save_is_skipped(tmp_path, caplog):
    """What a run killed while saving leaves: files but no manifest (it is written last)."""
    weights = _run_with_checkpoints(tmp_path, [1, 2])
    (_step_dir(tmp_path, 2) / MANIFEST).unlink()
    (tmp_path / "checkpoints" / "latest").write_text("step_000001")  # the pointer was never moved
    with caplog.at_level(logging.WARNING, logger="vriksha.train.checkpoint"):
        state, model = _resume(tmp_path)
    assert state["step"] == 1 and torch.equal(model.weight, weights[1])
    assert "partial" in caplog.text and "step_000002" in caplog.text


def test_a_latest_pointer_to_a_missing_step_is_repaired(tmp_path, caplog):
    weights = _run_with_checkpoints(tmp_path, [1, 2])
    marker = tmp_path / "checkpoints" / "latest"
    marker.write_text("step_000007")
    with caplog.at_level(logging.WARNING, logger="vriksha.train.checkpoint"):
        state, model = _resume(tmp_path)
    assert state["step"] == 2 and torch.equal(model.weight, weights[2])
    assert "step_000007" in caplog.text and "repaired" in caplog.text
    assert marker.read_text() == "step_000002"
    marker.unlink()  # no pointer at all: the listing still finds it
    assert find_checkpoint(tmp_path) == _step_dir(tmp_path, 2)


def test_a_finished_save_that_never_moved_the_pointer_is_used(tmp_path):
    """Killed between the manifest and the pointer: the newer checkpoint is complete and verified."""
    weights = _run_with_checkpoints(tmp_path, [1, 2])
    (tmp_path / "checkpoints" / "latest").write_text("step_000001")
    state, model = _resume(tmp_path)
    assert state["step"] == 2 and torch.equal(model.weight, weights[2])


def test_no_good_checkpoint_is_one_clear_error_naming_each(tmp_path):
    _run_with_checkpoints(tmp_path, [1, 2])
    for step in (1, 2):
        (_step_dir(tmp_path, step) / "trainer.json").write_text("{}")
    with pytest.raises(CheckpointError) as err:
        find_checkpoint(tmp_path)
    msg = str(err.value)
    assert "step_000001" in msg and "step_000002" in msg and "trainer.json" in msg and "--resume" in msg
    with pytest.raises(CheckpointError, match="no checkpoint under"):
        find_checkpoint(tmp_path / "elsewhere")


def test_a_checkpoint_from_another_process_count_is_still_chosen(tmp_path):
    """DCP reshards onto the resuming mesh (tests/train/test_parallel_mesh.py), so the count is no reason to skip."""
    _run_with_checkpoints(tmp_path, [1])
    manifest_file = _step_dir(tmp_path, 1) / MANIFEST
    manifest = json.loads(manifest_file.read_text())
    manifest["world_size"] = 2
    manifest_file.write_text(json.dumps(manifest))
    assert find_checkpoint(tmp_path) == _step_dir(tmp_path, 1)


def test_a_checkpoint_without_manifest_from_an_older_version_resumes(tmp_path, caplog):
    weights = _run_with_checkpoints(tmp_path, [1])
    (_step_dir(tmp_path, 1) / MANIFEST).unlink()  # what saves wrote before manifests; `latest` names it
    with caplog.at_level(logging.WARNING, logger="vriksha.train.checkpoint"):
        state, model = _resume(tmp_path)
    assert state["step"] == 1 and torch.equal(model.weight, weights[1])
    assert "not verified" in caplog.text


def test_saving_prunes_partial_saves_first_and_keeps_the_newest(tmp_path):
    _run_with_checkpoints(tmp_path, [1, 2], keep=2)
    (_step_dir(tmp_path, 2) / MANIFEST).unlink()  # step 2 was cut short
    model, opt, sched = _parts()
    save_checkpoint(tmp_path, 3, model, opt, sched, {}, rank=0, keep=2)
    assert sorted(p.name for p in (tmp_path / "checkpoints").glob("step_*")) == ["step_000001", "step_000003"]
    # checkpoints past the step being saved are from a timeline the run left: they go
    _run_with_checkpoints(tmp_path / "other", [9])
    shutil.copytree(_step_dir(tmp_path / "other", 9), _step_dir(tmp_path, 9))
    save_checkpoint(tmp_path, 3, model, opt, sched, {}, rank=0, keep=2)
    assert not _step_dir(tmp_path, 9).exists() and _step_dir(tmp_path, 1).exists()
    # a save over a directory a cut-short save left behind starts clean
    (_step_dir(tmp_path, 3) / "stray.bin").write_bytes(b"x")
    save_checkpoint(tmp_path, 3, model, opt, sched, {}, rank=0, keep=2)
    assert not (_step_dir(tmp_path, 3) / "stray.bin").exists()
    assert find_checkpoint(tmp_path) == _step_dir(tmp_path, 3)


def test_a_verified_checkpoint_that_does_not_fit_the_model_is_a_clear_error(tmp_path):
    _run_with_checkpoints(tmp_path, [1])
    model = torch.nn.Linear(8, 5)  # another shape: the config changed
    opt = torch.optim.AdamW(model.parameters())
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda i: 1.0)
    with pytest.raises(CheckpointError, match="does not match this run"):
        load_checkpoint(find_checkpoint(tmp_path), model, opt, sched, rank=0)


def test_a_save_before_the_first_optimizer_step_does_not_count_as_one(tmp_path):
    """DCP's get_state_dict gives a fresh optimizer its state by a step at lr 0, which AdamW counts: the
    saving run, and a run resumed from that checkpoint, must take their first real step as a run that never
    saved does (same bias correction, same weights)."""
    plain, saved, resumed = _parts(), _parts(), _parts(seed=99)
    save_checkpoint(tmp_path, 1, *saved, {}, rank=0)
    assert not saved[1].state and torch.equal(saved[0].weight, plain[0].weight)
    state = load_checkpoint(find_checkpoint(tmp_path), *resumed, rank=0)
    assert not resumed[1].state and torch.equal(resumed[0].weight, plain[0].weight)
    assert "optimizer_fresh" not in state
    for model, opt, sched in (plain, saved, resumed):
        torch.manual_seed(7)
        _train(model, opt, sched)
        assert all(int(s["step"]) == 1 for s in opt.state.values())
        assert torch.equal(model.weight, plain[0].weight) and torch.equal(model.bias, plain[0].bias)
    # once it has stepped, the state is saved and restored as it is
    save_checkpoint(tmp_path, 2, *saved, {}, rank=0)
    again = _parts(seed=99)
    load_checkpoint(find_checkpoint(tmp_path), *again, rank=0)
    assert [int(s["step"]) for s in again[1].state.values()] == [1, 1]


def _two_rank_worker(rank: int, port: int, out: str, results: str) -> None:
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    try:
        model, opt, sched = _parts()
        for step in (1, 2):
            _train(model, opt, sched)
            save_checkpoint(out, step, model, opt, sched, {"tag": step}, rank=rank)
        dist.barrier()
        if rank == 1:  # one rank's own file goes bad; both ranks must agree to skip the checkpoint
            victim = Path(out) / "checkpoints" / "step_000002" / "rng_rank1.pt"
            data = bytearray(victim.read_bytes())
            data[len(data) // 2] ^= 0xFF
            victim.write_bytes(bytes(data))
        dist.barrier()
        chosen = find_checkpoint(out)
        state = load_checkpoint(chosen, *_parts(seed=5), rank=rank)
        Path(results, f"rank{rank}.json").write_text(
            json.dumps({"chosen": chosen.name, "step": state["step"]})
        )
    finally:
        dist.destroy_process_group()


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore")
def test_two_ranks_hash_in_parallel_and_agree_on_the_fallback(tmp_path):
    import torch.multiprocessing as mp

    from vriksha.net.launch import free_port

    results = tmp_path / "results"
    results.mkdir()
    mp.spawn(_two_rank_worker, args=(free_port(), str(tmp_path), str(results)), nprocs=2, join=True)
    manifest = json.loads((_step_dir(tmp_path, 1) / MANIFEST).read_text())
    assert manifest["world_size"] == 2 and {"rng_rank0.pt", "rng_rank1.pt"} <= set(manifest["files"])
    for rank in (0, 1):
        assert json.loads((results / f"rank{rank}.json").read_text()) == {"chosen": "step_000001", "step": 1}
