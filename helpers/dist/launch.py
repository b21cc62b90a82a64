"""Start N worker processes on this machine, run one function in each, collect what they return.

Each worker is a fresh Python process (``spawn``), joined into a Gloo process group that
listens on loopback only (unless the reader has set ``GLOO_SOCKET_IFNAME``). The rendezvous
store is created here, in the caller, bound to 127.0.0.1 on a port the operating system picks
(``helpers.dist.loopback``), so runs never collide with another program on 29500 or any fixed
port and are never reachable from the network. Each worker sends its result, or its error,
through a pipe of its own (``helpers.dist.channel``).

Guarantees a notebook needs:
- results come back in rank order;
- a worker that raises becomes one ``WorkerError`` naming the rank and the worker's own error
  (its traceback is attached as a note, since nbval and Jupyter hide the workers' stderr);
- nothing hangs: a collective that never completes times out, a dead worker is noticed (even
  one killed half-way through sending its result), and every other worker is stopped at once;
- Ctrl-C (or interrupting the cell) stops every worker before ``KeyboardInterrupt`` reaches you.
"""

from __future__ import annotations

import contextlib
import multiprocessing as mp
import os
import pickle
import re
import signal
import sys
import threading
import time
import traceback
from collections.abc import Callable
from datetime import timedelta
from multiprocessing.connection import Connection
from typing import Any

import torch
import torch.distributed as dist

from helpers.dist.channel import ERROR, OK, Inbox, send
from helpers.dist.loopback import (
    LOOPBACK,
    gloo_interface_notice,
    loopback_interface,
    loopback_store,
)

DEFAULT_COLLECTIVE_TIMEOUT = 120.0  # seconds a single collective may wait for its peers
PLAIN_DATA = "return plain data: numbers, strings, lists, dicts, NumPy arrays or tensors"
__all__ = ["LOOPBACK", "WorkerError", "gloo_interface_notice", "launch", "loopback_interface"]


class WorkerError(RuntimeError):
    """One worker failed; the message names its rank and its own error."""

    def __init__(self, message: str, rank: int | None = None, worker_traceback: str = ""):
        super().__init__(message)
        self.rank = rank
        self.worker_traceback = worker_traceback


# --------------------------------------------------------------------------- the worker side


_warned_interfaces: set[str] = set()


def _exit_if_orphaned(parent_pid: int) -> None:
    """Workers die with their parent, even if it is killed without a chance to clean up."""
    while True:
        time.sleep(0.5)
        if os.getppid() != parent_pid:
            os._exit(1)


def _worker_main(
    rank: int,
    world_size: int,
    fn: Callable[..., Any],
    args: tuple,
    kwargs: dict,
    port: int,
    threads: int,
    collective_timeout: float,
    parent_pid: int,
    channel: Connection,
) -> None:
    # The caller handles Ctrl-C and stops us; a KeyboardInterrupt traceback from every worker
    # would only bury the message that matters.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    threading.Thread(target=_exit_if_orphaned, args=(parent_pid,), daemon=True).start()
    torch.set_num_threads(threads)
    os.environ["OMP_NUM_THREADS"] = str(threads)  # for its children: this pool exists already
    os.environ.setdefault("GLOO_SOCKET_IFNAME", loopback_interface())
    try:
        timeout = timedelta(seconds=collective_timeout)
        store = dist.TCPStore(LOOPBACK, port, world_size, is_master=False, timeout=timeout)
        dist.init_process_group(
            "gloo", store=store, rank=rank, world_size=world_size, timeout=timeout
        )
        value = fn(rank, world_size, *args, **kwargs)
        # Plain pickle: torch's would share tensors through shared memory that vanishes when
        # this process exits, before the caller has read them.
        try:
            payload = pickle.dumps(value)
        except Exception as exc:
            raise TypeError(
                f"the return value cannot be pickled ({type(exc).__name__}: {exc}); {PLAIN_DATA}"
            ) from exc
        # Every rank done, so that no collective of fn's is still in flight on Gloo's threads
        # when the group is torn down: a work released on one of those threads while the group
        # is destroyed can abort the process (std::terminate).
        dist.barrier()
    except BaseException as exc:  # noqa: BLE001 - everything must reach the caller
        # Reported first, and no teardown after it: a peer may still be in a collective, and
        # destroying the group then can abort this process or raise in place of this error.
        # The caller stops every worker once it has the story.
        report = (f"{type(exc).__name__}: {exc}", traceback.format_exc())
        send(channel, ERROR, pickle.dumps(report))
        return
    send(channel, OK, payload)  # before the teardown: nothing after it can lose it
    with contextlib.suppress(Exception):
        dist.destroy_process_group()


