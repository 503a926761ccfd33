"""A manifest that cannot be read stops a resume (never a resume without verification), and a save onto a
full disk says so in one line, removes its partial files and leaves the last good checkpoint intact."""

from __future__ import annotations

import json
import subprocess
import uuid
from pathlib import Path

import pytest
import torch

from vriksha.errors import VrikshaError
from vriksha.train.checkpoint import CheckpointError, find_checkpoint, load_checkpoint, save_checkpoint
from vriksha.train.checkpoint_manifest import MANIFEST

pytestmark = [pytest.mark.timeout(120), pytest.mark.filterwarnings("ignore:torch.distributed is disabled")]


def _parts(seed: int = 0, width: int = 8):
    torch.manual_seed(seed)
    model = torch.nn.Linear(width, width)
    opt = torch.optim.AdamW(model.parameters(), lr=0.1)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda i: 1.0)
    return model, opt, sched


def _step(model, opt, sched) -> None:
    model(torch.randn(3, model.in_features)).pow(2).sum().backward()
    opt.step()
    sched.step()
    opt.zero_grad()


def _step_dir(out: Path, step: int) -> Path:
    return out / "checkpoints" / f"step_{step:06d}"


def _two_checkpoints(out: Path) -> None:
    model, opt, sched = _parts()
    for step in (1, 2):
        _step(model, opt, sched)
        save_checkpoint(out, step, model, opt, sched, {}, rank=0, keep=3)


@pytest.mark.parametrize(
    "text",
    [
        "{not json",
        "[]",
        json.dumps(
            {"version": 1, "step": 2, "world_size": 1, "files": {}}
        ),  # lists nothing: verifies nothing
        json.dumps(
            {"version": 1, "step": 2, "world_size": 1, "files": {"trainer.json": "x", ".metadata": 1}}
        ),
        json.dumps({"version": 1, "step": "2", "world_size": 1, "files": {}}),
    ],
    ids=["garbage", "not-an-object", "empty", "bad-entries", "bad-step"],
)
def test_an_unreadable_manifest_stops_the_resume(tmp_path, text):
    _two_checkpoints(tmp_path)
    (_step_dir(tmp_path, 2) / MANIFEST).write_text(text)
    with pytest.raises(CheckpointError) as err:
        find_checkpoint(tmp_path)
    msg = str(err.value)
    assert "cannot be read" in msg and "step_000002" in msg and "move" in msg, msg


def test_a_file_added_after_the_save_fails_verification(tmp_path):
    _two_checkpoints(tmp_path)
    (_step_dir(tmp_path, 2) / "__0_1.distcp").write_bytes(b"planted")
    assert find_checkpoint(tmp_path) == _step_dir(tmp_path, 1)


def test_a_manifest_copied_from_another_step_fails_verification(tmp_path):
    _two_checkpoints(tmp_path)
    body = json.loads((_step_dir(tmp_path, 2) / MANIFEST).read_text())
    body["step"] = 1
    (_step_dir(tmp_path, 2) / MANIFEST).write_text(json.dumps(body))
    assert find_checkpoint(tmp_path) == _step_dir(tmp_path, 1)


@pytest.fixture
def tiny_disk(tmp_path):
    """A 256 KiB tmpfs (root only; the filesystem a full disk is made on)."""
    mnt = tmp_path / f"disk-{uuid.uuid4().hex[:8]}"
    mnt.mkdir()
    proc = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=256k", "tmpfs", str(mnt)], capture_output=True)
    if proc.returncode:
        pytest.skip(f"cannot mount a tmpfs here: {proc.stderr.decode().strip()}")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], capture_output=True)


def _fill(disk: Path, leave: int) -> None:
    """Write a filler file so that about `leave` bytes stay free."""
    import shutil

    free = shutil.disk_usage(disk).free
    with open(disk / "filler.bin", "wb") as f:
        f.write(b"\0" * max(0, free - leave))


def test_a_save_onto_a_full_disk_is_one_line_and_keeps_the_last_good_checkpoint(tiny_disk):
    model, opt, sched = _parts(width=32)  # a checkpoint of about 30 KiB
    _step(model, opt, sched)
    save_checkpoint(tiny_disk, 1, model, opt, sched, {"tag": 1}, rank=0)
    good = {p.name: p.read_bytes() for p in _step_dir(tiny_disk, 1).iterdir()}
    weights = model.weight.detach().clone()
    _fill(tiny_disk, 8 * 1024)
    _step(model, opt, sched)
    with pytest.raises(CheckpointError) as err:
        save_checkpoint(tiny_disk, 2, model, opt, sched, {"tag": 2}, rank=0)
    msg = str(err.value)
    assert isinstance(err.value, VrikshaError) and "\n" not in msg, msg  # the CLI prints it as one line
    assert "disk full" in msg and str(_step_dir(tiny_disk, 2)) in msg and "needs about" in msg, msg
    assert "step_000001, is intact" in msg, msg
    assert not _step_dir(tiny_disk, 2).exists()  # the partial save is gone (its room freed)
    assert (tiny_disk / "checkpoints" / "latest").read_text() == "step_000001"
    assert {p.name: p.read_bytes() for p in _step_dir(tiny_disk, 1).iterdir()} == good
    (tiny_disk / "filler.bin").unlink()
    resumed = _parts(seed=9, width=32)
    state = load_checkpoint(find_checkpoint(tiny_disk), *resumed, rank=0)
    assert state["tag"] == 1 and torch.equal(resumed[0].weight, weights)


def test_a_save_failing_for_another_reason_names_its_cause(tmp_path):
    model, opt, sched = _parts()
    _step(model, opt, sched)
    with pytest.raises(CheckpointError) as err:
        save_checkpoint(tmp_path, 1, model, opt, sched, {"metric": object()}, rank=0)
    msg = str(err.value)
    assert "\n" not in msg and "disk full" not in msg and "no earlier checkpoint exists" in msg, msg
    assert "TypeError: Object of type object is not JSON serializable" in msg, msg
    assert not _step_dir(tmp_path, 1).exists()
