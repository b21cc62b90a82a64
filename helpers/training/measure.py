"""Measuring: the machine a result came from, and speed-up and efficiency from timings."""

from __future__ import annotations

import os
import platform
import sys

import torch

from helpers.dist.cores import (
    available_cores,
    machine_cores,
    thread_policy_note,
    threads_per_core,
)


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


def speedup(baseline_seconds: float, seconds: float) -> float:
    """How many times faster than the baseline (one worker doing all the work)."""
    return baseline_seconds / seconds


def efficiency(speedup_value: float, workers: int) -> float:
    """Speed-up per worker: 1.0 means every added worker paid for itself in full."""
    return speedup_value / workers
