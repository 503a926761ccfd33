"""Input handling: a local directory, a git checkout, an sdist archive, or `NAME==VERSION` from the index.

`prepare_source` gives a `Project`: a private copy of the source tree (build litter removed), its
content hash, and the git directory when the input was a git checkout.
"""

from __future__ import annotations

import hashlib
import logging
import os
import re
import shutil
import tarfile
import tempfile
import urllib.parse
import urllib.request
import zipfile
from dataclasses import dataclass
from pathlib import Path

from vriksha.repo2env.archive import UnpackLimits, extract_tar, extract_zip
from vriksha.repo2env.errors import SourceError

logger = logging.getLogger(__name__)

__all__ = ["Project", "prepare_source", "content_hash", "fetch_sdist", "LITTER", "copy_tree", "iter_files"]

# directories and files that are build or tool litter, never part of a task workspace
LITTER_DIRS = {
    ".git",
    ".hg",
    ".svn",
    "__pycache__",
    ".pytest_cache",
    ".mypy_cache",
    ".ruff_cache",
    ".tox",
    ".nox",
    ".venv",
    ".eggs",
    ".hypothesis",
    ".cache",
    ".idea",
    ".vscode",
    "htmlcov",
}
TOP_LITTER_DIRS = {
    "build",
    "dist",
    "venv",
    "env",
}  # litter only at the top level (a package may be named build)
LITTER = LITTER_DIRS | TOP_LITTER_DIRS
_LITTER_SUFFIXES = (".pyc", ".pyo", ".so", ".pyd", ".orig", ".rej", ".coverage")


def _is_litter(rel_parts: tuple[str, ...]) -> bool:
    if len(rel_parts) > 1 and rel_parts[0] in TOP_LITTER_DIRS:
        return True
    for part in rel_parts[:-1]:
        if part in LITTER_DIRS or part.endswith(".egg-info") or part.endswith(".dist-info"):
            return True
    name = rel_parts[-1]
    return (
        name in LITTER_DIRS
        or (len(rel_parts) == 1 and name in TOP_LITTER_DIRS)
        or name.endswith(_LITTER_SUFFIXES)
        or name.endswith(".egg-info")
        or name == ".coverage"
        or name.startswith(".coverage.")
    )


def iter_files(root: Path) -> list[Path]:
    """Relative paths of the non-litter files under `root`, sorted."""
    out = []
    for dirpath, dirnames, filenames in os.walk(root):
        rel_dir = Path(dirpath).relative_to(root)
        dirnames[:] = sorted(d for d in dirnames if not _is_litter((*rel_dir.parts, d)))
        for name in sorted(filenames):
            rel = rel_dir / name
            if not _is_litter(rel.parts) and not (Path(dirpath) / name).is_symlink():
                out.append(rel)
    return out


def copy_tree(src: Path, dst: Path) -> None:
    """Copy the non-litter files of `src` into `dst` (no .git, caches, build dirs or egg-info)."""
    dst.mkdir(parents=True, exist_ok=True)
    for rel in iter_files(src):
        target = dst / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(src / rel, target)


def content_hash(root: Path) -> str:
    """sha256 over the relative paths and bytes of the non-litter files."""
    h = hashlib.sha256()
    for rel in iter_files(root):
        h.update(rel.as_posix().encode() + b"\0")
        h.update(hashlib.sha256((root / rel).read_bytes()).digest())
    return h.hexdigest()


@dataclass(slots=True)
class Project:
    name: str
    root: Path  # a private copy, free of litter
    content_hash: str
    origin: str  # what the user passed
    git_dir: Path | None = None  # the original checkout, when the input was one


def _single_top(dest: Path) -> Path:
    entries = [p for p in dest.iterdir() if not p.name.startswith(".")]
    return entries[0] if len(entries) == 1 and entries[0].is_dir() else dest


_INDEX = os.environ.get("VRIKSHA_INDEX_URL", "https://pypi.org/simple")


