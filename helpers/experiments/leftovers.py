"""What a failed run leaves behind: processes and listening sockets (notebook 11).

A hang that ends in a timeout, a kill or Ctrl-C must not leave a worker running or a port
open. ``snapshot`` records this process's descendants and the TCP addresses they and it listen
on; ``left_behind`` compares a later snapshot with it, so that what was there before (the
notebook kernel's own sockets, multiprocessing's resource tracker) does not count.

torchrun starts its workers in sessions of their own: a worker whose agent is killed is
re-parented to init and is no longer this process's descendant. ``tagged`` finds such
processes by a variable their environment carries (``TAG_VARIABLE``), which a run passes down.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

from helpers.dist.loopback import listening_addresses

TAG_VARIABLE = "DDP_COURSE_RUN_TAG"


def _process_table() -> list[tuple[int, int]]:
    """(pid, parent pid) of every other process, from ``ps`` (Linux and macOS alike), without
    the ``ps`` that listed them."""
    ps = subprocess.Popen(["ps", "-A", "-o", "pid=,ppid="], stdout=subprocess.PIPE, text=True)
    out, _ = ps.communicate()
    rows = [(int(a), int(b)) for a, b in (line.split() for line in out.splitlines() if line)]
    return [(pid, parent) for pid, parent in rows if pid != ps.pid]


def parents() -> dict[int, int]:
    """Each live process's parent, by pid."""
    return dict(_process_table())


def descendants(pid: int | None = None) -> set[int]:
    """Every live process below ``pid`` (default: this one), children's children included."""
    pid = os.getpid() if pid is None else pid
    children: dict[int, list[int]] = {}
    for child, parent in _process_table():
        children.setdefault(parent, []).append(child)
    found, todo = set(), [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            if child not in found:
                found.add(child)
                todo.append(child)
    return found


def listening(pids: list[int]) -> set[str]:
    """TCP addresses (``ip:port``) the processes ``pids`` listen on: /proc on Linux, lsof
    elsewhere (macOS)."""
    if sys.platform.startswith("linux"):
        return set(listening_addresses(pids))
    out = subprocess.run(
        ["lsof", "-nP", "-a", "-iTCP", "-sTCP:LISTEN", "-p", ",".join(map(str, pids)), "-Fn"],
        capture_output=True, text=True,
    ).stdout  # fmt: skip
    return {line[1:] for line in out.splitlines() if line.startswith("n")}


@dataclass(frozen=True)
class Snapshot:
    """This process's descendants and what it and they listen on, at one moment."""

    processes: frozenset[int]
    listening: frozenset[str]


def snapshot() -> Snapshot:
    processes = descendants()
    return Snapshot(frozenset(processes), frozenset(listening([os.getpid(), *processes])))


def left_behind(before: Snapshot, wait: float = 5.0) -> dict[str, list]:
    """What is there now and was not at ``before``: processes and listening addresses, after
    waiting up to ``wait`` seconds for processes that are already on their way out."""
    deadline = time.monotonic() + wait
    while True:
        now = snapshot()
        new = {"processes": sorted(now.processes - before.processes),
               "listening": sorted(now.listening - before.listening)}  # fmt: skip
        if not any(new.values()) or time.monotonic() > deadline:
            return new
        time.sleep(0.2)


def new_tag() -> dict[str, str]:
    """An environment entry to pass to a run, so that ``tagged`` can find its processes."""
    return {TAG_VARIABLE: uuid.uuid4().hex}


def tagged(tag: dict[str, str]) -> list[int]:
    """Live processes whose environment carries ``tag`` (one entry, from ``new_tag``), wherever
    they are in the process tree: /proc on Linux, ``ps -E`` elsewhere."""
    if len(tag) != 1:
        raise ValueError(f"give one tag, as new_tag() makes it; got {len(tag)} entries")
    mark = "".join(f"{name}={value}" for name, value in tag.items())
    if sys.platform.startswith("linux"):
        found = []
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            try:
                environ = (entry / "environ").read_bytes().split(b"\0")
            except OSError:  # gone, or not ours to read
                continue
            if mark.encode() in environ:
                found.append(int(entry.name))
        return sorted(found)
    out = subprocess.run(["ps", "-A", "-E", "-o", "pid=,command="], capture_output=True,
                         text=True).stdout  # fmt: skip
    return sorted(int(line.split()[0]) for line in out.splitlines() if mark in line.split())


def commands(pids: list[int]) -> dict[int, str]:
    """Each live process's command line, from ``ps`` (Linux and macOS alike)."""
    if not pids:
        return {}
    out = subprocess.run(["ps", "-o", "pid=,command=", "-p", ",".join(map(str, pids))],
                         capture_output=True, text=True).stdout  # fmt: skip
    return {int(line.split(None, 1)[0]): line.split(None, 1)[1] for line in out.splitlines()
            if len(line.split(None, 1)) == 2}  # fmt: skip
