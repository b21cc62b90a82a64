"""Where the slow all-reduces of a loaded machine come from: waiting to be scheduled.

An all-reduce between processes is a chain of wake-ups: the calling thread hands the work to
Gloo's threads and sleeps, they send, sleep until the peer's bytes arrive, wake the caller. Each
wake-up needs a free core. When every core is busy (the other worker, another program), the
woken thread waits in the run queue until the kernel's scheduler (EEVDF since Linux 6.6, CFS
before) preempts whatever runs there. If it does not at the wake-up, it next decides at its
timer tick (every ``1 / HZ`` seconds: 4 ms at ``HZ = 250``), or when the running thread sleeps.
A fraction of the calls then take a tick longer: a second mode, whatever the message size. On a
virtual machine the hypervisor can also take a virtual CPU away: the guest counts that time as
steal (``steal_seconds``).

``probe_wakeups`` times one all-reduce size many times in each of four conditions (each worker
pinned to its own core or not; a spinning competitor or not), interleaved, in one launch, and
counts what the kernel records for every thread of each worker: voluntary context switches (the
thread slept) and involuntary ones (the scheduler took its core away).
"""

from __future__ import annotations

import ctypes
import gzip
import os
import platform
import resource
import signal
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pandas as pd
import torch
import torch.distributed as dist

from helpers.dist.cores import pin_threads
from helpers.dist.cpu_time import STAT, cpu_ticks, read_stat
from helpers.dist.launch import launch

# Stops by itself when the process that started it is gone, so a killed notebook leaves no
# spinning process behind.
_SPINNER = "import os\nparent = os.getppid()\nwhile os.getppid() == parent:\n    pass\n"
# (each worker pinned to a core of its own, a spinning competitor running)
CONDITIONS = ((False, False), (True, False), (False, True), (True, True))


def kernel_hz(configs: Sequence[Path] | None = None) -> int | None:
    """The kernel's timer frequency ``CONFIG_HZ``, read from its build configuration
    (``/proc/config.gz`` or ``/boot/config-<release>``); ``None`` where neither is readable."""
    if configs is None:
        configs = [Path("/proc/config.gz"), Path(f"/boot/config-{platform.release()}")]
    for path in configs:
        try:
            opener = gzip.open if path.suffix == ".gz" else open
            with opener(path, "rt") as config:
                for line in config:
                    if line.startswith("CONFIG_HZ="):
                        return int(line.split("=", 1)[1])
        except OSError:
            continue
    return None


def _thread_switches() -> dict[int, tuple[int, int]]:
    """Voluntary and involuntary context switches of every thread of this process, by thread id."""
    counts: dict[int, tuple[int, int]] = {}
    tasks = Path("/proc/self/task")
    for task in tasks.iterdir() if tasks.is_dir() else []:  # Linux only: none elsewhere
        try:
            text = (task / "status").read_text()
        except OSError:  # the thread ended meanwhile
            continue
        fields = dict(line.split(":", 1) for line in text.splitlines() if ":" in line)
        counts[int(task.name)] = (
            int(fields["voluntary_ctxt_switches"]),
            int(fields["nonvoluntary_ctxt_switches"]),
        )
    return counts


def _name(tid: int) -> str:
    try:
        return Path(f"/proc/self/task/{tid}/comm").read_text().strip()
    except OSError:
        return "?"


def steal_seconds(stat: Path = STAT) -> float | None:
    """Steal time so far, summed over this machine's CPUs, in seconds: on a virtual machine, the
    time its virtual CPUs had a thread to run while the hypervisor ran something else (the 8th
    number of ``/proc/stat``'s ``cpu`` line, in ``USER_HZ`` ticks). 0 on bare metal; ``None``
    where unreadable (not Linux)."""
    text = read_stat(stat)
    ticks = cpu_ticks(text) if text is not None else {}
    return ticks["steal"] / os.sysconf("SC_CLK_TCK") if ticks else None


def _set_condition(rank: int, pinned: bool, everywhere: set[int], can_pin: bool) -> None:
    if can_pin:
        pin_threads({sorted(everywhere)[rank % len(everywhere)]} if pinned else everywhere)