def fetch_sdist(
    spec: str, dest_dir: Path, index_url: str | None = None, timeout: float = 30.0, max_bytes: int = 1 << 30
) -> Path:
    """Download the sdist of `NAME==VERSION` (or the newest of `NAME`) from a PEP 503 index (at most
    `max_bytes`)."""
    name, _, version = spec.partition("==")
    norm = re.sub(r"[-_.]+", "-", name).lower()
    url = f"{(index_url or _INDEX).rstrip('/')}/{norm}/"
    try:
        page = urllib.request.urlopen(url, timeout=timeout).read().decode("utf-8", "replace")
    except OSError as exc:
        raise SourceError(
            f"cannot reach the package index at {url}: {exc}; pass a local path instead"
        ) from exc
    links = re.findall(r'href="([^"]+)"', page)
    name_re = "[-_.]".join(re.escape(part) for part in norm.split("-"))
    pattern = re.compile(rf"^{name_re}-(.+?)\.(tar\.gz|zip)$", re.I)
    found: list[tuple[str, str]] = []
    for link in links:
        fname = urllib.parse.unquote(urllib.parse.urlparse(link).path.rsplit("/", 1)[-1])
        m = pattern.match(fname)
        if m and (not version or m.group(1) == version):
            found.append((fname, urllib.parse.urljoin(url, link)))
    if not found:
        raise SourceError(f"no sdist for {spec!r} at {url}; check the name and version")
    fname, link = found[-1]
    dest_dir.mkdir(parents=True, exist_ok=True)
    target = dest_dir / fname
    if not target.exists():
        try:
            data = urllib.request.urlopen(link, timeout=timeout).read(max_bytes + 1)
        except OSError as exc:
            raise SourceError(f"cannot download {link}: {exc}") from exc
        if len(data) > max_bytes:
            raise SourceError(
                f"{link} is larger than {max_bytes / (1 << 20):,.0f} MiB (the cap on unpacked bytes): refused; "
                "raise --max-unpacked-mb if it is trusted"
            )
        frag = urllib.parse.urlparse(link).fragment
        if frag.startswith("sha256=") and hashlib.sha256(data).hexdigest() != frag[7:]:
            raise SourceError(f"sha256 mismatch for {link}; the download is corrupt, try again")
        target.write_bytes(data)
    return target


def _project_name(root: Path, fallback: str) -> str:
    text = ""
    for fname in ("pyproject.toml", "setup.cfg", "setup.py", "PKG-INFO"):
        p = root / fname
        if p.is_file():
            text = p.read_text(errors="replace")
            m = re.search(r"""^\s*name\s*[=:]\s*["']?([A-Za-z0-9_.\-]+)""", text, re.M | re.I) or re.search(
                r"""name\s*=\s*["']([A-Za-z0-9_.\-]+)["']""", text
            )
            if m:
                return m.group(1)
    return fallback


def prepare_source(source: str | Path, work_dir: Path, limits: UnpackLimits | None = None) -> Project:
    """Turn SOURCE into a private, litter-free copy under `work_dir`; an archive is unpacked within
    `limits` (default `UnpackLimits()`: 1 GiB, 100,000 entries)."""
    limits = limits or UnpackLimits()
    origin = str(source)
    src = Path(source).expanduser()
    work_dir.mkdir(parents=True, exist_ok=True)
    git_dir = None
    if src.is_dir():
        if (src / ".git").exists():
            git_dir = src.resolve()
        base = src.resolve()
    elif src.is_file() and (
        src.name.endswith((".tar.gz", ".tgz", ".tar.bz2", ".tar")) or src.suffix == ".zip"
    ):
        unpack = Path(tempfile.mkdtemp(prefix="unpack-", dir=work_dir))
        try:
            if src.suffix == ".zip":
                extract_zip(src, unpack, limits)
            else:
                extract_tar(src, unpack, limits)
        except (tarfile.TarError, zipfile.BadZipFile, OSError, SourceError) as exc:
            shutil.rmtree(unpack, ignore_errors=True)
            if isinstance(exc, SourceError):
                raise
            raise SourceError(f"cannot unpack {src}: {exc}; pass a valid sdist (.tar.gz or .zip)") from exc
        base = _single_top(unpack)
    elif not src.exists() and re.fullmatch(r"[A-Za-z0-9_.\-]+(==[A-Za-z0-9_.!+\-]+)?", origin):
        archive = fetch_sdist(origin, work_dir / "downloads", max_bytes=limits.max_bytes)
        return prepare_source(archive, work_dir, limits)
    else:
        raise SourceError(
            f"source {origin!r} is neither a directory, a git checkout, an sdist archive nor NAME==VERSION"
        )
    if not any(base.glob("*.py")) and not any(base.rglob("*.py")):
        raise SourceError(f"{origin}: no Python files found; repo2env needs a Python project")
    digest = content_hash(base)
    root = work_dir / f"src-{digest[:12]}"
    if not root.exists():
        tmp = Path(tempfile.mkdtemp(prefix="copy-", dir=work_dir))
        copy_tree(base, tmp)
        tmp.rename(root)
    return Project(
        name=_project_name(root, base.name), root=root, content_hash=digest, origin=origin, git_dir=git_dir
    )
