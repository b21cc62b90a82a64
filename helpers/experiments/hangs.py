"""Hangs made on purpose, and PyTorch's own tools for finding their cause (notebook 11).

A collective returns only when every rank of the group has called it. A rank that skips one, or
calls them in another order, leaves the others waiting, silently, until the process group's
timeout: 30 minutes by default for Gloo (``torch.distributed.constants.default_pg_timeout``),
10 for NCCL. ``hang_worker`` makes three such bugs in a short training loop of all-reduces:

* ``skip``: rank 1 skips the last all-reduce and stays away (a sleep standing for work that
  takes longer than the timeout, or a branch that returns early);
* ``order``: rank 1 calls the last step's broadcast before its all-reduce, rank 0 after;
* ``monitored``: ``skip``, with ``dist.monitored_barrier`` before each all-reduce, so that rank 0
  names the rank that did not arrive.

Each worker writes what it saw into a folder: its stderr (the C++ logs of c10d and Gloo go
there), how long it waited in the collective that failed, and the flight recorder's record of
its collectives (``TORCH_FR_BUFFER_SIZE``; in PyTorch 2.13 it records Gloo's collectives,
dumped on request with ``torch._C._distributed_c10d._dump_fr_trace``). ``worker_environment`` sets
the variables the workers must see before their process group is created
(``TORCH_DISTRIBUTED_DEBUG=DETAIL``, ``TORCH_FR_BUFFER_SIZE``): a spawned worker inherits them.
"""

from __future__ import annotations

import contextlib
import json
import os
import pickle
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path

import pandas as pd
import torch
import torch.distributed as dist
from torch.distributed import constants

from helpers.dist.cluster import run_torchrun
from helpers.dist.cpu_time import process_stat
from helpers.dist.launch import WorkerError, launch
from helpers.experiments import leftovers

KINDS = ("skip", "order", "monitored")
STEPS = 3  # all-reduces per rank in a run that goes right; the last one is where it goes wrong
HOLD = 60.0  # seconds the skipping rank stays away: longer than any timeout used here


def default_timeouts() -> dict[str, str]:
    """The process group timeouts this PyTorch uses when ``init_process_group`` is given none:
    read from torch itself, and the NCCL one from its documentation where this build has no
    NCCL (the CPU build)."""
    nccl = constants.default_pg_nccl_timeout
    return {
        "gloo (and every backend but NCCL)": str(constants.default_pg_timeout),
        "nccl": str(nccl) if nccl is not None else "0:10:00 (documented; no NCCL in this build)",
    }


@contextlib.contextmanager
def worker_environment(**variables: str) -> Iterator[None]:
    """Set environment variables for the workers started inside the block (spawned processes
    copy this process's environment when they start), then restore the previous values."""
    saved = {name: os.environ.get(name) for name in variables}
    os.environ.update(variables)
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def _stderr_to(path: Path) -> None:
    """Send this process's file descriptor 2 (Python's and C++'s stderr) to ``path``."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    os.dup2(fd, 2)
    os.close(fd)


def dump_flight_record(folder: Path, rank: int) -> None:
    """Write this process's flight recorder buffer (every group's collectives, pickled as
    PyTorch's ``fr_trace`` tool reads it) to ``folder/fr_RANK``, if the recorder is on."""
    if int(os.environ.get("TORCH_FR_BUFFER_SIZE", "0")) <= 0:
        return
    from torch._C._distributed_c10d import _dump_fr_trace

    blob = _dump_fr_trace(includeCollectives=True, includeStackTraces=False, onlyActive=False)
    (folder / f"fr_{rank}").write_bytes(blob)


