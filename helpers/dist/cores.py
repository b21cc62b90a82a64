"""How many cores the course may use and how it splits them: worker processes times threads per
worker never exceed the cores unless asked (``oversubscribe``), since timings on oversubscribed
cores measure contention, not scaling; and binds a worker's threads to cores (``pin_threads``),
for the measurements that compare pinned with free threads."""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass

ARTICLE_THREADS_PER_WORKER = 2  # the reference article gave each worker (one "machine") 2 threads

CORES_ENV = "DDP_COURSE_CORES"  # use at most this many cores (make test: 2, the reference machine)

CGROUP_ROOT = "/sys/fs/cgroup"


def _quota_cores(root: str = CGROUP_ROOT, proc_cgroup: str = "/proc/self/cgroup") -> int | None:
    """Whole cores a CFS bandwidth quota allows this process, rounded down (at least 1), or None
    without a quota: cgroup v2's ``cpu.max`` ("200000 100000": 2 cores; "max 100000": none), or
    v1's ``cpu.cfs_quota_us`` over ``cpu.cfs_period_us`` (-1: none), in the process's own cgroup
    and every cgroup above it (a limit anywhere up the tree applies; the tightest counts)."""
    try:
        lines = open(proc_cgroup, encoding="utf-8").read().splitlines()
    except OSError:
        return None
    limits = []
    for line in lines:
        _, controllers, path = line.split(":", 2)
        if controllers == "":  # v2, one hierarchy
            bases = [root]
        elif "cpu" in controllers.split(","):  # v1, the cpu controller's own hierarchy
            bases = [os.path.join(root, name) for name in (controllers, "cpu", "cpu,cpuacct")]
        else:
            continue
        parts = [p for p in path.split("/") if p]
        for base in bases:
            # from the process's cgroup up to the root; inside a container the path named by
            # /proc/self/cgroup may be the host's, and the container sees its own cgroup as root
            for depth in range(len(parts), -1, -1):
                here = os.path.join(base, *parts[:depth])
                try:
                    if controllers == "":
                        quota, period = open(os.path.join(here, "cpu.max")).read().split()[:2]
                    else:
                        quota = open(os.path.join(here, "cpu.cfs_quota_us")).read().strip()
                        period = open(os.path.join(here, "cpu.cfs_period_us")).read().strip()
                except (OSError, ValueError):
                    continue
                if quota not in ("max", "-1") and int(period) > 0:
                    limits.append(max(1, int(quota) // int(period)))
    return min(limits) if limits else None


def machine_cores() -> int:
    """Cores this process may run on: its CPU affinity (what a cpuset allows), capped on Linux by a
    CFS bandwidth quota (a container's CPU limit: Kubernetes' ``limits.cpu``, ``docker run
    --cpus``), which leaves the affinity alone but throttles the process once its threads have
    used the quota in a period."""
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # macOS, Windows
        return os.cpu_count() or 1
    quota = _quota_cores()
    return min(cores, quota) if quota else cores


def available_cores() -> int:
    """Cores the course plans with: the machine's, capped by ``$DDP_COURSE_CORES`` if set.

    The cap lets a bigger machine behave like the 2-core reference machine (``make test`` sets
    it, so the notebooks' checked outputs are reproduced), or leaves cores free for other work.
    """
    cores = machine_cores()
    cap = os.environ.get(CORES_ENV)
    if cap is None:
        return cores
    if not cap.isdigit() or int(cap) < 1:
        raise ValueError(f"{CORES_ENV} must be a whole number of cores, at least 1; got {cap!r}")
    return min(cores, int(cap))


def default_threads_per_worker(cores: int | None = None) -> int:
    """The article's 2 threads per worker where the cores allow it, else fewer so that at least
    2 workers fit (1 thread each on a 2-core machine)."""
    cores = available_cores() if cores is None else cores
    return (
        ARTICLE_THREADS_PER_WORKER
        if cores >= 2 * ARTICLE_THREADS_PER_WORKER
        else max(1, cores // 2)
    )


@dataclass(frozen=True)
class WorldPlan:
    """Whether a world size runs on this machine, with how many threads per worker, and why."""

    world_size: int
    threads_per_worker: int
    cores: int
    runs: bool
    oversubscribed: bool
    reason: str

    @property
    def total_threads(self) -> int:
        return self.world_size * self.threads_per_worker


def plan_world_sizes(
    world_sizes: Sequence[int],
    threads_per_worker: int | None = None,
    cores: int | None = None,
    oversubscribe: bool = False,
) -> list[WorldPlan]:
    """Decide, for each world size, whether it fits the cores. A world size that would run more
    threads than there are cores is skipped with a reason, unless ``oversubscribe`` is set, in
    which case it runs and is flagged: its timings measure contention, not scaling."""
    cores = available_cores() if cores is None else cores
    threads = (
        default_threads_per_worker(cores) if threads_per_worker is None else threads_per_worker
    )
    if threads < 1:
        raise ValueError(f"threads per worker must be at least 1, got {threads}")
    plans = []
    for world in world_sizes:
        if world < 1:
            raise ValueError(f"a world size must be at least 1 worker, got {world}")
        total = world * threads
        over = total > cores
        if not over:
            plans.append(
                WorldPlan(world, threads, cores, True, False, f"{total} threads on {cores} cores")
            )
        elif oversubscribe:
            reason = f"OVERSUBSCRIBED: {total} threads on {cores} cores, timings show contention"
            plans.append(WorldPlan(world, threads, cores, True, True, reason))
        else:
            reason = (
                f"skipped: {world} workers x {threads} threads = {total} threads > {cores} cores "
                "(pass oversubscribe=True / --oversubscribe to run it anyway)"
            )
            plans.append(WorldPlan(world, threads, cores, False, True, reason))
    return plans


def thread_policy_note(cores: int | None = None) -> str:
    """One line saying how many threads each worker gets here and why."""
    cores = available_cores() if cores is None else cores
    threads = default_threads_per_worker(cores)
    if threads == ARTICLE_THREADS_PER_WORKER:
        return f"{cores} cores: {threads} threads per worker, as in the reference article"
    return (
        f"{cores} cores: {threads} thread(s) per worker instead of the article's "
        f"{ARTICLE_THREADS_PER_WORKER}, so that at least 2 workers fit without oversubscribing"
    )


def threads_per_core() -> int | None:
    """Hardware threads per physical core among the CPUs this process may use (2 where the
    "cores" are hyperthreads sharing one core's arithmetic units: two workers on them get far
    less than twice one's compute), or None where the platform does not say (not Linux)."""
    try:
        cpus = os.sched_getaffinity(0)
    except AttributeError:
        return None
    cores = set()
    for cpu in cpus:
        try:
            with open(f"/sys/devices/system/cpu/cpu{cpu}/topology/thread_siblings_list") as f:
                cores.add(f.read().strip())
        except OSError:
            return None
    return max(1, round(len(cpus) / len(cores)))


def pin_threads(cpus: set[int]) -> int:
    """Set the affinity of every thread of this process, those Gloo started at
    ``init_process_group`` included (``sched_setaffinity`` on a thread id acts on that thread
    only; threads started later inherit their creator's). Returns how many threads it set."""
    pinned = 0
    for tid in os.listdir("/proc/self/task"):
        try:
            os.sched_setaffinity(int(tid), cpus)
            pinned += 1
        except (ProcessLookupError, FileNotFoundError):  # a thread that has just exited
            continue
    return pinned


def thread_affinities() -> set[frozenset[int]]:
    """The distinct CPU sets of this process's threads (Linux: ``/proc/self/task``)."""
    found = set()
    for tid in os.listdir("/proc/self/task"):
        try:
            found.add(frozenset(os.sched_getaffinity(int(tid))))
        except (ProcessLookupError, FileNotFoundError):
            continue
    return found
