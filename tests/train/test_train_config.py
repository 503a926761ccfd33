"""Training config: files, --set overrides, and bad values rejected with the field named."""

import pytest

from vriksha.errors import ConfigError
from vriksha.train.config import load_config, parse_override


def test_yaml_and_toml_with_overrides(tmp_path):
    y = tmp_path / "a.yaml"
    y.write_text("rollout:\n  group_size: 4\noptim:\n  lr: 3.0e-5\n")
    cfg = load_config(
        y, ["optim.lr=1e-5", "grpo.kl_coef=0.05", "env.options.level=2", "trainer.stop_after=null"]
    )
    assert cfg.rollout.group_size == 4
    assert cfg.optim.lr == pytest.approx(1e-5)
    assert cfg.grpo.kl_coef == pytest.approx(0.05)
    assert cfg.env.options == {"level": 2}
    assert cfg.trainer.stop_after is None
    t = tmp_path / "b.toml"
    t.write_text('[env]\nname = "calculator_tools"\n[trainer]\nsteps = 7\n')
    cfg = load_config(t)
    assert cfg.env.name == "calculator_tools" and cfg.trainer.steps == 7


def test_shipped_configs_validate():
    from pathlib import Path

    root = Path(__file__).resolve().parents[2] / "configs"
    files = sorted(root.glob("grpo_*.yaml"))
    assert len(files) >= 2
    for f in files:
        load_config(f)


@pytest.mark.parametrize(
    "override, field",
    [
        ("grpo.clip_low=1.5", "grpo.clip_low"),
        ("grpo.clip_high=-0.1", "grpo.clip_high"),
        ("rollout.group_size=1", "rollout.group_size"),
        ("rollout.temperature=0", "rollout.temperature"),
        ("optim.lr=-1", "optim.lr"),
        ("optim.lr=fast", "optim.lr"),
        ("optim.betas=[0.9, 1.5]", "optim.betas"),
        ("optim.schedule=exponential", "optim.schedule"),
        ("trainer.steps=0", "trainer.steps"),
        ("trainer.eval_interval=-1", "trainer.eval_interval"),
        ("rollout.gruop_size=4", "rollout.gruop_size"),
        ("grpo.kl_coef=-0.1", "grpo.kl_coef"),
    ],
)
def test_bad_values_name_the_field(override, field):
    with pytest.raises(ConfigError) as exc:
        load_config(None, [override])
    assert f"{field}:" in str(exc.value)


def test_bad_files_and_overrides(tmp_path):
    with pytest.raises(ConfigError, match="not found"):
        load_config(tmp_path / "missing.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("- a list\n")
    with pytest.raises(ConfigError, match="mapping"):
        load_config(bad)
    with pytest.raises(ConfigError, match="KEY=VALUE"):
        parse_override("optim.lr")


def test_nproc_is_stripped_before_torchrun():
    from vriksha.launch.torchrun import strip_launch_flags

    assert strip_launch_flags(["c.yaml", "--nproc", "2", "--set", "a.b=1", "--nproc=3", "--resume"]) == [
        "c.yaml",
        "--set",
        "a.b=1",
        "--resume",
    ]