def hang_worker(
    rank: int, world_size: int, kind: str, folder: str, timeout: float, hold: float = HOLD
) -> None:
    """``STEPS`` all-reduces, the last of which goes wrong as ``kind`` says (module docstring);
    ``timeout``: the monitored barrier's, in seconds (without one it waits the default group
    timeout, 30 minutes, not the group's own). Writes ``rankR.log`` (its stderr),
    ``rankR.json`` (the error and seconds it waited in the failing call) and ``fr_R`` (its
    flight record) into ``folder``; raises the error."""
    if kind not in KINDS:
        raise ValueError(f"kind must be one of {KINDS}, got {kind!r}")
    out = Path(folder)
    _stderr_to(out / f"rank{rank}.log")
    grad, weights = torch.ones(1000), torch.zeros(10)
    dist.barrier()  # both ranks arrive together, so that only the bug below can delay one
    entered = time.time()
    try:
        for step in range(STEPS):
            last = step == STEPS - 1
            if last and rank == 1 and kind in ("skip", "monitored"):
                dump_flight_record(out, rank)  # what it had done before going away
                time.sleep(hold)  # away, calling no collective: the launcher stops it
            entered = time.time()
            if kind == "monitored":
                dist.monitored_barrier(timeout=timedelta(seconds=timeout), wait_all_ranks=True)
            if last and kind == "order" and rank == 1:
                dist.broadcast(weights, src=0)
                dist.all_reduce(grad)
            elif last and kind == "order":
                dist.all_reduce(grad)
                dist.broadcast(weights, src=0)
            else:
                dist.all_reduce(grad)
    except Exception as exc:
        waited = time.time() - entered
        dump_flight_record(out, rank)
        record = {"rank": rank, "error": str(exc).strip().splitlines()[0], "waited": waited}
        (out / f"rank{rank}.json").write_text(json.dumps(record))
        raise


@dataclass
class Hang:
    """What one run of ``hang_worker`` left: the launcher's error and each worker's files."""

    kind: str
    error: str  # the launcher's message (its first line)
    failed_rank: int | None  # the rank the launcher blames
    seconds: float  # from asking for the workers to the launcher's error, start-up included
    waited: dict[int, float]  # rank: seconds it waited in the collective that failed
    errors: dict[int, str]  # rank: its own error's first line
    logs: dict[int, list[str]]  # rank: the lines it wrote to stderr
    flight: pd.DataFrame  # the flight recorder's entries of every rank (empty if it was off)


