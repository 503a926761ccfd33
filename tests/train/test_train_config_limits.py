"""The training config refuses what no run means: non-finite numbers, seeds torch cannot take, step counts
past any plan, and YAML aliases (an alias bomb is refused before it expands), each in one line naming the key."""

import time

import pytest

from vriksha.errors import ConfigError
from vriksha.train.config import MAX_SEED, MAX_STEPS, load_config


@pytest.mark.parametrize(
    "text, field",
    [
        ("optim:\n  lr: .inf\n", "optim.lr"),
        ("optim:\n  lr: .nan\n", "optim.lr"),
        ("optim:\n  lr: -.inf\n", "optim.lr"),
        ("optim:\n  lr: 0\n", "optim.lr"),
        ("optim:\n  eps: .nan\n", "optim.eps"),
        ("optim:\n  max_grad_norm: .inf\n", "optim.max_grad_norm"),
        ("optim:\n  betas: [0.9, .nan]\n", "optim.betas.1"),
        ("rollout:\n  temperature: .inf\n", "rollout.temperature"),
        ("grpo:\n  clip_high: .inf\n", "grpo.clip_high"),
        ("trainer:\n  seed: 1180591620717411303424\n", "trainer.seed"),  # 2^70
        ("trainer:\n  seed: -1\n", "trainer.seed"),
        ("trainer:\n  steps: 1.0e+18\n", "trainer.steps"),
        ("trainer:\n  stop_after: 1000000000000\n", "trainer.stop_after"),
        ("rollout:\n  max_new_tokens: 100000000000\n", "rollout.max_new_tokens"),
        ("rollout:\n  group_size: 1000000000\n", "rollout.group_size"),
    ],
)
def test_non_finite_and_absurd_values_are_refused_naming_the_key(tmp_path, text, field):
    path = tmp_path / "c.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError) as err:
        load_config(path)
    msg = str(err.value)
    assert f"{field}:" in msg and "\n" not in msg, msg


def test_the_bounds_themselves_are_accepted():
    cfg = load_config(None, [f"trainer.seed={MAX_SEED}", f"trainer.steps={MAX_STEPS}", "optim.lr=1e-3"])
    assert cfg.trainer.seed == 2**63 - 1 and cfg.trainer.steps == MAX_STEPS
    import torch

    torch.manual_seed(cfg.trainer.seed)  # the largest seed allowed is one torch takes


def _alias_bomb(levels: int) -> str:
    """`levels` nested lists of ten aliases each: 10**levels values from a few hundred bytes."""
    lines = ["    l0: &l0 [lol, lol, lol, lol, lol, lol, lol, lol, lol, lol]"]
    for i in range(1, levels):
        lines.append(f"    l{i}: &l{i} [" + ", ".join([f"*l{i - 1}"] * 10) + "]")
    return "env:\n  kwargs:\n" + "\n".join(lines) + "\n"


@pytest.mark.timeout(30)
def test_a_yaml_alias_bomb_is_refused_at_once_naming_the_key(tmp_path):
    path = tmp_path / "bomb.yaml"
    path.write_text(_alias_bomb(6))  # a million values once expanded (the attack used billions)
    assert path.stat().st_size < 1024
    start = time.monotonic()
    with pytest.raises(ConfigError) as err:
        load_config(path)
    msg = str(err.value)
    assert time.monotonic() - start < 5
    assert "env.kwargs.l1.0: the YAML alias *l0 (line 4" in msg and "\n" not in msg, msg


def test_aliases_in_overrides_and_merge_keys_are_refused(tmp_path):
    with pytest.raises(ConfigError, match=r"--set .*env\.kwargs\.1: the YAML alias \*a"):
        load_config(None, ["env.kwargs=[&a [1, 2], *a]"])
    path = tmp_path / "merge.yaml"
    path.write_text("base: &base {lr: 1.0e-5}\noptim:\n  <<: *base\n")
    with pytest.raises(ConfigError, match=r"optim\.<<: the YAML alias \*base"):
        load_config(path)


def test_anchors_without_aliases_and_deep_nesting(tmp_path):
    path = tmp_path / "anchor.yaml"
    path.write_text("optim: &o\n  lr: 2.0e-5\n")
    assert load_config(path).optim.lr == pytest.approx(2e-5)
    deep = tmp_path / "deep.yaml"
    deep.write_text("env:\n  kwargs:\n    x: " + "[" * 20000 + "]" * 20000 + "\n")
    with pytest.raises(ConfigError, match="deep.yaml"):
        load_config(deep)
