"""The launcher: results in rank order, failures surface with their cause, nothing leaks."""

from __future__ import annotations

import multiprocessing as mp
import os
import signal
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import workers

from helpers.launch import (
    WorkerError,
    available_cores,
    default_threads_per_worker,
    launch,
    machine_cores,
    plan_world_sizes,
)


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_results_come_back_in_rank_order_with_the_collective_done():
    results = launch(workers.rank_and_sum, 3, 2.0, threads_per_worker=1)
    assert [r[0] for r in results] == [0, 1, 2]
    assert all(r[1] == 3 for r in results)
    assert all(r[2] == 12.0 for r in results)  # (1 + 2 + 3) * 2.0
    assert all(r[3] == 1 for r in results)  # threads set in each worker
    assert mp.active_children() == []


def test_tensors_returned_by_workers_survive_their_exit():
    results = launch(workers.return_tensor, 2)
    assert [float(t.sum()) for t in results] == [0.0, 1000.0]


def test_an_error_in_one_rank_surfaces_with_its_message_and_traceback():
    with pytest.raises(WorkerError) as info:
        launch(workers.fail_on_rank, 2, 1, collective_timeout=30)
    err = info.value
    assert err.rank == 1
    assert "rank 1" in str(err) and "ValueError: bad input on rank 1" in str(err)
    assert "\n" not in str(err)  # one line; the traceback travels as a note
    assert "fail_on_rank" in err.worker_traceback
    assert any("fail_on_rank" in note for note in err.__notes__)
    assert mp.active_children() == []


def test_a_collective_that_never_completes_times_out_clearly():
    started = time.monotonic()
    with pytest.raises(WorkerError, match="did not complete within 2 s"):
        launch(workers.skip_collective, 2, collective_timeout=2)
    assert time.monotonic() - started < 20  # rank 1 sleeps 60 s: it was stopped, not awaited
    assert mp.active_children() == []


def test_a_worker_that_dies_silently_is_named():
    with pytest.raises(WorkerError, match=r"rank 1 of 2 died \(exit code 3\)"):
        launch(workers.die_hard, 2, collective_timeout=30)
    assert mp.active_children() == []


def test_runs_while_the_default_ports_are_taken():
    held = []
    for port in (29500, 29511):
        s = socket.socket()
        try:
            s.bind(("127.0.0.1", port))
            s.listen()
            held.append(s)
        except OSError:  # already taken by someone else: just as good for this test
            s.close()
    try:
        assert [r[2] for r in launch(workers.rank_and_sum, 2)] == [3.0, 3.0]
    finally:
        for s in held:
            s.close()


def test_functions_spawned_workers_cannot_import_are_refused_at_once():
    def local(rank, world):
        return rank

    with pytest.raises(ValueError, match="top level of an importable module"):
        launch(local, 2)
    with pytest.raises(ValueError, match="top level of an importable module"):
        launch(lambda rank, world: rank, 2)
    with pytest.raises(ValueError, match="at least 1"):
        launch(workers.rank_and_sum, 0)


def test_ctrl_c_stops_every_worker(tmp_path: Path):
    script = textwrap.dedent(f"""
        import sys
        sys.path.insert(0, {str(Path(__file__).parent)!r})
        import workers
        from helpers.launch import launch
        if __name__ == "__main__":
            try:
                launch(workers.sleep_and_report_pid, 2, {str(tmp_path)!r}, 120.0)
            except KeyboardInterrupt:
                print("interrupted", flush=True)
                sys.exit(130)
    """)
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    pid_files = [tmp_path / "0.pid", tmp_path / "1.pid"]
    deadline = time.monotonic() + 60
    while not all(f.exists() and f.read_text() for f in pid_files):
        assert time.monotonic() < deadline, "workers never started"
        assert proc.poll() is None, "launcher exited early"
        time.sleep(0.1)
    pids = [int(f.read_text()) for f in pid_files]
    proc.send_signal(signal.SIGINT)  # what Ctrl-C or interrupting a notebook cell sends
    out, _ = proc.communicate(timeout=15)
    assert proc.returncode == 130 and "interrupted" in out
    time.sleep(0.2)
    assert not any(pid_alive(pid) for pid in pids), "a worker outlived the interrupt"


def test_thread_defaults_follow_the_article_where_cores_allow():
    assert default_threads_per_worker(16) == 2
    assert default_threads_per_worker(4) == 2
    assert default_threads_per_worker(3) == 1
    assert default_threads_per_worker(2) == 1
    assert default_threads_per_worker(1) == 1


def test_the_core_cap_makes_a_big_machine_plan_like_the_reference(monkeypatch):
    monkeypatch.setenv("DDP_COURSE_CORES", "1")
    assert available_cores() == 1
    monkeypatch.setenv("DDP_COURSE_CORES", "100000")
    assert available_cores() == machine_cores()
    monkeypatch.setenv("DDP_COURSE_CORES", "two")
    with pytest.raises(ValueError, match="DDP_COURSE_CORES"):
        available_cores()


def test_world_sizes_that_oversubscribe_are_skipped_or_flagged():
    plans = plan_world_sizes([1, 2, 4], threads_per_worker=1, cores=2)
    assert [(p.world_size, p.runs, p.oversubscribed) for p in plans] == [
        (1, True, False),
        (2, True, False),
        (4, False, True),
    ]
    assert "4 threads > 2 cores" in plans[2].reason
    forced = plan_world_sizes([4], threads_per_worker=1, cores=2, oversubscribe=True)
    assert forced[0].runs and forced[0].oversubscribed and "OVERSUBSCRIBED" in forced[0].reason
    with pytest.raises(ValueError):
        plan_world_sizes([2], threads_per_worker=0, cores=2)


@pytest.mark.skipif(
    not os.path.exists("/proc/net/tcp"), reason="needs /proc/net/tcp (Linux) to list sockets"
)
def test_the_store_and_gloo_listen_on_loopback_only(monkeypatch):
    monkeypatch.delenv("GLOO_SOCKET_IFNAME", raising=False)
    found = launch(workers.listening_during_run, 2)[0]
    assert found, "no listening socket found: the check would prove nothing"
    assert [a for a in found if not a.startswith(("127.", "::1:"))] == [], found