def run_hang(kind: str, folder: str | Path, collective_timeout: float = 3.0) -> Hang:
    """Launch 2 workers of ``hang_worker`` with a short ``collective_timeout`` and return what
    the launcher reported and what the workers wrote. Raises if the run does not fail."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    try:
        launch(hang_worker, 2, kind, str(folder), collective_timeout,
               collective_timeout=collective_timeout)  # fmt: skip
    except WorkerError as err:
        message, rank = str(err).splitlines()[0], err.rank
    else:
        raise RuntimeError(f"hang_worker({kind!r}) did not fail: the bug was not made")
    seconds = time.monotonic() - started
    reports = [json.loads(p.read_text()) for p in sorted(folder.glob("rank*.json"))]
    logs = {
        int(p.stem[4:]): [line for line in p.read_text().splitlines() if line.strip()]
        for p in sorted(folder.glob("rank*.log"))
    }
    return Hang(
        kind=kind,
        error=message,
        failed_rank=rank,
        seconds=seconds,
        waited={r["rank"]: r["waited"] for r in reports},
        errors={r["rank"]: r["error"] for r in reports},
        logs=logs,
        flight=flight_table(folder),
    )


def flight_table(folder: Path) -> pd.DataFrame:
    """Every rank's flight record (``fr_RANK`` files) as one table: rank, seq (the collective's
    number in its group), op, sizes, and whether it had finished, successfully or not
    (``completed``: the entry is retired; a collective that timed out may already be)."""
    rows = []
    for path in sorted(Path(folder).glob("fr_*")):
        dump = pickle.loads(path.read_bytes())
        for entry in dump["entries"]:
            rows.append(
                {
                    "rank": int(path.name[3:]),
                    "seq": entry["collective_seq_id"],
                    "op": entry["profiling_name"],
                    "sizes": str(entry["input_sizes"]),
                    "completed": bool(entry["retired"]),
                }
            )
    return pd.DataFrame(rows, columns=["rank", "seq", "op", "sizes", "completed"])


def first_divergence(flight: pd.DataFrame) -> dict:
    """Where the ranks' records part: the first collective number not every rank entered with
    the same op, which ranks entered it, with what, and which ranks never did."""
    ranks = sorted(flight["rank"].unique())
    ops = flight.pivot_table(index="seq", columns="rank", values="op", aggfunc="first")
    ops = ops.reindex(columns=ranks)
    for seq, row in ops.iterrows():
        entered = {int(r): op for r, op in row.items() if isinstance(op, str)}
        if len(entered) < len(ranks) or len(set(entered.values())) > 1:
            return {"seq": int(seq), "entered": entered,
                    "missing": [int(r) for r in ranks if r not in entered]}  # fmt: skip
    raise ValueError("every rank entered the same collectives: the records do not diverge")


# --------------------------------------------------------------------------- under torchrun

# Two nodes whose data differ (node 1's HAR_DATA names the stand-in, 7,352 training windows, node
# 0's the recordings, 7,415): at global batch 320 an epoch is 22 steps on one and 23 on the
# other, so one rank waits in DDP's all-reduce of step 23 while the other has moved on.
MISMATCHED_NODES = [["env", "HAR_DATA=recordings"], ["env", "HAR_DATA=standin"]]
MISMATCHED_ARGS = ["--global-batch", "320", "--epochs", "1", "--threads-per-worker", "1"]


QUIET = 1.0  # seconds with every worker idle that mark the hang's start
IDLE_SHARE = 0.05  # of a core: a worker waiting in a collective sleeps; a training one computes
POLL = 0.2  # seconds between two readings of the workers' CPU time


@dataclass
class TorchrunHang:
    """What torchrun did with a job that hangs, and what was left of it afterwards."""

    finished: bool  # True if the job ended by itself before it was stopped
    seconds: float  # from the start to the end of every torchrun
    hung_at: float | None  # seconds from the start to the hang (None: not reached)
    hung_for: float  # seconds from the hang to the stop signal (0 if not reached)
    hang_cpu: float  # the largest share of a core a worker used while hung (nan if not)
    before_stop: list[list[str]]  # each node's lines of output before the stop signal
    after_stop: list[list[str]]  # each node's log lines from the stop on (pids as PID)
    returncodes: list[int]
    left: list[int]  # processes of the job still alive afterwards (then killed)
    commands: list[list[str]]  # each node's torchrun command line, as run (``cluster.shown``)


def cpu_seconds(pid: int) -> float | None:
    """CPU time (user and system) process ``pid`` has used so far, None if it has gone: from
    /proc on Linux, from ``ps`` elsewhere (macOS, to the hundredth of a second)."""
    if sys.platform.startswith("linux"):
        fields = process_stat(pid)
        if fields is None:
            return None
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    out = subprocess.run(["ps", "-o", "time=", "-p", str(pid)], capture_output=True,
                         text=True).stdout.strip()  # fmt: skip
    if not out:
        return None
    days, _, clock = out.rpartition("-")  # [[dd-]hh:]mm:ss.cc
    seconds = 0.0
    for part in clock.split(":"):
        seconds = seconds * 60 + float(part)
    return seconds + 86400 * int(days or 0)


def _agents(commands: dict[int, str]) -> list[int]:
    """The torchrun processes among ``commands`` (pid: command line)."""
    return [pid for pid, command in commands.items() if "torch.distributed.run" in command]


def _torchrun_agents(tag: dict[str, str]) -> list[int]:
    """The torchrun processes among those that carry ``tag``."""
    return _agents(leftovers.commands(leftovers.tagged(tag)))


def _torchrun_workers(tag: dict[str, str]) -> list[int]:
    """The training processes the torchruns carrying ``tag`` started: their children that run
    ``helpers.train``. Not a process a worker forks, nor one a torchrun forks before its exec:
    either can carry the same command line for a moment, then be gone."""
    commands = leftovers.commands(leftovers.tagged(tag))
    agents, parent = set(_agents(commands)), leftovers.parents()
    return [pid for pid, command in commands.items()
            if pid not in agents and parent.get(pid) in agents and "helpers.train" in command]


def _cpu_of(pids: list[int]) -> dict[int, float] | None:
    """Each process's CPU time, or None if one of them has gone."""
    used = {pid: cpu_seconds(pid) for pid in pids}
    return None if any(v is None for v in used.values()) else used  # type: ignore[return-value]


def _wait_for_hang(thread: threading.Thread, tag: dict[str, str], workers: int,
                   limit: float) -> tuple[float, dict[int, float]] | None:  # fmt: skip
    """When every one of the job's ``workers`` training processes stopped computing (used under
    ``IDLE_SHARE`` of a core for ``QUIET`` seconds; a worker waiting in a collective sleeps),
    as a ``time.monotonic()`` reading, with their CPU times then. None if the job ended, or
    did not hang within ``limit`` seconds: start-up (imports, data, rendezvous) and training
    keep them busy."""
    deadline, pids, history = time.monotonic() + limit, [], []
    while thread.is_alive() and time.monotonic() < deadline:
        thread.join(POLL)
        if len(pids) < workers:
            pids = _torchrun_workers(tag)
            continue
        now, used = time.monotonic(), _cpu_of(pids)
        if used is None:
            return None
        history.append((now, used))
        past = [(t, u) for t, u in history if now - t >= QUIET]
        if past and all(used[p] - past[-1][1][p] <= IDLE_SHARE * (now - past[-1][0])
                        for p in pids):  # fmt: skip
            return past[-1]
    return None


