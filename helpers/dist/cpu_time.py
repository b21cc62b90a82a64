"""How the CPUs spent their time, from Linux's ``/proc/stat``: one reader for the steal time of
02's wake-up probe and the idle share recorded before a timing (07, 08), which both need the
same counters; and one reader of a process's own ``/proc/<pid>/stat`` line."""

from __future__ import annotations

from pathlib import Path

STAT = Path("/proc/stat")

# The columns of a ``cpu`` line that count a CPU's time, in USER_HZ ticks. Guest time (the
# columns after these) is already inside user and nice, so it is left out.
COLUMNS = ("user", "nice", "system", "idle", "iowait", "irq", "softirq", "steal")


def cpu_ticks(text: str, cpus: set[int] | None = None) -> dict[str, int]:
    """Each of ``COLUMNS`` summed over the ``cpu<N>`` lines of ``cpus``, or taken from the
    all-CPU ``cpu`` line where ``cpus`` is None. Empty where ``text`` has none of those lines
    (or only lines too short to carry steal time, as before Linux 2.6.11)."""
    names = {"cpu"} if cpus is None else {f"cpu{n}" for n in cpus}
    totals: dict[str, int] = {}
    for line in text.splitlines():
        fields = line.split()
        if fields and fields[0] in names and len(fields) > len(COLUMNS):
            for column, count in zip(COLUMNS, fields[1:], strict=False):
                totals[column] = totals.get(column, 0) + int(count)
    return totals


def read_stat(stat: Path = STAT) -> str | None:
    """``/proc/stat``'s text, or None where it cannot be read (not Linux)."""
    try:
        return stat.read_text()
    except OSError:
        return None


def process_stat(pid: int) -> list[str] | None:
    """The fields of ``/proc/<pid>/stat`` after the command name (so index 0 is field 3, the
    state; utime is index 11, the start time index 19), or None where the process has gone or
    there is no /proc (not Linux). Split after the last ")": a command name may hold spaces."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