# --------------------------------------------------------------------------- the caller side


def _check_spawnable(fn: Callable[..., Any]) -> None:
    module = getattr(fn, "__module__", None)
    qualname = getattr(fn, "__qualname__", "")
    if module in (None, "__main__") or "<lambda>" in qualname or "<locals>" in qualname:
        raise ValueError(
            f"launch() needs a function defined at the top level of an importable module, "
            f"got {qualname or fn!r} from {module}: spawned workers cannot see functions defined "
            "in a notebook, a script's __main__ or another function; put it in a module "
            "(for example in helpers/) and import it"
        )


def _first_line(text: str) -> str:
    """The first line of an error, without Gloo's C++ source location prefix."""
    line = text.strip().splitlines()[0] if text.strip() else text
    return re.sub(r"\[[^\]]*\.(?:cc|cpp|h):\d+\] ", "", line)


def _explain(message: str, collective_timeout: float) -> str:
    lowered = message.lower()
    if "timed out" in lowered or "timeout" in lowered:
        return (
            f"{message} (a collective did not complete within {collective_timeout:g} s: "
            "does every rank call the same collectives in the same order?)"
        )
    return message


def _start_ignoring_ctrl_c(processes: list[mp.process.BaseProcess]) -> None:
    """Start the workers with SIGINT ignored from their first instruction (an ignored signal
    stays ignored across exec, and Python keeps it so), so that a Ctrl-C a terminal sends to
    the whole process group while they import torch cannot print a traceback from each; the
    caller alone handles it, and stops them."""
    if threading.current_thread() is not threading.main_thread():
        for p in processes:
            p.start()
        return
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        for p in processes:
            p.start()
    finally:
        signal.signal(signal.SIGINT, previous)


def _unpickle(rank: int, payload: bytes, world_size: int) -> Any:
    """A worker's return value, or a WorkerError if it cannot be rebuilt in this process."""
    try:
        return pickle.loads(payload)
    except Exception as exc:
        raise WorkerError(
            f"worker rank {rank} of {world_size} returned a value that cannot be unpickled here "
            f"({type(exc).__name__}: {exc}); {PLAIN_DATA}",
            rank,
        ) from None


STOP_GRACE = 3.0  # seconds a worker gets to exit after SIGTERM before SIGKILL


def _stop(processes: list[mp.process.BaseProcess]) -> None:
    """Terminate every worker still alive; kill those that ignore it for ``STOP_GRACE``
    seconds. A second Ctrl-C during the grace period kills them at once, and only then reaches
    the caller."""
    processes = [p for p in processes if p.pid is not None]  # started ones only
    try:
        for p in processes:
            if p.is_alive():
                p.terminate()
        deadline = time.monotonic() + STOP_GRACE
        for p in processes:
            p.join(max(0.0, deadline - time.monotonic()))
            if p.is_alive():
                p.kill()
                p.join(1.0)
    except KeyboardInterrupt:
        for p in processes:
            if p.is_alive():
                p.kill()
        for p in processes:
            p.join(1.0)
        raise


_PEER_ERRORS = ("connection reset by peer", "connection closed by peer", "broken pipe")
ERROR_GRACE = 1.0  # seconds to wait for the root cause after the first error arrives


def _died(rank: int, world_size: int, process: mp.process.BaseProcess, partial: str) -> WorkerError:
    """A worker that ended without a complete report: how, and what to look at."""
    process.join(1.0)  # its pipe ends as it exits: give the exit a moment to be reaped
    code = process.exitcode
    if partial:
        how = f"while sending its result ({partial} had arrived)"
    else:
        how = "without reporting a result or an error"
    hint = (
        " (its stderr says why; a script that starts workers must do so under "
        '`if __name__ == "__main__":`, since every spawned worker imports the script again)'
        if code == 1
        else ""
    )
    return WorkerError(
        f"worker rank {rank} of {world_size} died (exit code {code}) {how}{hint}", rank
    )


def _failure(errors: list[tuple[int, str, str]], world_size: int, timeout: float) -> WorkerError:
    """Pick the error to report: a worker's own error beats a peer's broken connection."""
    own = [e for e in errors if not any(s in e[1].lower() for s in _PEER_ERRORS)]
    rank, error, tb = (own or errors)[0]
    failure = WorkerError(
        f"worker rank {rank} of {world_size} failed: {_first_line(_explain(error, timeout))}",
        rank,
        tb,
    )
    failure.add_note(f"Traceback from worker rank {rank}:\n{tb.rstrip()}")
    for other, other_error, _ in errors:
        if other != rank:
            failure.add_note(f"worker rank {other} then failed too: {_first_line(other_error)}")
    return failure


