"""rollout.release_during_update: the option (also written under rollout.engine), its refusals, and a short
run with it on that trains exactly as the run without it (the pool is freed and taken back around each
update; the prefix cache is dropped at an update either way)."""

from __future__ import annotations

import pytest

from tests.train.trainer_runs import eval_rows, metrics_rows, run_trainer, write_config
from vriksha.errors import ConfigError
from vriksha.train.config import TrainConfig, load_config


def test_the_option_under_rollout_engine_is_the_rollout_option():
    cfg = load_config(None, ["rollout.engine.release_during_update=true", "rollout.engine.max_num_seqs=8"])
    assert cfg.rollout.release_during_update and cfg.rollout.engine.max_num_seqs == 8
    assert TrainConfig.from_dict(cfg.to_dict()).rollout.release_during_update
    assert load_config(None, ["rollout.release_during_update=true"]).rollout.release_during_update
    assert not load_config(None, []).rollout.release_during_update
    with pytest.raises(ConfigError, match="given twice"):
        load_config(
            None, ["rollout.engine.release_during_update=true", "rollout.release_during_update=false"]
        )


@pytest.mark.parametrize(
    ("override", "message"),
    [("rollout.mode=server", "server mode"), ("rollout.max_staleness=1", "off-policy")],
)
def test_refused_where_there_is_no_colocated_pool_to_free_during_the_update(override, message):
    with pytest.raises(ConfigError, match=message):
        load_config(None, ["rollout.release_during_update=true", override])


@pytest.mark.slow
def test_a_run_with_the_pool_released_trains_as_the_run_without(tiny_model_dir, tmp_path):
    runs = {}
    for release in (False, True):
        name = f"release_{release}"
        path = write_config(tmp_path, tiny_model_dir, name, checkpoint_interval=0)
        text = path.read_text().replace(
            "engine:\n", f"engine:\n    release_during_update: {str(release).lower()}\n", 1
        )
        path.write_text(text)
        run_trainer([str(path)])
        runs[release] = tmp_path / name
    assert load_config(tmp_path / "release_True.yaml").rollout.release_during_update
    drop = ("memory/",)
    rows = {
        r: [{k: v for k, v in row.items() if not k.startswith(drop)} for row in metrics_rows(out)]
        for r, out in runs.items()
    }
    assert len(rows[True]) == 4 and rows[True] == rows[False]
    assert eval_rows(runs[True]) == eval_rows(runs[False])
