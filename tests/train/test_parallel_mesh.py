"""The mesh `(dp_replicate, dp_shard, tp)`: degrees checked against the world size and the model,
tensor-parallel plans per family, and (slow, gloo processes) every mesh shape training like one
process, with checkpoints that move between mesh shapes.
"""

import pytest
import torch

from tests.train.parallel_cases import Case, run_world, tiny_model
from vriksha.errors import ConfigError
from vriksha.train.config import load_config
from vriksha.train.distributed import resolve_degrees
from vriksha.train.parallelize import check_tp_degree, tp_plan


def test_degrees_resolve_and_default_to_all_ranks_dp_shard():
    assert resolve_degrees(4) == (1, 4, 1)
    assert resolve_degrees(4, tp=2) == (1, 2, 2)
    assert resolve_degrees(8, dp_replicate=2, tp=2) == (2, 2, 2)
    assert resolve_degrees(4, dp_shard=1, tp=4) == (1, 1, 4)


@pytest.mark.parametrize(
    "world, degrees, numbers",
    [
        (4, {"tp": 3}, ["tp (3)", "world size 4"]),
        (4, {"dp_shard": 2, "tp": 1}, ["dp_shard (2)", "tp (1)", "= 2", "world size is 4"]),
        (2, {"dp_shard": 2, "tp": 2}, ["dp_shard (2) x tp (2) = 4", "world size is 2"]),
        (6, {"dp_replicate": 4}, ["dp_replicate (4)", "world size 6"]),
        (2, {"tp": 0}, ["parallel.tp", "got 0"]),
    ],
)
def test_bad_degrees_name_the_numbers(world, degrees, numbers):
    with pytest.raises(ConfigError) as exc:
        resolve_degrees(world, **degrees)
    for part in numbers:
        assert part in str(exc.value)


def test_tp_must_divide_heads_and_kv_heads():
    config = tiny_model().config  # 4 attention heads, 2 KV heads, MLP 128
    check_tp_degree(config, 2)
    with pytest.raises(ConfigError, match=r"3 does not divide the model's num_attention_heads \(4\)"):
        check_tp_degree(config, 3)
    with pytest.raises(ConfigError, match=r"4 does not divide the model's num_key_value_heads \(2\)"):
        check_tp_degree(config, 4)


def test_parallel_section_and_overrides():
    cfg = load_config(None, ["parallel.tp=2"])
    assert (cfg.parallel.dp_replicate, cfg.parallel.dp_shard, cfg.parallel.tp) == (1, -1, 2)
    assert load_config(None).parallel.dp_shard == -1  # default: every rank shards (plain FSDP)
    for bad, field in (("parallel.tp=0", "parallel.tp:"), ("parallel.dp_shard=0", "parallel.dp_shard:")):
        with pytest.raises(ConfigError, match=field):
            load_config(None, [bad])


@pytest.mark.parametrize("family", ["llama", "qwen2", "qwen3"])
def test_plan_names_real_modules(family):
    model = tiny_model(family)
    modules = dict(model.named_modules())
    plan = tp_plan(model)
    assert "lm_head" in plan and "model.embed_tokens" in plan
    per_layer = 9 if family == "qwen3" else 7  # + the per-head q/k norms
    assert len(plan) == 2 + per_layer * len(model.model.layers)
    assert all(name in modules for name in plan)
    assert "lm_head" not in tp_plan(model, shard_vocab=False)


def test_unknown_family_is_refused():
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.for_model("gpt2", n_embd=32, n_layer=1, n_head=2, vocab_size=50)
    with pytest.raises(
        ConfigError, match="tensor parallel has a plan for llama, qwen2, qwen3, not for 'gpt2'"
    ):
        tp_plan(AutoModelForCausalLM.from_config(config))


# -- multi-process: gloo ranks on CPU, one thread each ------------------------------------------

