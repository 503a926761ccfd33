"""The task format: one directory per task, plus a dataset manifest with per-task hashes.

DIR/manifest.json                     DatasetManifest
DIR/venvs/<key>.json                  the venv a task runs in (path and pip freeze, to rebuild it)
DIR/tasks/<id>/task.json              TaskMeta
DIR/tasks/<id>/instruction.md         what the agent is told
DIR/tasks/<id>/workspace.tar.gz       the agent's starting tree (no solution, no hidden tests, no .git)
DIR/tasks/<id>/hidden/tests.tar.gz    withheld test files (mode 0700: unreadable from the sandbox)
DIR/tasks/<id>/solution/files.tar.gz  the reference solution's files (+ deleted.json)
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import tarfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

from vriksha.repo2env.archive import UnpackLimits, read_tar_files
from vriksha.repo2env.errors import SourceError, TaskFormatError

__all__ = [
    "TaskMeta",
    "DatasetManifest",
    "ManifestEntry",
    "TaskFiles",
    "write_task",
    "load_task",
    "load_manifest",
    "write_manifest",
    "pack_files",
    "unpack_files",
    "file_sha256",
]

FORMAT_VERSION = 1


class TaskMeta(BaseModel):
    model_config = ConfigDict(extra="forbid")

    id: str
    format_version: int = FORMAT_VERSION
    repo: str
    repo_origin: str
    base_hash: str  # content hash of the project (or commit tree) the task was cut from
    workspace_hash: str  # sha256 of workspace.tar.gz
    pipeline: str
    target: str
    fail_to_pass: list[str]
    pass_to_pass: list[str]
    hidden_files: list[str]
    solution_files: list[str]
    venv_key: str
    pytest_extra_args: list[str] = Field(default_factory=list)
    timeout_s: float = 120.0
    timings: dict[str, float] = Field(default_factory=dict)
    created_at: float = Field(default_factory=time.time)


class ManifestEntry(BaseModel):
    id: str
    pipeline: str
    sha256: dict[str, str]  # file name in the task dir -> sha256


class DatasetManifest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    format_version: int = FORMAT_VERSION
    source: str
    repo: str
    created_at: float = Field(default_factory=time.time)
    tasks: list[ManifestEntry] = Field(default_factory=list)
    report: dict = Field(default_factory=dict)


@dataclass(slots=True)
class TaskFiles:
    """A task in memory: its metadata and the four pieces the format keeps apart."""

    meta: TaskMeta
    instruction: str
    workspace: dict[str, bytes]
    hidden: dict[str, bytes]
    solution: dict[str, bytes]
    deleted: list[str] = field(default_factory=list)  # files the solution removes
    path: Path | None = None


def file_sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def pack_files(files: dict[str, bytes]) -> bytes:
    """A deterministic tar.gz (sorted, mtime 0, uid 0)."""
    buf = io.BytesIO()
    import gzip

    with gzip.GzipFile(fileobj=buf, mode="wb", mtime=0) as gz, tarfile.open(fileobj=gz, mode="w") as tf:
        for rel in sorted(files):
            info = tarfile.TarInfo(rel)
            info.size = len(files[rel])
            info.mode = 0o644
            info.mtime = 0
            tf.addfile(info, io.BytesIO(files[rel]))
    return buf.getvalue()


def unpack_files(data: bytes, what: str = "a packed task file") -> dict[str, bytes]:
    """The files of a `pack_files` archive, within the default unpack caps (a dataset may come from elsewhere)."""
    try:
        return read_tar_files(data, UnpackLimits(), what)
    except SourceError as exc:
        raise TaskFormatError(str(exc)) from None


def write_task(out_dir: Path, task: TaskFiles) -> ManifestEntry:
    d = out_dir / "tasks" / task.meta.id
    (d / "hidden").mkdir(parents=True, exist_ok=True)
    (d / "solution").mkdir(parents=True, exist_ok=True)
    ws = pack_files(task.workspace)
    task.meta.workspace_hash = hashlib.sha256(ws).hexdigest()
    (d / "workspace.tar.gz").write_bytes(ws)
    (d / "hidden" / "tests.tar.gz").write_bytes(pack_files(task.hidden))
    (d / "solution" / "files.tar.gz").write_bytes(pack_files(task.solution))
    (d / "solution" / "deleted.json").write_text(json.dumps(sorted(task.deleted)))
    (d / "instruction.md").write_text(task.instruction)
    (d / "task.json").write_text(task.meta.model_dump_json(indent=1))
    for private in (d / "hidden", d / "solution"):
        os.chmod(private, 0o700)
        for f in private.iterdir():
            os.chmod(f, 0o600)
    task.path = d
    names = [
        "task.json",
        "instruction.md",
        "workspace.tar.gz",
        "hidden/tests.tar.gz",
        "solution/files.tar.gz",
        "solution/deleted.json",
    ]
    return ManifestEntry(
        id=task.meta.id, pipeline=task.meta.pipeline, sha256={n: file_sha256(d / n) for n in names}
    )


def load_task(task_dir: Path, entry: ManifestEntry | None = None) -> TaskFiles:
    """Read a task directory back (and check its files against the manifest entry when given)."""
    try:
        meta = TaskMeta.model_validate_json((task_dir / "task.json").read_text())
    except FileNotFoundError as exc:
        raise TaskFormatError(
            f"{task_dir}: no task.json; is this a task directory made by `vriksha repo2env`?"
        ) from exc
    if entry is not None:
        for name, digest in entry.sha256.items():
            path = task_dir / name
            if not path.is_file() or file_sha256(path) != digest:
                raise TaskFormatError(
                    f"{path}: missing or its sha256 differs from the manifest; rebuild the task"
                )
    ws_bytes = (task_dir / "workspace.tar.gz").read_bytes()
    if hashlib.sha256(ws_bytes).hexdigest() != meta.workspace_hash:
        raise TaskFormatError(f"{task_dir}/workspace.tar.gz does not match workspace_hash in task.json")
    return TaskFiles(
        meta=meta,
        instruction=(task_dir / "instruction.md").read_text(),
        workspace=unpack_files(ws_bytes, f"{task_dir}/workspace.tar.gz"),
        hidden=unpack_files(
            (task_dir / "hidden" / "tests.tar.gz").read_bytes(), f"{task_dir}/hidden/tests.tar.gz"
        ),
        solution=unpack_files(
            (task_dir / "solution" / "files.tar.gz").read_bytes(), f"{task_dir}/solution/files.tar.gz"
        ),
        deleted=json.loads((task_dir / "solution" / "deleted.json").read_text()),
        path=task_dir,
    )


def write_manifest(out_dir: Path, manifest: DatasetManifest) -> None:
    (out_dir / "manifest.json").write_text(manifest.model_dump_json(indent=1))


def load_manifest(out_dir: Path) -> DatasetManifest:
    path = out_dir / "manifest.json"
    if not path.is_file():
        raise TaskFormatError(
            f"{out_dir}: no manifest.json; point at a directory made by `vriksha repo2env SOURCE --out DIR`"
        )
    return DatasetManifest.model_validate_json(path.read_text())
