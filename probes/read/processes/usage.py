"""CPU share and resident memory of a process, from psutil, between two reads."""

from __future__ import annotations

import psutil


class CpuMeter:
    """Per PID, the CPU time at the last read: each read gives the CPU% since the one before."""

    def __init__(self) -> None:
        self._last: dict[int, tuple[float, float]] = {}

    def forget(self, pid: int) -> None:
        self._last.pop(pid, None)

    def read(self, pid: int, now: float) -> tuple[float | None, int | None]:
        """(CPU% since the last read of ``pid``, resident bytes); None for what is unknown."""
        try:
            proc = psutil.Process(pid)
            times = proc.cpu_times()
            rss = proc.memory_info().rss
        except psutil.Error:
            return None, None
        total = times.user + times.system
        prev = self._last.get(pid)
        self._last[pid] = (total, now)
        if prev is None or now <= prev[1]:
            return None, rss
        return round(100.0 * (total - prev[0]) / (now - prev[1]), 1), rss
