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
    fsync_folder(path.parent)


def fsync_folder(folder: Path) -> None:
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


def _open_lock(path: Path) -> int | None:
    """A descriptor on the lock file, created if needed with mode 0666 less the umask (so that
    everyone who may write the folder may lock it); read-only where writing is refused (another
    user's lock file, a read-only folder or file system: flock needs no write access); None where
    it cannot be opened at all (no lock file in a folder nobody may write)."""
    with contextlib.suppress(OSError):
        path.parent.mkdir(parents=True, exist_ok=True)
    for flags in (os.O_RDWR | os.O_CREAT, os.O_RDONLY):
        with contextlib.suppress(OSError):
            return os.open(path, flags, 0o666)
    return None


def _flock(fd: int, path: Path) -> bool:
    """Lock fd exclusively, waiting (with a notice) while another process holds it; False where
    the file system refuses locks (NFS may, on a read-only descriptor)."""
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return True
    except BlockingIOError:
        pass
    except OSError:
        return False
    print(
        f"notice: waiting for another process that is preparing the data in {path.parent}/ ...",
        file=sys.stderr,
        flush=True,
    )
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
    except OSError:
        return False
    return True


@contextlib.contextmanager
def locked(path: Path) -> Iterator[bool]:
    """Hold an exclusive lock (``fcntl.flock``) on the lock file ``path`` for the block, so that
    a second process (two notebooks, a notebook and ``make test``) waits for the first instead
    of seeing its half-built files. Prints a notice when it has to wait.

    Re-entrant within a process (not across threads). The lock file is created if needed and
    left in place (removing it would race with the next locker); another user's lock file is
    locked through a read-only descriptor. Where there is no lock file and none can be created
    (a read-only folder) nobody can write there either, and the block runs unlocked. Yields
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
    fd = _open_lock(path)
    held = False
    try:
        held = fd is not None and _flock(fd, path)
    finally:
        if fd is not None and not held:  # also on Ctrl-C while waiting
            os.close(fd)
    if not held:
        yield False
        return
    _held[key] = 1
    try:
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
