"""A dataset on disk: its manifest, its tasks, and the venvs they run in (rebuilt from the freeze if gone)."""

from __future__ import annotations

import json
import logging
import shutil
from pathlib import Path

from vriksha.repo2env.bootstrap import Venv, _lock, _seed, cache_root, copy_venv
from vriksha.repo2env.errors import BootstrapError, TaskFormatError
from vriksha.repo2env.task import DatasetManifest, TaskFiles, load_manifest, load_task
from vriksha.repo2env.venv_install import install, venv_box

logger = logging.getLogger(__name__)

__all__ = ["Dataset"]


class Dataset:
    def __init__(self, root: Path | str) -> None:
        self.root = Path(root)
        self.manifest: DatasetManifest = load_manifest(self.root)
        self._entries = {e.id: e for e in self.manifest.tasks}

    @property
    def task_ids(self) -> list[str]:
        return sorted(self._entries)

    def task(self, task_id: str) -> TaskFiles:
        if task_id not in self._entries:
            raise TaskFormatError(f"no task {task_id!r} in {self.root}; it has {len(self._entries)} task(s)")
        return load_task(self.root / "tasks" / task_id, self._entries[task_id])

    def venv(self, key: str) -> Path:
        """The task's venv; recreated from its recorded pip freeze when the cached one is gone."""
        spec_path = self.root / "venvs" / f"{key}.json"
        if not spec_path.is_file():
            raise TaskFormatError(f"{spec_path} is missing; rebuild the dataset with `vriksha repo2env`")
        venv = Venv.from_json(json.loads(spec_path.read_text()))
        if venv.python.exists():
            return venv.path
        target = cache_root() / "venvs" / key
        with _lock(cache_root() / "venvs" / f"{key}.lock"):
            if (target / "bin" / "python").exists():
                return target
            shutil.rmtree(target, ignore_errors=True)
            reqs = [r for r in venv.freeze if " @ file://" not in r]
            with venv_box(target.parent, f"{key}-") as fresh:
                copy_venv(_seed(), fresh)
                failed = install(fresh, reqs, f"the venv {key} (from {spec_path})") if reqs else None
                if failed is not None:
                    raise BootstrapError(f"cannot recreate venv {key}: {failed.stderr[-1500:]}")
                fresh.rename(target)
            logger.info("recreated venv %s from its freeze", key)
        return target
