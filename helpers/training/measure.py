"""Measuring: the machine a result came from, and speed-up and efficiency from timings."""

from __future__ import annotations

import os
import platform
import sys
import time
from pathlib import Path

import torch

from helpers.dist.cores import (
    available_cores,
    machine_cores,
    thread_policy_note,
    threads_per_core,
)
from helpers.dist.cpu_time import STAT, cpu_ticks, read_stat


def cpu_model() -> str:
    """The processor's name, where the operating system tells it."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def machine_facts() -> dict:
    """What a timing depends on: record it beside every measurement."""
    return {
        "cores": available_cores(),
        "machine_cores": machine_cores(),
        "threads_per_core": threads_per_core(),
        "cpu": cpu_model(),
        "platform": platform.platform(),
        "python": sys.version.split()[0],
        "torch": torch.__version__,
        "thread_policy": thread_policy_note(),
    }


def load_text() -> str:
    """The machine's load beside its cores. A timing taken while other programs keep the cores
    busy measures the sharing too: print this beside every sweep (it counts the run's own
    processes as well)."""
    one, five, _ = os.getloadavg()
    return f"load average {one:.2f} (1 min), {five:.2f} (5 min), on {machine_cores()} core(s)"


def idle_between(before: str, after: str, cpus: set[int] | None = None) -> float:
    """The share of the CPUs' time that was idle between two readings of ``/proc/stat``: over
    the ``cpu<N>`` lines of ``cpus``, or the all-CPU ``cpu`` line where ``cpus`` is None. Idle
    is idle plus iowait (nothing ran); stolen time counts as busy."""
    first, last = cpu_ticks(before, cpus), cpu_ticks(after, cpus)
    passed = sum(last.values()) - sum(first.values())
    if passed <= 0:
        raise ValueError("the two /proc/stat readings show no time passing on those CPUs: "
                         "read the second one later, and name CPUs the file lists")  # fmt: skip
    idle = sum(last[c] - first[c] for c in ("idle", "iowait"))
    return idle / passed


def idle_share(seconds: float = 0.5, stat: Path = STAT) -> float | None:
    """How idle this process's CPUs are now: the share of their time in which nothing ran, over
    ``seconds``. Unlike the load average, which lags by about a minute, it says what other
    programs are doing right before a timing. ``None`` where ``/proc/stat`` is unreadable
    (not Linux)."""
    before = read_stat(stat)
    if before is None:
        return None
    time.sleep(seconds)
    after = read_stat(stat)
    if after is None:
        return None
    cpus = os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else None
    return idle_between(before, after, cpus)


def speedup(baseline_seconds: float, seconds: float) -> float:
    """How many times faster than the baseline (one worker doing all the work)."""
    return baseline_seconds / seconds


def efficiency(speedup_value: float, workers: int) -> float:
    """Speed-up per worker: 1.0 means every added worker paid for itself in full."""
    return speedup_value / workers