def probe_worker(
    rank: int, world_size: int, nbytes: int, calls: int, spinner_pid: int | None, block: int = 10
) -> dict[str, Any]:
    """Worker: time ``calls`` all-reduces of ``nbytes`` in each of ``CONDITIONS``, interleaved.

    The conditions take turns in blocks of ``block`` calls, their order rotated every round, so
    that a change in the machine's load during the probe falls on all of them alike. After each
    switch, 2 untimed calls let the threads settle on their new cores. Rank 0 lets the (stopped)
    spinner run during the blocks with a competitor, by SIGCONT and SIGSTOP. Returns one row per
    condition (the slowest rank's time per call, in seconds, and this rank's context switches
    per call, summed over its threads), the steal time and the wall time of the whole probe."""
    if block < 1:
        raise ValueError(f"need block >= 1, got {block}")
    can_pin = hasattr(os, "sched_getaffinity")  # not on macOS: its conditions are left out
    everywhere = os.sched_getaffinity(0) if can_pin else set()
    conditions = [c for c in CONDITIONS if can_pin or not c[0]]
    tensor = torch.zeros(nbytes // 4)
    times = torch.full((len(conditions), calls), float("nan"), dtype=torch.float64)
    per_thread: list[dict[int, list[int]]] = [{} for _ in conditions]
    process = [[0, 0] for _ in conditions]  # voluntary, involuntary: the whole process
    dist.barrier()
    steal_before, probe_start = steal_seconds(), time.perf_counter()
    for first in range(0, calls, block):
        shift = (first // block) % len(conditions)
        for j in [*range(shift, len(conditions)), *range(shift)]:
            pinned, competitor = conditions[j]
            _set_condition(rank, pinned, everywhere, can_pin)
            if competitor and spinner_pid is not None and rank == 0:
                os.kill(spinner_pid, signal.SIGCONT)
            for _ in range(2):
                dist.all_reduce(tensor)
            before, self_before = _thread_switches(), resource.getrusage(resource.RUSAGE_SELF)
            for i in range(first, min(first + block, calls)):
                dist.barrier()
                start = time.perf_counter()
                dist.all_reduce(tensor)
                times[j, i] = time.perf_counter() - start
            after, self_after = _thread_switches(), resource.getrusage(resource.RUSAGE_SELF)
            dist.barrier()
            if competitor and spinner_pid is not None and rank == 0:
                os.kill(spinner_pid, signal.SIGSTOP)
            for t, (v, i) in after.items():
                v0, i0 = before.get(t, (0, 0))
                counts = per_thread[j].setdefault(t, [0, 0])
                counts[0] += v - v0
                counts[1] += i - i0
            process[j][0] += self_after.ru_nvcsw - self_before.ru_nvcsw
            process[j][1] += self_after.ru_nivcsw - self_before.ru_nivcsw
    dist.barrier()
    steal_after, probe_seconds = steal_seconds(), time.perf_counter() - probe_start
    _set_condition(rank, False, everywhere, can_pin)
    dist.all_reduce(times, op=dist.ReduceOp.MAX)  # call by call, the slowest rank's time
    rows = [
        {
            "cores": "one each" if pinned else "any",
            "competitor": competitor,
            "times": times[j].tolist(),
            "threads": len(per_thread[j]),
            "woken": sorted(_name(t) for t, (v, i) in per_thread[j].items() if v + i >= calls // 2),
            "voluntary": process[j][0] / calls,
            "involuntary": process[j][1] / calls,
        }
        for j, (pinned, competitor) in enumerate(conditions)
    ]
    steal = None if steal_before is None or steal_after is None else steal_after - steal_before
    return {"rows": rows, "steal_s": steal, "seconds": probe_seconds}


def _die_with_parent() -> None:
    """In the child, before it runs: SIGKILL it when its parent dies, stopped or not (a stopped
    process would never notice that its parent is gone)."""
    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # 1: PR_SET_PDEATHSIG


@contextmanager
def stopped_spinner() -> Iterator[int]:
    """A process that spins on one core, started stopped (SIGSTOP); its pid. Killed on exit."""
    linux = sys.platform.startswith("linux")
    spinner = subprocess.Popen([sys.executable, "-c", _SPINNER],
                               preexec_fn=_die_with_parent if linux else None)
    try:
        os.kill(spinner.pid, signal.SIGSTOP)
        os.waitpid(spinner.pid, os.WUNTRACED)  # returns once it is stopped
        yield spinner.pid
    finally:
        spinner.kill()
        spinner.wait()


def wait_threshold(hz: int | None) -> float:
    """Seconds of delay that mark a call as having waited for a core: half a timer tick, since a
    wake-up that waits for the scheduler's tick loses up to a whole one, and the message's own
    costs have no step of that size; 2 ms (half of ``HZ = 250``'s tick) where ``HZ`` is unknown."""
    return 0.5 / hz if hz else 2e-3


def probe_wakeups(nbytes: int = 65536, calls: int = 120, block: int = 10) -> pd.DataFrame:
    """Time ``calls`` all-reduces of ``nbytes`` between 2 workers in each of ``CONDITIONS``,
    interleaved in blocks of ``block`` calls (``probe_worker``).

    One row per condition: quartiles of the call times (ms), the share of calls slower than
    ``wait_threshold`` (half a timer tick), and per call and worker the context switches,
    voluntary and involuntary, summed over the worker's threads. ``attrs`` adds the
    steal time over the probe (``steal_s``, summed over the CPUs; ``None`` where unreadable), the
    probe's wall time (``seconds``) and the number of CPUs (``cpus``)."""
    if calls < 4 or nbytes < 4 or block < 1:
        raise ValueError(
            f"need calls >= 4, nbytes >= 4 and block >= 1, got {calls}, {nbytes} and {block}"
        )
    hz = kernel_hz()
    slow = wait_threshold(hz)
    with stopped_spinner() as pid:
        results = launch(probe_worker, 2, nbytes, calls, pid, block)
    ranks = [r["rows"] for r in results]
    rows = []
    for j, row in enumerate(ranks[0]):
        times = torch.tensor(row["times"], dtype=torch.float64)
        q = times.quantile(torch.tensor([0.25, 0.5, 0.75], dtype=torch.float64)) * 1e3
        rows.append({
            "cores": row["cores"],
            "competitor": "spinning" if row["competitor"] else "none",
            "median_ms": q[1].item(),
            "p25_ms": q[0].item(),
            "p75_ms": q[2].item(),
            "slow_share": (times > slow).double().mean().item(),
            "threads": max(r[j]["threads"] for r in ranks),
            "woken": len(ranks[0][j]["woken"]),
            "voluntary": sum(r[j]["voluntary"] for r in ranks) / len(ranks),
            "involuntary": sum(r[j]["involuntary"] for r in ranks) / len(ranks),
        })
    table = pd.DataFrame(rows)
    table.attrs.update(hz=hz, slow_ms=slow * 1e3, times=[r["times"] for r in ranks[0]],
                       woken=ranks[0][0]["woken"], steal_s=results[0]["steal_s"],
                       seconds=results[0]["seconds"], cpus=os.cpu_count())
    return table


def slow_calls(table: pd.DataFrame) -> dict[str, Any]:
    """What the slow calls of a ``probe_wakeups`` table add up to, for setting beside the steal
    time (which can explain at most its own total): how many calls were slower than half a tick
    (``count``), the share of them under one tick (``under_one_tick``, None where ``HZ`` is
    unknown or none was slow), the seconds they took beyond their condition's first quartile
    (``extra_s``), and the conditions with the most slow calls and the most involuntary
    switches (``most_slow``, ``most_involuntary``: the table's row labels)."""
    slow, hz = table.attrs["slow_ms"] / 1e3, table.attrs["hz"]
    late_all: list[float] = []
    extra = 0.0
    for row, times in zip(table.itertuples(), table.attrs["times"], strict=True):
        late = [t for t in times if t > slow]
        late_all += late
        extra += sum(t - row.p25_ms / 1e3 for t in late)
    under = sum(t < 1 / hz for t in late_all) / len(late_all) if hz and late_all else None
    return {
        "count": len(late_all),
        "under_one_tick": under,
        "extra_s": extra,
        "most_slow": table["slow_share"].idxmax(),
        "most_involuntary": table["involuntary"].idxmax(),
    }


def slow_calls_text(table: pd.DataFrame) -> str:
    """``slow_calls`` and the steal time over the probe, one finding a line."""
    found = slow_calls(table)
    lines = [f"the slow calls took {found['extra_s'] * 1e3:.0f} ms beyond their condition's "
             "first quartile"]  # fmt: skip
    under = found["under_one_tick"]
    lines.append(f"{found['count']} slow calls (over half a tick)"
                 + (f"; {under:.0%} of them under one tick" if under is not None else ""))
    most_slow, most_inv = found["most_slow"], found["most_involuntary"]
    same = "the same" if most_slow == most_inv else "not the same"
    lines.append(f"most slow calls in condition {most_slow}, most involuntary switches in "
                 f"condition {most_inv}: {same}")
    steal, seconds, cpus = (table.attrs[k] for k in ("steal_s", "seconds", "cpus"))
    if steal is None:
        lines.append("steal time: not readable here (/proc/stat is Linux's)")
    else:
        lines.append(f"steal time over the probe: {steal * 1e3:.0f} ms, summed over {cpus} CPUs "
                     f"in {seconds:.1f} s ({steal / (seconds * cpus):.1%} of their time)")
    return "\n".join(lines)