class _Run:
    """The caller's side of one launch: the workers, their pipes, what has come back."""

    def __init__(self, processes: list, inbox: Inbox, collective_timeout: float):
        self.processes, self.inbox = processes, inbox
        self.world_size, self.collective_timeout = len(processes), collective_timeout
        self.values: dict[int, Any] = {}
        self.errors: list[tuple[int, str, str]] = []  # (rank, error, traceback) as they arrive

    def take(self, timeout: float) -> None:
        """Wait up to ``timeout`` seconds for results and errors, and keep what arrives."""
        for kind, rank, data in self.inbox.poll(timeout):
            if kind == OK:
                self.values[rank] = _unpickle(rank, data, self.world_size)
            else:
                self.errors.append((rank, *pickle.loads(data)))

    def check_silent(self) -> None:
        """Raise for a worker that has gone without a complete report. Its peers' errors, if
        any, are broken connections that its death explains, unless one is their own."""
        reported = set(self.values) | {rank for rank, _, _ in self.errors}
        for rank, process in enumerate(self.processes):
            if rank not in reported and self.inbox.gone(rank, process.is_alive()):
                own = [e for e in self.errors if not any(s in e[1].lower() for s in _PEER_ERRORS)]
                if own:
                    raise _failure(self.errors, self.world_size, self.collective_timeout)
                raise _died(rank, self.world_size, process, self.inbox.partial(rank))

    def collect(self, timeout: float | None) -> list[Any]:
        """Every worker's result in rank order, or the WorkerError that explains the failure.
        One worker's error soon shows up on its peers as a broken connection: after the first
        error, wait a moment for the whole story, then report the likeliest cause."""
        started, failed_at = time.monotonic(), None
        while len(self.values) + len(self.errors) < self.world_size:
            self.take(0.1)
            self.check_silent()
            now = time.monotonic()
            failed_at = failed_at or (now if self.errors else None)
            if failed_at is not None and now - failed_at > ERROR_GRACE:
                break
            if timeout is not None and now - started > timeout:
                raise WorkerError(
                    f"the {self.world_size} workers did not finish within {timeout:g} s; "
                    "all stopped"
                )
        if self.errors:
            raise _failure(self.errors, self.world_size, self.collective_timeout)
        return [self.values[rank] for rank in range(self.world_size)]


def _check_launch(fn: Callable[..., Any], world_size: int, threads_per_worker: int) -> None:
    """Refuse at once what could only fail in the workers, and name a Gloo interface that is
    not loopback (once per process)."""
    _check_spawnable(fn)
    if world_size < 1:
        raise ValueError(f"world_size must be at least 1, got {world_size}")
    if threads_per_worker < 1:
        raise ValueError(f"threads_per_worker must be at least 1, got {threads_per_worker}")
    note = gloo_interface_notice()
    if note and note not in _warned_interfaces:
        _warned_interfaces.add(note)
        print(note, file=sys.stderr, flush=True)


def launch(
    fn: Callable[..., Any],
    world_size: int,
    *args: Any,
    threads_per_worker: int = 1,
    collective_timeout: float = DEFAULT_COLLECTIVE_TIMEOUT,
    timeout: float | None = None,
    **kwargs: Any,
) -> list[Any]:
    """Run ``fn(rank, world_size, *args, **kwargs)`` in ``world_size`` worker processes, each
    already inside a Gloo process group, and return their return values in rank order.

    ``fn`` must be a top-level function of an importable module (spawned processes import it).
    ``collective_timeout`` bounds every collective; ``timeout`` (optional) bounds the whole run.
    Raises ``WorkerError`` if any worker fails, after stopping all of them.
    """
    _check_launch(fn, world_size, threads_per_worker)
    ctx = mp.get_context("spawn")
    store = loopback_store(world_size, collective_timeout)
    pipes = [ctx.Pipe(duplex=False) for _ in range(world_size)]  # (caller's end, worker's end)
    common = (store.port, threads_per_worker, collective_timeout, os.getpid())
    processes = [
        ctx.Process(
            target=_worker_main,
            args=(rank, world_size, fn, args, kwargs, *common, pipes[rank][1]),
            name=f"worker-{rank}",
            daemon=True,
        )
        for rank in range(world_size)
    ]
    inbox = Inbox([reader for reader, _ in pipes])
    try:
        _start_ignoring_ctrl_c(processes)
        for _, writer in pipes:  # the workers hold their ends: a pipe ends when its worker does
            writer.close()
        return _Run(processes, inbox, collective_timeout).collect(timeout)
    finally:
        try:
            _stop(processes)
        finally:  # even when a second Ctrl-C cut the stopping short
            for _, writer in pipes:
                writer.close()
            inbox.close()
            del store
