"""The launcher: results in rank order, failures surface with their cause, nothing leaks."""

from __future__ import annotations

import multiprocessing as mp
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import workers

from helpers.dist import launch as launch_module
from helpers.dist.cores import (
    available_cores,
    default_threads_per_worker,
    machine_cores,
    plan_world_sizes,
)
from helpers.dist.launch import WorkerError, gloo_interface_notice, launch, loopback_interface
from helpers.dist.loopback import on_loopback


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


@pytest.mark.slow
def test_tensors_returned_by_workers_survive_their_exit():
    results = launch(workers.return_tensor, 2)
    assert [float(t.sum()) for t in results] == [0.0, 1000.0]


@pytest.mark.slow
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


@pytest.mark.slow
def test_a_collective_that_never_completes_times_out_clearly(tmp_path):
    marker = tmp_path / "rank1"
    with pytest.raises(WorkerError, match="did not complete within 2 s"):
        launch(workers.skip_collective, 2, str(marker), collective_timeout=2)
    # rank 1 had started its 60 s sleep, and was stopped in it, not awaited
    pid = int(marker.read_text())
    assert not pid_alive(pid) and mp.active_children() == []


@pytest.mark.slow
@pytest.mark.parametrize("how", ["abort", "raise"])
def test_a_workers_own_error_is_reported_before_the_teardown(how):
    """Reported first: a teardown that aborts or raises must not hide the error."""
    with pytest.raises(WorkerError) as info:
        launch(workers.fail_with_a_broken_teardown, 2, how, collective_timeout=30)
    assert str(info.value) == "worker rank 1 of 2 failed: ValueError: rank 1's own error"
    assert mp.active_children() == []


@pytest.mark.slow
def test_a_worker_that_dies_silently_is_named():
    with pytest.raises(WorkerError, match=r"rank 1 of 2 died \(exit code 3\)"):
        launch(workers.die_hard, 2, collective_timeout=30)
    assert mp.active_children() == []


