"""Data files on disk: written so that a reader never sees half of one, guarded against two
processes building the same cache at once, cleaned up after a killed run, and keyed by content.

Every data source (uci, standin, ...) uses these the same way::

    with locked(root / ".uci.lock"):           # a second process waits here for the first
        remove_stale(root, (".download-*.tmp", ".staging-*"))  # what a killed run left
        ...                                    # check the cache, build it if needed
        atomic_write(path, lambda f: ...)      # readers never see half a file
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import shutil
import sys
import uuid
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import IO


def atomic_write(path: Path, write: Callable[[IO[bytes]], object]) -> None:
    """Write via a temporary file and os.replace, so readers never see a half-written file, and
    fsync the file before the rename and its folder after it, so that a crash of the machine
    (not only of this process) leaves the old file or the whole new one, never an empty one.

    The temporary file is ``.<name>.<pid>.<random>.tmp`` beside ``path``, removed if anything
    fails; only a writer killed outright leaves it, matching ``.<name>*.tmp`` for
    :func:`remove_stale`.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.parent / f".{path.name}.{os.getpid()}.{uuid.uuid4().hex[:8]}.tmp"
    try:
        with open(tmp, "xb") as f:  # unlike mkstemp, keeps the usual permissions
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    _fsync_folder(path.parent)


def _fsync_folder(folder: Path) -> None:
    """Make a rename in ``folder`` durable. Some systems cannot open or fsync a folder (Windows,
    some network file systems): there the rename is as durable as the system makes it."""
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        with contextlib.suppress(OSError):
            os.fsync(fd)
    finally:
        os.close(fd)


_held: dict[Path, int] = {}  # lock files this process holds, with their nesting depth


@contextlib.contextmanager
def locked(path: Path) -> Iterator[bool]:
    """Hold an exclusive lock (``fcntl.flock``) on the lock file ``path`` for the block, so that
    a second process (two notebooks, a notebook and ``make test``) waits for the first instead
    of seeing its half-built files. Prints a notice when it has to wait.

    Re-entrant within a process (not across threads). The lock file is created if needed and
    left in place (removing it would race with the next locker). Where it cannot be created (a
    read-only folder) nobody can write there either, and the block runs unlocked. Yields
    whether the lock is held.
    """
    key = path.absolute()
    if key in _held:
        _held[key] += 1
        try:
            yield True
        finally:
            _held[key] -= 1
        return
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError:
        yield False
        return
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            print(
                f"notice: waiting for another process that is preparing the data in "
                f"{path.parent}/ ...",
                file=sys.stderr,
                flush=True,
            )
            fcntl.flock(fd, fcntl.LOCK_EX)
        _held[key] = 1
        yield True
    finally:
        _held.pop(key, None)
        os.close(fd)  # releases the lock


def remove_stale(root: Path, patterns: Iterable[str]) -> list[Path]:
    """Remove what killed runs left in root (files or folders matching the glob ``patterns``,
    relative to root) and return what was removed.

    Only call it while holding the :func:`locked` lock that every writer of these files holds:
    then nothing matching can belong to a live run.
    """
    removed = []
    for pattern in patterns:
        for path in root.glob(pattern):
            with contextlib.suppress(OSError):
                if path.is_dir() and not path.is_symlink():
                    shutil.rmtree(path)
                else:
                    path.unlink()
                removed.append(path)
    return removed


def hash_key(*parts: object) -> str:
    """A SHA-256 hex digest of ``parts`` (bytes as they are, anything else by its ``repr``):
    a cache key that changes whenever any of its inputs does."""
    h = hashlib.sha256()
    for part in parts:
        data = part if isinstance(part, bytes) else repr(part).encode()
        h.update(len(data).to_bytes(8, "little"))  # so that ("ab", "c") != ("a", "bc")
        h.update(data)
    return h.hexdigest()
