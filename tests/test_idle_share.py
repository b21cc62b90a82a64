"""The machine's idle share from two readings of /proc/stat: what notebook 07 records before
each timed launch instead of the lagging load average."""

from __future__ import annotations

import pytest

from helpers.training.measure import idle_between, idle_share

# user nice system idle iowait irq softirq steal guest guest_nice, in ticks
BEFORE = """cpu  300 0 0 300 0 0 0 0 0 0
cpu0 100 0 0 200 0 0 0 0 0 0
cpu1 200 0 0 100 0 0 0 0 0 0
intr 5 0 0
"""
# cpu0: 50 ticks busy, 50 idle; cpu1: 60 idle, 20 in iowait (nothing ran), 20 stolen by the
# hypervisor (busy elsewhere), and 70 of guest time that user already counts
AFTER = """cpu  350 0 0 410 20 0 0 20 70 0
cpu0 150 0 0 250 0 0 0 0 0 0
cpu1 200 0 0 160 20 0 0 20 70 0
intr 9 0 0
"""


def test_idle_share_of_the_named_cpus_counts_iowait_idle_and_steal_busy():
    assert idle_between(BEFORE, AFTER, {0}) == pytest.approx(50 / 100)
    assert idle_between(BEFORE, AFTER, {1}) == pytest.approx(80 / 100)  # guest not counted twice
    assert idle_between(BEFORE, AFTER, {0, 1}) == pytest.approx(130 / 200)


def test_without_cpus_the_all_cpu_line_is_read():
    assert idle_between(BEFORE, AFTER) == pytest.approx(130 / 200)


def test_readings_without_time_passing_are_refused_with_what_to_do():
    with pytest.raises(ValueError, match="read the second one later"):
        idle_between(BEFORE, BEFORE, {0})
    with pytest.raises(ValueError, match="name CPUs the file lists"):
        idle_between(BEFORE, AFTER, {7})


def test_this_machine_reads_a_share():
    share = idle_share(0.05)
    assert share is None or 0.0 <= share <= 1.0
