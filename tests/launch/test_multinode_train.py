"""Training over two "nodes" (2 x 1 process, a rendezvous on loopback), each with its own IPC namespace,
/dev/shm and temporary directory, against one node with 2 processes: the same losses, gradient norms and
parameters; a resume from the 2-node checkpoint; an output directory that is not shared is named at start.

The runs weigh no token by pi_old / pi_engine (`grpo.importance_correction=false`): the colocated engine's
log-probs of two runs of one config with 2 processes differ in their last bits (1-node against 1-node too), and
through that weight so would the parameters (by about 1e-5). Without it every number the trainer computes is
the same bit for bit; the engine's log-prob gap is compared to 1e-6.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tests.launch.nodes import node_env, nodes_unavailable, own_node
from tests.train.trainer_runs import ROOT, metrics_rows, write_config
from vriksha.net.launch import free_port

pytestmark = pytest.mark.slow

_why = nodes_unavailable()
needs_nodes = pytest.mark.skipif(_why is not None, reason=_why or "")


def _env(tmpdir: Path | None = None) -> dict[str, str]:
    return node_env(tmpdir, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))


def train_cli(args: list[str], **kw) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "vriksha.cli", "train", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        **kw,
    )


def run_two_nodes(cfg: Path, tmp: Path, extra: list[str] = (), private: dict[int, list[Path]] | None = None):
    """Both nodes' `vriksha train --nnodes 2 --node-rank R --rdzv-endpoint 127.0.0.1:P --nproc 1`; their
    (exit status, stderr)."""
    port = free_port()
    procs = []
    for rank in range(2):
        flags = [
            "--nnodes",
            "2",
            "--node-rank",
            str(rank),
            "--rdzv-endpoint",
            f"127.0.0.1:{port}",
            "--nproc",
            "1",
        ]
        procs.append(
            train_cli(
                [str(cfg), *flags, *extra],
                env=_env(tmp / f"node{rank}-tmp"),
                preexec_fn=own_node((private or {}).get(rank, [])),
            )
        )
    out = []
    for p in procs:
        _, err = p.communicate(timeout=600)
        out.append((p.returncode, err))
    return out


def _ok(results) -> None:
    for rc, err in results:
        assert rc == 0, err[-6000:]


def _final(out: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    return load_file(str(out / "final" / "model.safetensors"))


EXACT = ["--set", "grpo.importance_correction=false"]
ENGINE_LOGPROBS = "logprob_gap/mean"


def _same(mine: list[dict], theirs: list[dict]) -> None:
    assert [r["step"] for r in mine] == [r["step"] for r in theirs]
    for a, b in zip(mine, theirs, strict=True):
        assert a[ENGINE_LOGPROBS] == pytest.approx(b[ENGINE_LOGPROBS], abs=1e-6)
        assert {k: v for k, v in a.items() if k != ENGINE_LOGPROBS} == {
            k: v for k, v in b.items() if k != ENGINE_LOGPROBS
        }


@pytest.fixture(scope="module")
def one_node_two_processes(tiny_model_dir, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("one-node")
    cfg = write_config(tmp, tiny_model_dir, "ref", steps=3, eval_episodes=0)
    p = train_cli([str(cfg), "--nproc", "2", *EXACT], env=_env())
    _, err = p.communicate(timeout=600)
    assert p.returncode == 0, err[-6000:]
    return tmp / "ref"


@needs_nodes
def test_two_nodes_equal_one_node_and_resume_from_their_checkpoint(
    one_node_two_processes, tiny_model_dir, tmp_path
):
    cfg = write_config(tmp_path, tiny_model_dir, "nodes", steps=3, eval_episodes=0)
    out = tmp_path / "nodes"
    _ok(run_two_nodes(cfg, tmp_path, [*EXACT, "--set", "trainer.stop_after=2"]))
    assert [r["step"] for r in metrics_rows(out)] == [1, 2]
    assert (out / "checkpoints" / "step_000002" / "manifest.json").is_file()
    _ok(run_two_nodes(cfg, tmp_path, [*EXACT, "--resume"]))  # the rest of the run from the 2-node checkpoint
    ref = one_node_two_processes
    _same(metrics_rows(out), metrics_rows(ref))  # losses, gradient norms, rewards: bit for bit
    mine, theirs = _final(out), _final(ref)
    assert mine.keys() == theirs.keys()
    for name, t in theirs.items():
        assert torch.equal(mine[name], t), name


@needs_nodes
def test_output_dir_that_a_node_does_not_share_is_named_at_start(tiny_model_dir, tmp_path):
    shared = tmp_path / "share"
    shared.mkdir()
    cfg = write_config(shared, tiny_model_dir, "run", steps=2, eval_episodes=0)
    # node 1 sees its own empty directory where node 0 has the share (an unmounted NFS, a node-local path)
    (shared / "run").mkdir()
    results = run_two_nodes(cfg, tmp_path, private={1: [shared / "run"]})
    for rc, err in results:
        assert rc == 1
        assert "is not one file system that every rank sees" in err, err[-3000:]
        assert "rank 1" in err or "rank 0" in err
    assert not (shared / "run" / "checkpoints").exists()
