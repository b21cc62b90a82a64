"""Start N worker processes on this machine, run one function in each, collect what they return.

Each worker is a fresh Python process (``spawn``), joined into a Gloo process group that
listens on loopback only (unless the reader has set ``GLOO_SOCKET_IFNAME``). The rendezvous
store is created here, in the caller, bound to 127.0.0.1 on a port the operating system picks,
so runs never collide with another program on 29500 or any fixed port and are never reachable
from the network.

Guarantees a notebook needs:
- results come back in rank order;
- a worker that raises becomes one ``WorkerError`` naming the rank and the worker's own error
  (its traceback is attached as a note, since nbval and Jupyter hide the workers' stderr);
- nothing hangs: a collective that never completes times out, a dead worker is noticed, and
  every other worker is stopped at once;
- Ctrl-C (or interrupting the cell) stops every worker before ``KeyboardInterrupt`` reaches you.
"""

from __future__ import annotations

import contextlib
import multiprocessing as mp
import os
import pickle
import queue
import re
import signal
import socket
import sys
import threading
import time
import traceback
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

LOOPBACK = "127.0.0.1"
DEFAULT_COLLECTIVE_TIMEOUT = 120.0  # seconds a single collective may wait for its peers
PLAIN_DATA = "return plain data: numbers, strings, lists, dicts, NumPy arrays or tensors"


class WorkerError(RuntimeError):
    """One worker failed; the message names its rank and its own error."""

    def __init__(self, message: str, rank: int | None = None, worker_traceback: str = ""):
        super().__init__(message)
        self.rank = rank
        self.worker_traceback = worker_traceback


# --------------------------------------------------------------------------- the worker side


def loopback_interface() -> str:
    """Name of the loopback network interface ('lo' on Linux, 'lo0' on macOS) for Gloo."""
    for _, name in socket.if_nameindex():
        if name in ("lo", "lo0"):
            return name
    return "lo0" if sys.platform == "darwin" else "lo"


_warned_interfaces: set[str] = set()


def gloo_interface_notice() -> str | None:
    """A one-line notice if the reader's ``GLOO_SOCKET_IFNAME`` takes Gloo off loopback
    (the launcher only ever sets it to loopback), else None."""
    name = os.environ.get("GLOO_SOCKET_IFNAME")
    if not name or name == loopback_interface():
        return None
    return (
        f"notice: GLOO_SOCKET_IFNAME={name} is set, so the workers' Gloo sockets listen on "
        f"{name}, not only on loopback; unset it to keep them on {loopback_interface()}"
    )


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
    results: Any,
) -> None:
    # The caller handles Ctrl-C and stops us; a KeyboardInterrupt traceback from every worker
    # would only bury the message that matters.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    threading.Thread(target=_exit_if_orphaned, args=(parent_pid,), daemon=True).start()
    torch.set_num_threads(threads)
    os.environ["OMP_NUM_THREADS"] = str(threads)
    os.environ.setdefault("GLOO_SOCKET_IFNAME", loopback_interface())
    try:
        timeout = timedelta(seconds=collective_timeout)
        store = dist.TCPStore(LOOPBACK, port, world_size, is_master=False, timeout=timeout)
        dist.init_process_group(
            "gloo", store=store, rank=rank, world_size=world_size, timeout=timeout
        )
        try:
            value = fn(rank, world_size, *args, **kwargs)
            # Plain pickle, not the queue's: torch would share tensors through shared memory
            # that vanishes when this process exits, before the caller has read them.
            try:
                payload = pickle.dumps(value)
            except Exception as exc:
                raise TypeError(
                    f"the return value cannot be pickled ({type(exc).__name__}: {exc}); "
                    f"{PLAIN_DATA}"
                ) from exc
            # Every rank done, so that no collective of fn's is still in flight on Gloo's
            # threads when the group is torn down: a work released on one of those threads
            # while the group is destroyed can abort the process (std::terminate).
            dist.barrier()
        except BaseException:
            dist.destroy_process_group()
            raise
        results.put(("ok", rank, payload))  # before the teardown: nothing after it can lose it
        results.close()
        results.join_thread()  # the queue's thread has written it to the pipe
        with contextlib.suppress(Exception):
            dist.destroy_process_group()
    except BaseException as exc:  # noqa: BLE001 - everything must reach the caller
        results.put(("error", rank, f"{type(exc).__name__}: {exc}", traceback.format_exc()))


# --------------------------------------------------------------------------- the caller side


