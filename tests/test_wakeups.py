"""The wake-up probe of notebook 02: the kernel's HZ, per-thread context switches, the spinner
that leaves nothing behind, and one small run of the probe between 2 real workers."""

from __future__ import annotations

import gzip
import os
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest

from helpers.dist.wakeups import (
    CONDITIONS,
    _thread_switches,
    kernel_hz,
    probe_wakeups,
    slow_calls,
    slow_calls_text,
    steal_seconds,
    stopped_spinner,
    wait_threshold,
)


def test_kernel_hz_reads_a_build_configuration(tmp_path: Path):
    plain, packed = tmp_path / "config-x", tmp_path / "config.gz"
    plain.write_text("CONFIG_HZ_300=y\nCONFIG_HZ=300\n")
    with gzip.open(packed, "wt") as f:
        f.write("# CONFIG_HZ_1000 is not set\nCONFIG_HZ=250\n")
    assert kernel_hz([plain]) == 300
    assert kernel_hz([tmp_path / "missing", packed]) == 250  # the first readable one
    assert kernel_hz([tmp_path / "missing"]) is None


def test_a_wait_is_half_a_tick_or_2_ms_where_the_tick_is_unknown():
    assert wait_threshold(250) == 2e-3 and wait_threshold(1000) == 5e-4
    assert wait_threshold(None) == wait_threshold(250)  # the commonest tick stands in


def test_steal_is_the_eighth_number_of_the_cpu_line(tmp_path: Path):
    stat = tmp_path / "stat"
    stat.write_text("cpu  1510466 137 180615 958132 5785 0 4676 7634 0 0\ncpu0 1 2 3 4 5 6 7 8\n")
    assert steal_seconds(stat) == 7634 / os.sysconf("SC_CLK_TCK")
    stat.write_text("cpu  1510466 137 180615 958132 5785 0 4676\n")  # before Linux 2.6.11
    assert steal_seconds(stat) is None
    stat.write_text("intr 1 2 3\n")
    assert steal_seconds(stat) is None  # not a cpu line: unreadable, not zero
    assert steal_seconds(tmp_path / "missing") is None


def test_a_sleep_is_a_voluntary_switch_of_this_thread():
    me = _thread_switches()[_main_tid()]
    time.sleep(0.01)
    after = _thread_switches()[_main_tid()]
    assert after[0] >= me[0] + 1


def _main_tid() -> int:
    return os.getpid()  # the main thread's id is the process's


def _probed(steal: float | None) -> pd.DataFrame:
    """A probe_wakeups table as it would come back: two conditions, HZ = 250 (slow: over 2 ms)."""
    table = pd.DataFrame({"p25_ms": [0.5, 1.0], "slow_share": [2 / 3, 0.5],
                          "involuntary": [9.0, 3.0]})  # fmt: skip
    table.attrs.update(hz=250, slow_ms=2.0, times=[[0.0005, 0.003, 0.005], [0.001, 0.0025]],
                       steal_s=steal, seconds=1.0, cpus=2)  # fmt: skip
    return table


def test_slow_calls_are_counted_against_the_tick_and_their_conditions_first_quartile():
    found = slow_calls(_probed(0.004))
    assert found["count"] == 3  # 3, 5 and 2.5 ms: over half a 4 ms tick
    assert found["under_one_tick"] == 2 / 3  # 3 and 2.5 ms
    assert abs(found["extra_s"] - ((0.003 - 0.0005) + (0.005 - 0.0005) + (0.0025 - 0.001))) < 1e-12
    assert found["most_slow"] == found["most_involuntary"] == 0
    text = slow_calls_text(_probed(0.004))
    assert "took 8 ms beyond" in text and "the same" in text and "0.2% of their time" in text
    assert "not readable" in slow_calls_text(_probed(None))  # no /proc/stat: said, not zero


def test_without_the_tick_the_slow_calls_are_counted_but_not_set_against_it():
    table = _probed(0.0)
    table.attrs["hz"] = None
    assert slow_calls(table)["under_one_tick"] is None
    assert "under one tick" not in slow_calls_text(table)


def test_the_spinner_is_stopped_then_gone():
    with stopped_spinner() as pid:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        assert state == "T"  # stopped: it takes no core until a worker lets it run
    assert not Path(f"/proc/{pid}").exists() or "Z" in Path(f"/proc/{pid}/stat").read_text()


def test_probe_refuses_too_few_calls():
    with pytest.raises(ValueError, match="calls >= 4"):
        probe_wakeups(calls=2)
    with pytest.raises(ValueError, match="block >= 1"):
        probe_wakeups(block=0)


def test_probe_between_two_workers():
    table = probe_wakeups(nbytes=4096, calls=8, block=3)  # 3 rounds, the last one short
    assert len(table) == len(CONDITIONS)
    assert all(len(times) == 8 for times in table.attrs["times"])
    assert all(0 < t < 60 for times in table.attrs["times"] for t in times)  # all timed (no NaN)
    assert 0 < sum(sum(times) for times in table.attrs["times"]) < table.attrs["seconds"]
    steal = table.attrs["steal_s"]
    assert steal is None or 0 <= steal <= table.attrs["seconds"] * table.attrs["cpus"] + 0.02
    assert (table["p25_ms"] <= table["median_ms"]).all()
    assert (table["median_ms"] <= table["p75_ms"]).all()
    assert (table["voluntary"] >= 1).all()  # each call sleeps: Gloo does not busy-wait
    assert "gloo_tcp_loop" in table.attrs["woken"]  # Gloo's socket loop wakes every call


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")
def test_a_killed_parent_takes_its_stopped_spinner_with_it():
    code = (
        "import os, signal\nfrom helpers.dist.wakeups import stopped_spinner\n"
        "print(stopped_spinner().__enter__(), flush=True)\n"
        "os.kill(os.getpid(), signal.SIGKILL)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    stat = Path(f"/proc/{int(out.stdout)}/stat")
    for _ in range(50):  # SIGKILL on the parent's death: dead (gone, or a zombie) at once
        if not stat.exists() or stat.read_text().rsplit(")", 1)[1].split()[0] in "ZX":
            return
        time.sleep(0.1)
    raise AssertionError("the spinner outlived the process that started it")
