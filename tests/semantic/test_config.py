"""The routes file: a good one loads; each kind of mistake is refused with the field it is in."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest

from vriksha.errors import ConfigError
from vriksha.router.semantic.config import load_routes, parse_routes

GOOD = {
    "pools": [
        {"name": "fast", "replicas": ["http://127.0.0.1:1"]},
        {"name": "careful", "replicas": ["http://127.0.0.1:2,tcp://127.0.0.1:3"], "policy": "precise"},
    ],
    "signals": {
        "keyword": [{"name": "mathy", "keywords": ["integral"], "regex": [r"\d+\s*[*/+-]\s*\d+"]}],
        "classifier": [{"name": "intent", "labels": ["math", "chat"]}],
        "safety": [{"name": "jb", "kind": "jailbreak"}],
    },
    "decisions": [
        {"name": "block", "when": "jb", "action": "block"},
        {
            "name": "maths",
            "when": {"any": ["mathy", {"all": ["intent:math", {"not": "jb"}]}]},
            "pool": "careful",
        },
    ],
    "default": {"pool": "fast"},
}


def _bad(mutate) -> str:
    data = copy.deepcopy(GOOD)
    mutate(data)
    with pytest.raises(ConfigError) as info:
        parse_routes(data)
    return str(info.value)


def test_good_config_loads_and_resolves_head_next_to_file(tmp_path: Path):
    import yaml

    path = tmp_path / "routes.yaml"
    path.write_text(yaml.safe_dump(GOOD))
    cfg = load_routes(path)
    assert [p.name for p in cfg.pools] == ["fast", "careful"]
    assert cfg.virtual_model == "auto"
    assert cfg.head_path(cfg.signals.classifier[0]) == tmp_path / "routes.intent.static.safetensors"


@pytest.mark.parametrize(
    ("mutate", "expected"),
    [
        (lambda d: d["decisions"][1].update(pool="nowhere"), "decisions.1.pool: 'nowhere' is not a pool"),
        (lambda d: d["decisions"][1].update(when="nosuch"), "decisions.1.when: unknown signal 'nosuch'"),
        (lambda d: d["decisions"][1].update(when="intent:poetry"), "'poetry' is not one of intent's labels"),
        (lambda d: d["decisions"][1].update(when="intent"), "name the label"),
        (lambda d: d["decisions"][1].update(when={"xor": ["jb"]}), "unknown operator 'xor'"),
        (lambda d: d["default"].update(pool="gone"), "default.pool: 'gone' is not a pool"),
        (lambda d: d.pop("default"), "default: Field required"),
        (lambda d: d["pools"][0].update(replicas=["127.0.0.1:1"]), "pools.0.replicas"),
        (lambda d: d["pools"][0].update(policy="random"), "pools.0.policy"),
        (lambda d: d["pools"].append({"name": "fast", "replicas": ["http://x:1"]}), "'fast' is used twice"),
        (lambda d: d["signals"]["keyword"][0].update(regex=["("]), "does not compile"),
        (lambda d: d["signals"]["keyword"][0].update(wrods=["x"]), "signals.keyword.0.wrods"),
        (
            lambda d: d["decisions"][1].update(sampling={"temprature": 0}),
            "unknown sampling fields ['temprature']",
        ),
        (lambda d: d["decisions"][1].pop("pool"), "names its `pool`"),
        (lambda d: d.update(virtual_model="fast"), "also a pool's name"),
    ],
)
def test_mistakes_name_their_field(mutate, expected):
    assert expected in _bad(mutate)


def test_unreadable_and_non_yaml_files(tmp_path: Path):
    with pytest.raises(ConfigError, match="cannot read"):
        load_routes(tmp_path / "missing.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("pools: [\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_routes(bad)
    bad.write_text("- just a list\n")
    with pytest.raises(ConfigError, match="expected a mapping"):
        load_routes(bad)


def test_shipped_example_config_is_valid():
    cfg = load_routes(Path(__file__).resolve().parents[2] / "vriksha/router/semantic/prompts/routes.yaml")
    assert {p.name for p in cfg.pools} == {"fast", "careful"}
    assert cfg.signals.classifier[0].labels == ["chitchat", "math", "code", "writing", "factual"]


def test_a_pool_takes_replicas_or_a_fleet_section_and_fleet_errors_name_the_field():
    ok = copy.deepcopy(GOOD)
    ok["pools"][0] = {
        "name": "fast",
        "fleet": {"replicas": 2, "threads": 1, "serve_args": ["--max-batch", "4"]},
    }
    cfg = parse_routes(ok)
    assert cfg.pools[0].fleet.replicas == 2 and cfg.pools[0].replicas == []
    assert cfg.pools[0].fleet.model is None and cfg.pools[0].fleet.serve_args == ["--max-batch", "4"]

    def both(d):
        d["pools"][0]["fleet"] = {"replicas": 1}

    assert "pools.0: " in _bad(both) and "either `replicas`" in _bad(both)
    assert "either `replicas`" in _bad(lambda d: d["pools"][0].pop("replicas"))

    def fleet(**spec):
        return lambda d: d["pools"].__setitem__(0, {"name": "fast", "fleet": spec})

    assert "pools.0.fleet.replicas" in _bad(fleet(replicas=0))
    assert "pools.0.fleet.threads" in _bad(fleet(threads=0))
    assert "pools.0.fleet.gpus" in _bad(fleet(gpus=1))  # unknown field
    msg = _bad(fleet(serve_args=["--port=9000", "--max-batch", "4"]))
    assert "pools.0.fleet.serve_args" in msg and "--port" in msg