WORLD2 = [
    Case("tp2", dp_shard=1, tp=2),
    Case("tp2_replicated_vocab", dp_shard=1, tp=2, shard_vocab=False),
    Case("tp2_qwen3", dp_shard=1, tp=2, family="qwen3"),
    Case("tp2_qwen3_chunked", dp_shard=1, tp=2, family="qwen3", chunk_tokens=3),
    Case("dp2_chunked", dp_shard=2, tp=1, chunk_tokens=3),
    Case("dp2_split", dp_shard=2, tp=1, split_overhead=0),
    Case("tp2_split", dp_shard=1, tp=2, split_overhead=0),
    Case("dp2_uneven_split", dp_shard=2, tp=1, split_overhead=0, uneven=True),
    Case("dp2", dp_shard=2, tp=1, save_after=1),
    Case("tp2_from_dp2", dp_shard=1, tp=2, resume_from="dp2"),
]
WORLD4 = [
    Case("mesh2x2", dp_shard=2, tp=2, save_after=1),
    Case("dp4_from_dp2", dp_shard=4, tp=1, resume_from="dp2"),
    Case("dp4_from_2x2", dp_shard=4, tp=1, resume_from="mesh2x2"),
]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    out = tmp_path_factory.mktemp("mesh")
    references = [
        Case("ref", 1, 1),
        Case("ref_qwen3", 1, 1, family="qwen3"),
        Case("ref_uneven", 1, 1, uneven=True),
    ]
    run_world(1, references, out)
    run_world(2, WORLD2, out)
    run_world(4, WORLD4, out)
    return {p.stem: torch.load(p, weights_only=False) for p in out.glob("*.pt")}


def _assert_same(ref: dict, got: dict, steps: list[int]) -> None:
    assert got["steps"] == steps
    for i, step in enumerate(steps):
        j = step - 1
        assert got["loss"][i] == pytest.approx(ref["loss"][j], rel=1e-5, abs=1e-7), f"loss at step {step}"
        assert got["grad_norm"][i] == pytest.approx(ref["grad_norm"][j], rel=1e-5), (
            f"grad norm at step {step}"
        )
        for name, value in ref["grads"][j].items():
            torch.testing.assert_close(got["grads"][i][name], value, rtol=1e-4, atol=1e-6, msg=name)
        for name, value in ref["params"][j].items():
            torch.testing.assert_close(got["params"][i][name], value, rtol=1e-4, atol=1e-5, msg=name)


slow = pytest.mark.slow


@slow
def test_reference_moves(runs):
    ref = runs["ref"]
    assert ref["loss"][0] != 0 and ref["grad_norm"][0] > 0
    assert not torch.equal(ref["params"][0]["lm_head.weight"], ref["params"][1]["lm_head.weight"])


@slow
@pytest.mark.parametrize(
    "name, ref",
    [
        ("tp2", "ref"),
        ("tp2_replicated_vocab", "ref"),
        ("tp2_qwen3", "ref_qwen3"),
        ("dp2", "ref"),
        # the log-probs one position at a time (checkpointed LM-head chunks) against all at once
        ("tp2_qwen3_chunked", "ref_qwen3"),
        ("dp2_chunked", "ref"),
        # each completion length its own forward (three per micro-batch on every rank) against one forward
        ("dp2_split", "ref"),
        ("tp2_split", "ref"),
        # rank 0's first micro-batch plans one forward, rank 1's three: rank 0 splits its own to match
        ("dp2_uneven_split", "ref_uneven"),
    ],
)
def test_two_ranks_equal_one(runs, name, ref):
    _assert_same(runs[ref], runs[name], [1, 2])


@slow
def test_2x2_mesh_equals_one_process(runs):
    _assert_same(runs["ref"], runs["mesh2x2"], [1, 2])


@slow
@pytest.mark.parametrize("name", ["tp2_from_dp2", "dp4_from_dp2", "dp4_from_2x2"])
def test_checkpoint_resumes_on_another_mesh(runs, name):
    _assert_same(runs["ref"], runs[name], [2])
