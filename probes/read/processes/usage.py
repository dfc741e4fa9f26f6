"""CPU share and resident memory of a process, from /proc/PID/stat and statm, between two reads."""

from __future__ import annotations

import os

from .proc import CLOCK_TICKS

PAGE_SIZE = os.sysconf("SC_PAGE_SIZE")


class CpuMeter:
    """Per PID, the CPU time at the last read: each read gives the CPU% since the one before."""

    def __init__(self) -> None:
        self._last: dict[int, tuple[float, float]] = {}

    def forget(self, pid: int) -> None:
        self._last.pop(pid, None)

    def read(self, pid: int, now: float) -> tuple[float | None, int | None]:
        """(CPU% since the last read of ``pid``, resident bytes); None for what is unknown."""
        try:
            with open(f"/proc/{pid}/stat", "rb") as handle:
                fields = handle.read().rpartition(b")")[2].split()
            with open(f"/proc/{pid}/statm", "rb") as handle:
                rss = int(handle.read().split()[1]) * PAGE_SIZE
        except (OSError, IndexError, ValueError):  # gone (or a zombie's empty statm): nothing to measure
            return None, None
        total = (int(fields[11]) + int(fields[12])) / CLOCK_TICKS  # utime + stime
        prev = self._last.get(pid)
        self._last[pid] = (total, now)
        if prev is None or now <= prev[1]:
            return None, rss
        return round(100.0 * (total - prev[0]) / (now - prev[1]), 1), rss
