"""machine_cores under a container's CPU quota, read from fake cgroup files (v2 and v1): a quota
leaves the CPU affinity alone, so only the cgroup files tell the course how many cores it gets."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from helpers.dist import cores
from helpers.dist.cores import _quota_cores, machine_cores


def cgroup(tmp_path: Path, proc: str, files: dict[str, str]) -> tuple[str, str]:
    """A fake /sys/fs/cgroup holding ``files`` and a fake /proc/self/cgroup reading ``proc``."""
    root = tmp_path / "cgroup"
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    (tmp_path / "proc_cgroup").write_text(proc)
    return str(root), str(tmp_path / "proc_cgroup")


@pytest.mark.parametrize(
    ("proc", "files", "expected"),
    [
        ("0::/\n", {"cpu.max": "200000 100000\n"}, 2),  # a container's 2-CPU limit
        ("0::/\n", {"cpu.max": "150000 100000\n"}, 1),  # 1.5 CPUs: 1 whole core fits
        ("0::/\n", {"cpu.max": "50000 100000\n"}, 1),  # half a CPU: still 1, never 0
        ("0::/\n", {"cpu.max": "max 100000\n"}, None),  # no quota
        ("0::/\n", {}, None),  # no cpu controller enabled
        # the process's own cgroup and one above it: the tighter limit applies
        ("0::/kubepods/pod1\n", {"cpu.max": "max 100000\n",
                                 "kubepods/cpu.max": "400000 100000\n",
                                 "kubepods/pod1/cpu.max": "300000 100000\n"}, 3),
        ("0::/kubepods/pod1\n", {"kubepods/cpu.max": "200000 100000\n",
                                 "kubepods/pod1/cpu.max": "max 100000\n"}, 2),
        # v1: the cpu controller's hierarchy, under any of its usual mount names
        ("4:memory:/x\n3:cpu,cpuacct:/docker/abc\n",
         {"cpu,cpuacct/docker/abc/cpu.cfs_quota_us": "400000\n",
          "cpu,cpuacct/docker/abc/cpu.cfs_period_us": "100000\n"}, 4),
        ("1:cpu:/\n", {"cpu/cpu.cfs_quota_us": "-1\n", "cpu/cpu.cfs_period_us": "100000\n"}, None),
        # a path the container cannot see (the host's): the container's own root counts
        ("0::/system.slice/docker-abc.scope\n", {"cpu.max": "100000 100000\n"}, 1),
    ],
)  # fmt: skip
def test_the_quota_is_read_from_cgroup_v2_and_v1(tmp_path, proc, files, expected):
    assert _quota_cores(*cgroup(tmp_path, proc, files)) == expected


def test_unreadable_files_mean_no_quota(tmp_path):
    root, _ = cgroup(tmp_path, "0::/\n", {"cpu.max": "garbage\n"})
    assert _quota_cores(root, str(tmp_path / "missing")) is None
    assert _quota_cores(*cgroup(tmp_path, "0::/\n", {"cpu.max": "garbage\n"})) is None


@pytest.mark.skipif(not hasattr(os, "sched_getaffinity"), reason="no CPU affinity on this OS")
def test_machine_cores_is_the_affinity_capped_by_the_quota(tmp_path, monkeypatch):
    affinity = len(os.sched_getaffinity(0))
    monkeypatch.setattr(cores, "_quota_cores", lambda: 1)
    assert machine_cores() == 1
    monkeypatch.setattr(cores, "_quota_cores", lambda: affinity + 8)
    assert machine_cores() == affinity, "a quota above the affinity adds no cores"
    monkeypatch.setattr(cores, "_quota_cores", lambda: None)
    assert machine_cores() == affinity
