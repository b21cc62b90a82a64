"""Running a training script as its author will: ``python script.py ...`` for one process, and
``torchrun --standalone --nproc-per-node N script.py ...`` for N workers, with each rank's output
in a file of its own (torchrun's ``--log-dir`` and ``--redirects 3``), so that a grader can tell
which rank printed what.

Each worker gets ``cores // N`` threads (at least 1) through ``OMP_NUM_THREADS``, and Gloo's
sockets are put on the loopback interface (``GLOO_SOCKET_IFNAME``, unless the reader set it).
torchrun's own rendezvous store cannot be put there from its command line: in torch 2.13 it
listens on every interface of this machine, whatever address it is given, for as long as the run
lasts (notebook 10, section 8, says what that exposes).
"""

from __future__ import annotations

import os
import shlex
import shutil
import signal
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from helpers.data import HARData
from helpers.data.files import atomic_write
from helpers.dist.cores import available_cores
from helpers.dist.launch import loopback_interface

MARK = ".ddp-script-run"  # in every folder run_script made, so that it clears only its own
LOGS = "logs"


class ScriptFailed(RuntimeError):
    """A run that exited with an error: the first failing rank's last lines say why."""


@dataclass
class ScriptRun:
    """What one run of a script printed: every rank's stdout and stderr, in rank order."""

    command: list[str]  # as started (this Python's -m torch.distributed.run for torchrun)
    world: int  # 1 for a plain one-process run
    folder: Path  # the run's folder: torchrun's logs, and whatever the script writes there
    returncode: int
    stdout: list[str]
    stderr: list[str]
    launcher_stderr: str  # torchrun's own (empty for a plain one-process run)
    env: dict[str, str] = field(default_factory=dict)  # the variables run_script set for it

    @property
    def shown(self) -> str:
        """The command as a reader types it: ``torchrun`` or ``python``."""
        words = list(self.command)
        if words[1:3] == ["-m", "torch.distributed.run"]:
            words[:3] = ["torchrun"]
        else:
            words[0] = "python"
        return shlex.join(words)

    @property
    def rerun(self) -> str:
        """``shown`` after the variables run_script set (``OMP_NUM_THREADS=1
        GLOO_SOCKET_IFNAME=lo torchrun ...``): pasted into a shell, it repeats the run, threads
        included, which the rounding depends on."""
        prefix = [f"{name}={shlex.quote(value)}" for name, value in self.env.items()]
        return " ".join([*prefix, self.shown])

    def lines(self, rank: int, start: str) -> list[str]:
        """The lines of ``rank``'s stdout that begin with ``start``."""
        return [line for line in self.stdout[rank].splitlines() if line.startswith(start)]

    def check(self) -> ScriptRun:
        """This run, if it succeeded; else a ``ScriptFailed`` that says which rank failed and
        its last lines of stderr."""
        if self.returncode == 0:
            return self
        failed = next((r for r, err in enumerate(self.stderr) if err.strip()), None)
        text = self.stderr[failed] if failed is not None else self.launcher_stderr
        tail = " | ".join(text.strip().splitlines()[-3:])
        where = f"rank {failed}" if failed is not None else "the launcher"
        raise ScriptFailed(f"{self.shown} exited with {self.returncode}; {where}: {tail}")


def write_npz(data: HARData, path: Path) -> Path:
    """The four arrays a script trains and tests on, in one ``.npz`` file that NumPy reads
    without this course's code (written beside and renamed: never half-written)."""
    arrays = {k: getattr(data, k) for k in ("X_train", "y_train", "X_test", "y_test")}
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write(path, lambda f: np.savez(f, **arrays))
    return path


def _fresh(folder: Path) -> None:
    """An empty run folder: a previous run's folder is cleared, any other folder refused."""
    if folder.exists():
        if not (folder / MARK).exists() and any(folder.iterdir()):
            raise ValueError(f"{folder} holds files run_script did not write: choose a new folder")
        shutil.rmtree(folder)
    folder.mkdir(parents=True)
    (folder / MARK).touch()


def torchrun_command(script: Path, args: list[str], world: int, folder: Path) -> list[str]:
    """``torchrun --standalone --nproc-per-node WORLD`` with each rank's output in its own file
    under ``FOLDER/logs`` (``--redirects 3``: stdout and stderr, out of the terminal)."""
    return [
        sys.executable, "-m", "torch.distributed.run", "--standalone",
        "--nproc-per-node", str(world), "--log-dir", str(folder / LOGS), "--redirects", "3",
        str(script), *args,
    ]  # fmt: skip


def _rank_logs(folder: Path, world: int, stream: str) -> list[str]:
    found = []
    for rank in range(world):
        files = sorted((folder / LOGS).glob(f"*/attempt_*/{rank}/{stream}.log"))
        found.append(files[-1].read_text() if files else "")
    return found


def _stop(process: subprocess.Popen) -> None:
    """Ask torchrun to stop its workers (SIGTERM, which it passes on to them), and kill it if
    it has not within 30 s."""
    process.send_signal(signal.SIGTERM)
    try:
        process.communicate(timeout=30)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.communicate()


def run_script(
    script: Path,
    args: list[str],
    folder: Path,
    world: int | None = None,
    timeout: float = 300,
    threads_per_worker: int | None = None,
) -> ScriptRun:
    """Run ``script ARGS`` in one plain process (``world=None``) or under torchrun on ``world``
    workers, and return what every rank printed; ``folder`` is emptied first (only a folder
    this function made before, or an empty one). Each worker gets ``threads_per_worker``
    intra-op threads (``OMP_NUM_THREADS``; default: the cores shared out): a comparison bit for
    bit with another training needs its thread count, since threads change the rounding. On a
    timeout (a ``ScriptFailed``) or Ctrl-C, torchrun is told to stop its workers, and killed if
    it has not within 30 s."""
    if world is not None and world < 1:
        raise ValueError(f"world must be at least 1 (or None for one plain process), got {world}")
    if threads_per_worker is not None and threads_per_worker < 1:
        raise ValueError(f"threads_per_worker must be at least 1, got {threads_per_worker}")
    _fresh(folder)
    threads = threads_per_worker or max(1, available_cores() // (world or 1))
    shown_env = {
        "OMP_NUM_THREADS": str(threads),
        "GLOO_SOCKET_IFNAME": os.environ.get("GLOO_SOCKET_IFNAME") or loopback_interface(),
    }
    env = {**os.environ, **shown_env}
    if world is None:
        command = [sys.executable, str(script), *args]
    else:
        command = torchrun_command(script, args, world, folder)
    process = subprocess.Popen(
        command,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        start_new_session=True,  # Ctrl-C in the notebook reaches us, not torchrun: we stop it
    )
    try:
        out, err = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        _stop(process)
        raise ScriptFailed(
            f"{shlex.join(command[-len(args) - 1 :])} did not finish within {timeout:.0f} s and "
            "was stopped: is a rank waiting in a collective that another never reached?"
        ) from None
    except BaseException:  # Ctrl-C
        _stop(process)
        raise
    if world is None:
        return ScriptRun(command, 1, folder, process.returncode, [out], [err], "", shown_env)
    return ScriptRun(
        command,
        world,
        folder,
        process.returncode,
        _rank_logs(folder, world, "stdout"),
        _rank_logs(folder, world, "stderr"),
        err,
        shown_env,
    )