def _loopback_store(world_size: int, collective_timeout: float) -> dist.TCPStore:
    """The rendezvous store, listening on 127.0.0.1 only, on a free port the OS picks.

    ``TCPStore(LOOPBACK, 0, is_master=True)`` would listen on every interface, and the store is
    unauthenticated: bind the socket ourselves and hand it over instead.
    """
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        sock.bind((LOOPBACK, 0))
        sock.listen()
        store = dist.TCPStore(
            LOOPBACK,
            sock.getsockname()[1],
            world_size,
            is_master=True,
            wait_for_workers=False,
            timeout=timedelta(seconds=collective_timeout),
            master_listen_fd=sock.fileno(),
        )
    except BaseException:
        sock.close()
        raise
    sock.detach()  # the store owns the descriptor now and closes it
    return store


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


def _stop(processes: list[mp.process.BaseProcess], grace: float = 3.0) -> None:
    """Terminate every worker still alive; kill those that ignore it. A second Ctrl-C during
    the grace period kills them at once, and only then reaches the caller."""
    processes = [p for p in processes if p.pid is not None]  # started ones only
    try:
        for p in processes:
            if p.is_alive():
                p.terminate()
        deadline = time.monotonic() + grace
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


def _failure(
    errors: list[tuple[int, str, str]],
    silent: list[int],
    processes: list[mp.process.BaseProcess],
    world_size: int,
    collective_timeout: float,
) -> WorkerError:
    """Pick the error to report: a worker's own error beats a peer's broken connection,
    and a worker that died silently explains its peers' broken connections."""
    own = [e for e in errors if not any(s in e[1].lower() for s in _PEER_ERRORS)]
    if own:
        rank, error, tb = own[0]
    elif silent:
        rank = silent[0]
        code = processes[rank].exitcode
        hint = (
            " (its stderr says why; a script that starts workers must do so under "
            '`if __name__ == "__main__":`, since every spawned worker imports the script again)'
            if code == 1
            else ""
        )
        return WorkerError(
            f"worker rank {rank} of {world_size} died (exit code {code}) "
            f"without reporting a result or an error{hint}",
            rank,
        )
    else:
        rank, error, tb = errors[0]
    error = _explain(error, collective_timeout)
    failure = WorkerError(
        f"worker rank {rank} of {world_size} failed: {_first_line(error)}", rank, tb
    )
    failure.add_note(f"Traceback from worker rank {rank}:\n{tb.rstrip()}")
    for other, other_error, _ in errors:
        if other != rank:
            failure.add_note(f"worker rank {other} then failed too: {_first_line(other_error)}")
    return failure


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
    _check_spawnable(fn)
    if world_size < 1:
        raise ValueError(f"world_size must be at least 1, got {world_size}")
    if threads_per_worker < 1:
        raise ValueError(f"threads_per_worker must be at least 1, got {threads_per_worker}")

    note = gloo_interface_notice()
    if note and note not in _warned_interfaces:
        _warned_interfaces.add(note)
        print(note, file=sys.stderr, flush=True)
    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    store = _loopback_store(world_size, collective_timeout)
    processes = [
        ctx.Process(
            target=_worker_main,
            args=(
                rank,
                world_size,
                fn,
                args,
                kwargs,
                store.port,
                threads_per_worker,
                collective_timeout,
                os.getpid(),
                results,
            ),
            name=f"worker-{rank}",
            daemon=True,
        )
        for rank in range(world_size)
    ]
    values: dict[int, Any] = {}
    errors: list[tuple[int, str, str]] = []  # (rank, error, worker traceback) as they arrive
    started = time.monotonic()
    failed_at: float | None = None
    try:
        _start_ignoring_ctrl_c(processes)
        while len(values) + len(errors) < world_size:
            try:
                message = results.get(timeout=0.1)
            except queue.Empty:
                message = None
            if message is not None:
                if message[0] == "ok":
                    values[message[1]] = _unpickle(message[1], message[2], world_size)
                else:
                    errors.append(message[1:])
                    failed_at = failed_at or time.monotonic()
                continue
            reported = set(values) | {rank for rank, _, _ in errors}
            silent = [r for r, p in enumerate(processes) if r not in reported and not p.is_alive()]
            if silent and results.empty():
                raise _failure(errors, silent, processes, world_size, collective_timeout)
            # One worker's error soon shows up on its peers as a broken connection: wait a
            # moment for the whole story, then report the error most likely to be the cause.
            if failed_at is not None and time.monotonic() - failed_at > ERROR_GRACE:
                break
            if timeout is not None and time.monotonic() - started > timeout:
                raise WorkerError(
                    f"the {world_size} workers did not finish within {timeout:g} s; all stopped"
                )
        if errors:
            raise _failure(errors, [], processes, world_size, collective_timeout)
    finally:
        try:
            _stop(processes)
        finally:  # even when a second Ctrl-C cut the stopping short
            results.close()
            results.join_thread()
            del store
    return [values[rank] for rank in range(world_size)]
