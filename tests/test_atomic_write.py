"""helpers.data.files.atomic_write: readers see the old file or the whole new one, even after the
machine crashes (fsync), and a failed write leaves nothing behind."""

from __future__ import annotations

import os
import stat

import pytest

from helpers.data import files


def test_the_file_is_synced_before_the_rename_and_its_folder_after(tmp_path, monkeypatch):
    path = tmp_path / "LATEST"
    path.write_bytes(b"old")
    synced = []
    real_fsync = os.fsync

    def fsync(fd: int) -> None:
        mode = os.fstat(fd).st_mode
        kind = "folder" if stat.S_ISDIR(mode) else "file" if stat.S_ISREG(mode) else "other"
        synced.append((kind, path.read_bytes()))  # what a reader of path sees at that moment
        real_fsync(fd)

    monkeypatch.setattr(files.os, "fsync", fsync)
    files.atomic_write(path, lambda f: f.write(b"new"))
    assert synced == [("file", b"old"), ("folder", b"new")]
    assert path.read_bytes() == b"new"


def test_a_write_that_fails_leaves_the_old_file_and_no_temporary_one(tmp_path):
    path = tmp_path / "run.json"
    path.write_bytes(b"old")

    def fail(f) -> None:
        f.write(b"half")
        raise OSError("disk full")

    with pytest.raises(OSError, match="disk full"):
        files.atomic_write(path, fail)
    assert [p.name for p in tmp_path.iterdir()] == ["run.json"] and path.read_bytes() == b"old"
