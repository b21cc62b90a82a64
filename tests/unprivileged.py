"""A child process that file permissions bind, even when the tests run as root: for data folders
shared read-only and lock files that belong to another user."""

from __future__ import annotations

import ctypes
import os
import subprocess
import sys
from pathlib import Path

import pytest

# unshare(2)'s flag for a new user namespace: with no uid mapped into it, even root is refused
# writes that the permission bits refuse (capabilities there cover no file from outside it)
CLONE_NEWUSER = 0x10000000
NOT_ENFORCED = 77  # the exit status of a child that finds it may write what it should not


def _drop_privileges() -> None:  # preexec_fn: runs in the child between fork and exec
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.unshare(CLONE_NEWUSER) != 0:
        raise OSError(ctypes.get_errno(), "unshare(CLONE_NEWUSER)")


def unprivileged(code: str, read_only: Path, **popen) -> subprocess.Popen:
    """Start ``python -c code`` as a process that file permissions bind, checking first that it
    cannot write into read_only (it exits NOT_ENFORCED if it can).

    As root, permissions are not enforced: the child then runs in a user namespace of its own,
    where root has no power over files outside it but still reads them as their owner (the
    interpreter may lie under /root, which setuid to nobody could not read). Skips where neither
    is possible."""
    probe = f"""
import os, sys
try:
    os.close(os.open({str(read_only / ".probe")!r}, os.O_WRONLY | os.O_CREAT, 0o600))
except OSError:
    pass
else:
    sys.exit({NOT_ENFORCED})
"""
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).parents[1])}
    env["PYTHONDONTWRITEBYTECODE"] = "1"  # the child may not write __pycache__ either
    kwargs = {"preexec_fn": _drop_privileges} if os.geteuid() == 0 else {}
    try:
        return subprocess.Popen([sys.executable, "-c", probe + code], env=env, **kwargs, **popen)
    except (subprocess.SubprocessError, OSError) as err:
        pytest.skip(f"running as root, and no user namespace to drop privileges in ({err})")


def finish(proc: subprocess.Popen, timeout: float = 120) -> tuple[str, str]:
    """The child's output, once it ends; skip if it found that permissions are not enforced."""
    try:
        out, err = proc.communicate(timeout=timeout)
    finally:
        if proc.poll() is None:
            proc.kill()
    if proc.returncode == NOT_ENFORCED:
        pytest.skip("file permissions are not enforced for the test's child process here")
    return out, err