def _split_at_stop(stderr: str) -> tuple[list[str], list[str]]:
    """A node's output before the stop signal, and its log lines from it on, without the
    traceback, times and process ids."""
    lines = [line for line in stderr.splitlines() if line.strip()]
    at = next((i for i, line in enumerate(lines) if "death signal" in line), len(lines))
    after = [re.sub(r"\b\d{3,}\b", "PID", line.split("] ", 1)[-1]) for line in lines[at:]
             if not line.startswith((" ", "Traceback"))]  # fmt: skip
    return lines[:at], after


def _held(hang: tuple[float, dict[int, float]]) -> tuple[float, float]:
    """Seconds since the hang began, and the largest share of a core a worker used since (nan
    if one has gone: not a hang held to the end)."""
    hung_for, used = time.monotonic() - hang[0], _cpu_of(list(hang[1]))
    if used is None:
        return hung_for, float("nan")
    return hung_for, max((used[p] - hang[1][p]) / hung_for for p in used)


def _stop(thread: threading.Thread, tag: dict[str, str], grace: float) -> list[int]:
    """SIGTERM to every torchrun of the job still running, ``grace`` seconds for them to stop
    their workers; then the job's processes still alive after 5 s more, each killed."""
    for pid in _torchrun_agents(tag):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
    thread.join(grace)
    deadline, left = time.monotonic() + 5.0, leftovers.tagged(tag)
    while left and time.monotonic() < deadline:
        time.sleep(0.2)
        left = leftovers.tagged(tag)
    for pid in left:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    return left


def torchrun_hang(hang_for: float = 12.0, grace: float = 30.0,
                  reach_within: float = 120.0) -> TorchrunHang:  # fmt: skip
    """``python -m helpers.train`` on two nodes of one worker each whose data differ
    (``MISMATCHED_NODES``), through ``helpers.dist.cluster.run_torchrun``. Once both workers
    have stopped computing (the hang reached, ``_wait_for_hang``; given up after
    ``reach_within`` seconds; a stretch after which they compute again was a pause, and the
    wait goes on) and ``hang_for`` seconds more, every torchrun is sent SIGTERM, as
    a scheduler stops a job (Slurm at its time limit, ``scancel``), and its agent stops its
    workers. Every process of the job carries a tag, so that any left afterwards is found
    (``left``), wherever it was re-parented, and killed."""
    tag = leftovers.new_tag()
    outcome: dict = {}

    def run() -> None:
        try:
            outcome["run"] = run_torchrun(MISMATCHED_ARGS, nproc_per_node=1, nnodes=2,
                                          timeout=reach_within + hang_for + grace + 60,
                                          env=tag, prefixes=MISMATCHED_NODES)  # fmt: skip
        except BaseException as exc:  # noqa: BLE001 - reported below, in this thread
            outcome["error"] = exc

    started = time.monotonic()
    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    hang, hung_for, hang_cpu, give_up = None, 0.0, float("nan"), started + reach_within
    while time.monotonic() < give_up:
        hang = _wait_for_hang(thread, tag, len(MISMATCHED_NODES), give_up - time.monotonic())
        if hang is None:
            break
        thread.join(max(0.0, hang[0] + hang_for - time.monotonic()))
        if not thread.is_alive():
            break
        hung_for, hang_cpu = _held(hang)
        if not hang_cpu >= IDLE_SHARE:  # held (or a worker gone: nan), so not a pause
            break
        hang = None  # both idle for a moment (waiting on each other at start-up), then busy again
    finished = not thread.is_alive()
    if finished or hang is None:
        hung_for, hang_cpu = 0.0, float("nan")
    left = _stop(thread, tag, grace)  # if the job ended by itself: what it left, killed
    thread.join()
    if "error" in outcome:
        raise outcome["error"]
    run = outcome["run"]
    before, after = zip(*(_split_at_stop(err) for err in run.stderr), strict=True)
    return TorchrunHang(finished, time.monotonic() - started,
                        None if hang is None else hang[0] - started, hung_for, hang_cpu,
                        list(before), list(after), run.returncodes, left, run.commands)  # fmt: skip