@pytest.mark.slow
def test_a_script_without_a_main_guard_gets_told_how_to_fix_it(tmp_path):
    script = tmp_path / "unguarded.py"
    script.write_text(
        "import workers\n"
        "from helpers.dist.launch import launch\n"
        "launch(workers.rank_and_sum, 1, timeout=60)\n"  # no `if __name__ == '__main__':`
    )
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).parent)}
    out = subprocess.run(
        [sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=120
    )
    assert out.returncode != 0
    assert 'must do so under `if __name__ == "__main__":`' in out.stderr


@pytest.mark.slow
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


LAUNCHER = """
import multiprocessing as mp
import sys
sys.path.insert(0, {tests!r})
import workers
from helpers.dist.launch import launch
import helpers.dist.launch
helpers.dist.launch.STOP_GRACE = {grace}  # seconds stubborn workers get between SIGTERM and SIGKILL
if __name__ == "__main__":
    try:
        launch(workers.{fn}, 2, {pid_dir!r}, 120.0)
    except KeyboardInterrupt:
        # Still alive here, so the orphan watchdog cannot have stopped the workers.
        print("interrupted; workers alive:", len(mp.active_children()), flush=True)
        sys.exit(130)
"""


def _as_a_terminal_starts_it() -> None:
    """Ctrl-C's default action restored in the child: a shell that starts a job in the background
    (`make test &`, `nohup`) leaves SIGINT ignored, the child would inherit that, and Python only
    turns SIGINT into KeyboardInterrupt where it is not ignored at start-up."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


@pytest.fixture
def start_launcher(tmp_path: Path):
    """Start a script that launches 2 workers running ``fn`` (which sleep), as a terminal
    would; any still running at the end of the test is killed."""
    started: list[subprocess.Popen] = []

    def start(fn: str = "sleep_and_report_pid", grace: float = 3.0, **popen) -> subprocess.Popen:
        code = LAUNCHER.format(
            tests=str(Path(__file__).parent), fn=fn, pid_dir=str(tmp_path), grace=grace
        )
        proc = subprocess.Popen(
            [sys.executable, "-c", code],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            preexec_fn=_as_a_terminal_starts_it,
            **popen,
        )
        started.append(proc)
        return proc

    yield start
    for proc in started:
        if proc.poll() is None:
            proc.kill()  # its workers follow, through the orphan watchdog
            proc.communicate()


def wait_for_files(proc: subprocess.Popen, files: list[Path]) -> None:
    """Wait until every file exists and is written (a bound for a hang, not a timing)."""
    deadline = time.monotonic() + 120
    while not all(f.exists() and f.read_text() for f in files):
        assert time.monotonic() < deadline, "the workers never got there"
        assert proc.poll() is None, f"launcher exited early: {proc.communicate()}"
        time.sleep(0.1)


def wait_for_pids(tmp_path: Path, proc: subprocess.Popen) -> list[int]:
    files = [tmp_path / "0.pid", tmp_path / "1.pid"]
    wait_for_files(proc, files)
    return [int(f.read_text()) for f in files]


def wait_until_dead(pids: list[int]) -> list[int]:
    """The pids still alive once they have had ample time to exit (a bound for a hang)."""
    deadline = time.monotonic() + 30
    while any(pid_alive(pid) for pid in pids) and time.monotonic() < deadline:
        time.sleep(0.1)
    return [pid for pid in pids if pid_alive(pid)]


@pytest.mark.slow
def test_ctrl_c_stops_every_worker(tmp_path: Path, start_launcher):
    proc = start_launcher()
    pids = wait_for_pids(tmp_path, proc)
    proc.send_signal(signal.SIGINT)  # what interrupting a notebook cell sends
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 130 and "workers alive: 0" in out, out + err
    assert wait_until_dead(pids) == []


@pytest.mark.slow
def test_ctrl_c_in_a_terminal_reaches_the_whole_process_group(tmp_path: Path, start_launcher):
    """A terminal sends SIGINT to every process of the foreground group, workers included:
    they must leave the clean-up to the launcher, without a traceback each."""
    proc = start_launcher(start_new_session=True)
    pids = wait_for_pids(tmp_path, proc)
    os.killpg(proc.pid, signal.SIGINT)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 130 and "workers alive: 0" in out, out + err
    assert "Traceback" not in err and "KeyboardInterrupt" not in err, err
    assert wait_until_dead(pids) == []


@pytest.mark.slow
def test_a_second_ctrl_c_during_clean_up_kills_the_workers_at_once(tmp_path: Path, start_launcher):
    """The workers shrug off SIGTERM and the grace period before SIGKILL is 1000 s: only the
    second Ctrl-C can end the clean-up within the 60 s this test waits."""
    proc = start_launcher("stubborn_sleeper", grace=1000.0)
    pids = wait_for_pids(tmp_path, proc)
    proc.send_signal(signal.SIGINT)
    wait_for_files(proc, [tmp_path / "0.term", tmp_path / "1.term"])  # in the grace period
    proc.send_signal(signal.SIGINT)
    try:
        out, err = proc.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        pytest.fail("the second Ctrl-C was ignored: the clean-up waited out its grace period")
    assert proc.returncode == 130 and "workers alive: 0" in out, out + err
    assert wait_until_dead(pids) == []


@pytest.mark.slow
def test_workers_exit_when_their_parent_is_killed(tmp_path: Path, start_launcher):
    """SIGKILL leaves the launcher no chance to clean up: the orphan watchdog must."""
    proc = start_launcher()
    pids = wait_for_pids(tmp_path, proc)
    proc.kill()
    proc.communicate(timeout=60)
    assert wait_until_dead(pids) == [], "workers outlived their killed parent"


MID_SEND = """
import sys
sys.path.insert(0, {tests!r})
import workers
from helpers.dist.launch import WorkerError, launch
if __name__ == "__main__":
    try:
        launch(workers.exit_mid_send, 2, 200_000_000, collective_timeout=60)
    except WorkerError as err:
        print(err)
"""


@pytest.mark.slow
@pytest.mark.skipif(
    workers.WRITE_SYSCALL is None or not os.path.exists(f"/proc/self/task/{os.getpid()}/syscall"),
    reason="needs /proc/PID/task/TID/syscall on x86_64 or aarch64 Linux",
)
def test_a_worker_that_dies_half_way_through_sending_its_result_is_named():
    """Rank 1 dies while it writes its 200 MB result: the caller must not wait for the rest."""
    code = MID_SEND.format(tests=str(Path(__file__).parent))
    try:
        done = subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, timeout=240
        )
    except subprocess.TimeoutExpired:
        pytest.fail("the caller hung on the half-sent result")
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith(
        "worker rank 1 of 2 died (exit code 3) while sending its result ("
    ), done.stdout + done.stderr
    assert "of its 200,000,1" in done.stdout  # the pickled array's length, with its header


@pytest.mark.slow
def test_the_whole_run_timeout_stops_every_worker(tmp_path: Path):
    with pytest.raises(WorkerError, match=r"the 2 workers did not finish within 3 s; all stopped"):
        launch(workers.sleep_and_report_pid, 2, str(tmp_path), 120.0, timeout=3)
    assert mp.active_children() == []  # stopped, whether they had started sleeping or not


@pytest.mark.slow
def test_return_values_that_cannot_be_pickled_are_one_clear_error():
    with pytest.raises(WorkerError) as info:
        launch(workers.return_unpicklable, 2)
    message = str(info.value)
    assert "\n" not in message and "cannot be pickled" in message and "return plain data" in message
    with pytest.raises(WorkerError, match=r"returned a value that cannot be unpickled here"):
        launch(workers.return_unloadable, 2)
    assert mp.active_children() == []


@pytest.mark.slow
def test_several_workers_failing_at_once_are_all_reported():
    with pytest.raises(WorkerError) as info:
        launch(workers.fail_everywhere, 3, collective_timeout=30)
    err = info.value
    assert (
        str(err) == f"worker rank {err.rank} of 3 failed: ValueError: bad input on rank {err.rank}"
    )
    others = [note for note in err.__notes__ if "then failed too" in note]
    assert all("ValueError: bad input on rank" in note for note in others)
    assert len(others) <= 2 and f"rank {err.rank} then" not in " ".join(others)
    assert mp.active_children() == []


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
    stores, real_store = [], launch_module.loopback_store

    def recorded(*args, **kwargs):  # the launcher's store, to know its port
        stores.append(real_store(*args, **kwargs))
        return stores[-1]

    monkeypatch.setattr(launch_module, "loopback_store", recorded)
    found = launch(workers.listening_during_run, 2)[0]
    ports = {address.rsplit(":", 1)[1] for address in found}
    assert str(stores[0].port) in ports, "the caller's store was not seen: this proves nothing"
    assert len(ports) >= 3, f"the store and each worker's Gloo socket, at least: {found}"
    assert [a for a in found if not on_loopback(a)] == [], found


def test_a_gloo_interface_set_by_the_reader_is_kept_but_named(monkeypatch):
    monkeypatch.delenv("GLOO_SOCKET_IFNAME", raising=False)
    assert gloo_interface_notice() is None
    monkeypatch.setenv("GLOO_SOCKET_IFNAME", loopback_interface())
    assert gloo_interface_notice() is None
    monkeypatch.setenv("GLOO_SOCKET_IFNAME", "eth7")
    note = gloo_interface_notice()
    assert note.startswith("notice: GLOO_SOCKET_IFNAME=eth7") and "not only on loopback" in note


def test_threads_per_core_counts_hyperthread_siblings(monkeypatch, tmp_path):
    """Two CPUs that are siblings of one core: 2 threads per core; four CPUs on four cores: 1."""
    import builtins

    from helpers.dist import cores

    siblings = {0: "0,1", 1: "0,1", 2: "2", 3: "3"}
    real_open = builtins.open

    def fake_open(path, *args, **kwargs):
        if str(path).startswith("/sys/devices/system/cpu/cpu"):
            cpu = int(str(path).split("/cpu")[2].split("/")[0])
            (tmp_path / "s").write_text(siblings[cpu] + "\n")
            return real_open(tmp_path / "s", *args, **kwargs)
        return real_open(path, *args, **kwargs)

    monkeypatch.setattr(builtins, "open", fake_open)
    monkeypatch.setattr(cores.os, "sched_getaffinity", lambda pid: {0, 1}, raising=False)
    assert cores.threads_per_core() == 2
    monkeypatch.setattr(cores.os, "sched_getaffinity", lambda pid: {2, 3}, raising=False)
    assert cores.threads_per_core() == 1
