"""Archive bombs: an sdist (tar or zip) that unpacks past the cap on bytes or entries is refused with an
error naming the archive and the cap, and leaves nothing unpacked behind; a normal sdist still unpacks."""

from __future__ import annotations

import io
import tarfile
import zipfile
from pathlib import Path

import pytest

from vriksha.repo2env.archive import UnpackLimits, read_tar_files
from vriksha.repo2env.errors import SourceError
from vriksha.repo2env.source import prepare_source
from vriksha.repo2env.task import pack_files

MIB = 1 << 20


class _Zeros(io.RawIOBase):
    """`n` zero bytes, read lazily (the bomb is built without holding it in memory)."""

    def __init__(self, n: int) -> None:
        self.left = n

    def readable(self) -> bool:
        return True

    def readinto(self, buf) -> int:
        k = min(len(buf), self.left)
        buf[:k] = bytes(k)
        self.left -= k
        return k


def _tar_bomb(path: Path, size: int, entries: int = 0) -> Path:
    with tarfile.open(path, "w:gz") as tf:
        for name, text in (("bomb-1.0/setup.py", b"# sdist\n"), ("bomb-1.0/bomb.py", b"X = 1\n")):
            info = tarfile.TarInfo(name)
            info.size = len(text)
            tf.addfile(info, io.BytesIO(text))
        if size:
            info = tarfile.TarInfo("bomb-1.0/zeros.bin")
            info.size = size
            tf.addfile(info, io.BufferedReader(_Zeros(size)))
        for i in range(entries):
            tf.addfile(tarfile.TarInfo(f"bomb-1.0/empty/{i}.txt"), io.BytesIO(b""))
    return path


def test_a_tar_bomb_stops_at_the_byte_cap(tmp_path):
    archive = _tar_bomb(tmp_path / "bomb-1.0.tar.gz", 48 * MIB)
    assert archive.stat().st_size < MIB  # a small archive ...
    work = tmp_path / "work"
    with pytest.raises(SourceError) as err:  # ... that would unpack to 48 MiB
        prepare_source(archive, work, UnpackLimits(max_bytes=8 * MIB))
    msg = str(err.value)
    assert str(archive) in msg and "8 MiB" in msg and "--max-unpacked-mb" in msg, msg
    left = sum(p.stat().st_size for p in work.rglob("*") if p.is_file())
    assert left == 0, f"{left} bytes left unpacked under {work}"


def test_a_tar_with_too_many_entries_is_refused(tmp_path):
    archive = _tar_bomb(tmp_path / "many-1.0.tar.gz", 0, entries=300)
    with pytest.raises(SourceError, match=r"more than 100 entries .*--max-unpacked-files"):
        prepare_source(archive, tmp_path / "work", UnpackLimits(max_files=100))


def test_a_zip_bomb_stops_at_the_byte_cap_and_the_entry_cap(tmp_path):
    archive = tmp_path / "zbomb-1.0.zip"
    with zipfile.ZipFile(archive, "w", zipfile.ZIP_DEFLATED) as zf:
        zf.writestr("zbomb-1.0/zbomb.py", "X = 1\n")
        with zf.open("zbomb-1.0/zeros.bin", "w", force_zip64=True) as out:
            for _ in range(32):
                out.write(bytes(MIB))
    assert archive.stat().st_size < MIB
    with pytest.raises(SourceError, match=r"zbomb-1\.0\.zip unpacks to more than 4 MiB"):
        prepare_source(archive, tmp_path / "work", UnpackLimits(max_bytes=4 * MIB))
    with pytest.raises(SourceError, match=r"more than 1 entries"):
        prepare_source(archive, tmp_path / "work2", UnpackLimits(max_files=1))


def test_a_normal_sdist_unpacks_within_the_default_caps(tmp_path):
    archive = _tar_bomb(tmp_path / "fine-1.0.tar.gz", MIB)
    project = prepare_source(archive, tmp_path / "work")
    assert (project.root / "bomb.py").read_text() == "X = 1\n"
    assert (project.root / "zeros.bin").stat().st_size == MIB


def test_packed_task_files_are_read_within_caps():
    data = pack_files({"a.py": b"x" * 4096, "b.py": b"y"})
    assert read_tar_files(data, UnpackLimits(), "t") == {"a.py": b"x" * 4096, "b.py": b"y"}
    with pytest.raises(SourceError, match="t unpacks to more than"):
        read_tar_files(data, UnpackLimits(max_bytes=1024), "t")
