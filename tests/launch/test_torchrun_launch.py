"""The torchrun launcher's command for one node and for several, Slurm's variables, threads per node, and the
node identity that decides the shared-memory weight plane."""

from __future__ import annotations

import pytest

from vriksha.errors import ConfigError
from vriksha.launch.slurm import expand_nodelist, from_slurm
from vriksha.launch.threads import threads_per_process, usable_cores
from vriksha.launch.torchrun import TorchrunConfig, strip_launch_flags, torchrun_command
from vriksha.train.cli import build_parser
from vriksha.weights.node import NodeIdentity, node_identity


def test_one_node_is_standalone_and_several_use_the_rendezvous():
    one = torchrun_command(TorchrunConfig(nproc=2), ["c.yaml"])
    assert "--standalone" in one and "--nproc_per_node=2" in one
    assert one[-3:] == ["-m", "vriksha.train", "c.yaml"]
    two = TorchrunConfig(nproc=4, nnodes=2, node_rank=1, rdzv_endpoint="10.0.0.1:29400", rdzv_id="job7")
    two.validate()
    cmd = torchrun_command(two, ["c.yaml", "--set", "trainer.steps=3"])
    assert "--standalone" not in cmd
    for flag in ("--nnodes=2", "--nproc_per_node=4", "--node_rank=1", "--rdzv_backend=c10d",
                 "--rdzv_endpoint=10.0.0.1:29400", "--rdzv_id=job7"):  # fmt: skip
        assert flag in cmd
    assert cmd[-5:] == ["-m", "vriksha.train", "c.yaml", "--set", "trainer.steps=3"]


@pytest.mark.parametrize(
    ("cfg", "needle"),
    [
        (TorchrunConfig(nnodes=2), "--rdzv-endpoint"),
        (TorchrunConfig(nnodes=2, rdzv_endpoint="host"), "HOST:PORT"),
        (TorchrunConfig(nnodes=2, node_rank=2, rdzv_endpoint="h:1"), "--node-rank"),
        (TorchrunConfig(nproc=0), "--nproc"),
        (TorchrunConfig(nnodes=2, rdzv_endpoint="h:1", rdzv_backend="static"), "--node-rank"),
        (TorchrunConfig(rdzv_backend="zk"), "--rdzv-backend"),
    ],
)
def test_bad_launch_flags_are_named(cfg, needle):
    with pytest.raises(ConfigError, match=needle.replace("-", r"\-")):
        cfg.validate()


def test_launch_flags_are_parsed_and_stripped_for_the_ranks():
    argv = ["c.yaml", "--nproc", "2", "--nnodes=2", "--node-rank", "0", "--rdzv-endpoint", "h:29500",
            "--set", "trainer.steps=2", "--resume", "--launcher", "torchrun"]  # fmt: skip
    args = build_parser().parse_args(argv)
    assert (args.nproc, args.nnodes, args.node_rank, args.rdzv_endpoint) == (2, 2, 0, "h:29500")
    assert strip_launch_flags(argv) == ["c.yaml", "--set", "trainer.steps=2", "--resume"]


def test_slurm_nodelists_expand():
    assert expand_nodelist("gpu[01-03,07],login1") == ["gpu01", "gpu02", "gpu03", "gpu07", "login1"]
    assert expand_nodelist("n[8-10]") == ["n8", "n9", "n10"]
    assert expand_nodelist("a,b") == ["a", "b"]
    with pytest.raises(ConfigError, match="SLURM_JOB_NODELIST"):
        expand_nodelist("gpu[01-x]")


def test_slurm_step_fills_what_the_flags_leave():
    env = {"SLURM_JOB_NUM_NODES": "3", "SLURM_NODEID": "2", "SLURM_JOB_NODELIST": "cn[004-006]",
           "SLURM_JOB_ID": "881"}  # fmt: skip
    step = from_slurm(env)
    assert step is not None and (step.nnodes, step.node_rank, step.head, step.job_id) == (
        3,
        2,
        "cn004",
        "881",
    )
    cfg = TorchrunConfig(nproc=2).with_slurm(env)
    assert (cfg.nnodes, cfg.node_rank, cfg.rdzv_endpoint, cfg.rdzv_id) == (3, 2, "cn004:29500", "881")
    cfg.validate()
    # torchrun's own variables win (srun torchrun ...: each rank is already placed), and so do given flags
    assert TorchrunConfig(nproc=2).with_slurm({**env, "RANK": "0"}).nnodes == 1
    given = TorchrunConfig(nproc=2, rdzv_endpoint="head:1234").with_slurm({**env, "MASTER_ADDR": "x"})
    assert given.rdzv_endpoint == "head:1234"
    assert from_slurm({}) is None


def test_threads_are_counted_per_node(monkeypatch):
    cores = usable_cores()
    assert threads_per_process(1) == cores
    assert threads_per_process(cores * 2) == 1
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "1")
    monkeypatch.setenv("WORLD_SIZE", "64")  # the whole job's size does not divide this node's cores
    assert threads_per_process() == cores


def test_node_identity_needs_the_same_host_boot_and_shm_mount():
    me = node_identity()
    assert me.shares_memory_with(NodeIdentity.from_json(me.to_json()))
    for other in (
        NodeIdentity(
            me.hostname, me.boot_id, "0:99"
        ),  # another /dev/shm mount (a container, an IPC namespace)
        NodeIdentity("elsewhere", me.boot_id, me.shm_device),
        NodeIdentity(me.hostname, "another-boot", me.shm_device),
    ):
        assert not me.shares_memory_with(other)
    assert NodeIdentity.from_json({"hostname": "x"}) is None and NodeIdentity.from_json(None) is None
