"""Run several commands at once (torchrun on each node, a worker in each network namespace) and
leave nothing behind.

Each command starts in a session of its own, so that everything it starts (torchrun's workers)
shares its process group, and every group is killed at the end, whether its first process is
still alive or not: a command that exits while its children run on must not leave them behind.
All commands share one deadline. Their output goes to files, not pipes: a command that writes
more than a pipe holds while another is being waited for would otherwise block.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import tempfile
import time
from dataclasses import dataclass

STOP_GRACE = 15.0  # seconds torchrun's agent gets to stop its workers before everything is killed
# seconds the others get to end once one command has failed: a node whose peer died before it
# listened waits out its store's connect timeout (120 s, then a retry), as under srun
# --kill-on-bad-exit a job ends soon after any task fails
FAILED_GRACE = 20.0


@dataclass
class Finished:
    """What one command left: its exit code and everything it printed."""

    returncode: int
    stdout: str
    stderr: str


class TimedOut(TimeoutError):
    """Past the deadline: every command was stopped; ``finished`` holds what each printed."""

    def __init__(self, message: str, finished: list[Finished]) -> None:
        super().__init__(message)
        self.finished = finished


def run_together(
    commands: list[list[str]],
    timeout: float,
    env: dict[str, str] | None = None,
    failed_grace: float = FAILED_GRACE,
) -> list[Finished]:
    """Run ``commands`` at once and wait for all of them, ``timeout`` seconds at most in all.
    Raises ``TimedOut`` (a ``TimeoutError``) past it, after killing every command and what it
    started (as on Ctrl-C or any other error), with what they printed until then. Once one
    command has failed (a nonzero exit), the others get ``failed_grace`` seconds more, then are
    stopped: they return with the signal's exit code, and no error is raised."""
    with (
        tempfile.TemporaryDirectory(prefix="run-together-") as tmp,
        contextlib.ExitStack() as stack,
    ):
        procs, outputs = [], []
        try:
            for i, command in enumerate(commands):
                out, err = (stack.enter_context(open(f"{tmp}/{i}.{n}", "w+")) for n in "oe")
                outputs.append((out, err))
                procs.append(
                    subprocess.Popen(
                        command, stdout=out, stderr=err, text=True, env=env, start_new_session=True
                    )
                )
            timed_out = not _wait_all(procs, time.monotonic() + timeout, failed_grace)
        finally:
            _kill_every_group(procs)
        done = [Finished(p.returncode, *map(_read, o)) for p, o in zip(procs, outputs, strict=True)]
        if timed_out:
            raise TimedOut(f"{len(procs)} command(s) did not finish within {timeout:g} s", done)
        return done


def _read(file) -> str:  # noqa: ANN001 - an open text file
    file.seek(0)
    return file.read()


def _wait_all(procs: list[subprocess.Popen], deadline: float, failed_grace: float) -> bool:
    """Wait until every command has ended (True), ``deadline`` has passed (False), or
    ``failed_grace`` seconds after the first failure (True: the failure is the answer)."""
    stop_at = deadline
    while True:
        codes = [p.poll() for p in procs]
        if all(code is not None for code in codes):
            return True
        now = time.monotonic()
        if any(codes):  # the first failure sets it: later readings give later times
            stop_at = min(stop_at, now + failed_grace)
        if now >= stop_at:
            return stop_at < deadline
        time.sleep(min(0.1, stop_at - now))


def _kill_every_group(procs: list[subprocess.Popen], grace: float = STOP_GRACE) -> None:
    """Stop every command and what it started, then reap the commands. A command still running
    gets SIGTERM first, to its whole group: torchrun's agent starts each worker in a session of
    its own, out of the group's reach, and stops them itself on SIGTERM (a SIGKILL would leave
    them running). After ``grace`` seconds, SIGKILL to each group (it outlives its first
    process)."""
    running = [p for p in procs if p.poll() is None]
    for p in running:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(p.pid, signal.SIGTERM)
    deadline = time.monotonic() + grace
    for p in running:
        with contextlib.suppress(subprocess.TimeoutExpired):
            p.wait(max(0.0, deadline - time.monotonic()))
    for p in procs:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(p.pid, signal.SIGKILL)
    for p in procs:
        p.wait()
