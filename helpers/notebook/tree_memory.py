"""The memory a notebook takes on a shared machine: its kernel and every worker it starts, summed.

A student's kernel spawns worker processes, so one process's peak says little; what a hub must
provide is the peak of the sum over the process tree. Summed RSS counts the pages the processes
share (PyTorch's libraries, mapped by every worker) once per process, an upper bound; summed PSS
(proportional set size: each shared page divided among the processes that map it) counts them
once in all, which is close to what a container's memory limit is charged. Linux only (it reads
``/proc``); elsewhere nothing is sampled.
"""

from __future__ import annotations

import os
import threading
from dataclasses import dataclass
from pathlib import Path

PROC = Path("/proc")


def descendants(pid: int) -> list[int]:
    """Every process below ``pid`` (children, their children, ...), read from /proc."""
    children: dict[int, list[int]] = {}
    for entry in PROC.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:  # gone meanwhile
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])  # the name may hold spaces and parentheses
        children.setdefault(ppid, []).append(int(entry.name))
    found, todo = [], list(children.get(pid, []))
    while todo:
        child = todo.pop()
        found.append(child)
        todo += children.get(child, [])
    return found


def _kib(path: Path, field: str) -> int:
    try:
        for line in path.read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return 0


def tree_memory(pid: int) -> tuple[int, int]:
    """(summed RSS, summed PSS) in bytes of every process below ``pid``."""
    rss = pss = 0
    for child in descendants(pid):
        rss += _kib(PROC / str(child) / "status", "VmRSS")
        pss += _kib(PROC / str(child) / "smaps_rollup", "Pss")
    return rss, pss


@dataclass
class PeakSampler:
    """Samples ``tree_memory(pid)`` every ``interval`` seconds in a thread until stopped, keeping
    the peaks: ``with PeakSampler(pid) as peak: ...; peak.rss, peak.pss``."""

    pid: int
    interval: float = 0.2
    rss: int = 0
    pss: int = 0

    def __post_init__(self) -> None:
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            rss, pss = tree_memory(self.pid)
            self.rss, self.pss = max(self.rss, rss), max(self.pss, pss)
            self._stop.wait(self.interval)

    def __enter__(self) -> PeakSampler:
        if PROC.joinpath(str(os.getpid())).exists():
            self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()
