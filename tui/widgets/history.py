"""Short per-rank histories of CPU and GPU use, kept by the app across polls."""

from __future__ import annotations

from collections import deque

from ...probes import Snapshot


class History:
    """The last ``length`` CPU%, GPU util% and step period samples of every rank key."""

    def __init__(self, length: int = 8) -> None:
        self.length = length
        self._cpu: dict[str, deque[float | None]] = {}
        self._gpu: dict[str, deque[float | None]] = {}
        self._period: dict[str, deque[float | None]] = {}

    def record(self, snapshot: Snapshot) -> None:
        for rank in snapshot.ranks:
            gpu = rank.gpu.util_pct if rank.gpu is not None else None
            self._cpu.setdefault(rank.key, deque(maxlen=self.length)).append(rank.cpu_pct)
            self._gpu.setdefault(rank.key, deque(maxlen=self.length)).append(gpu)
            self._period.setdefault(rank.key, deque(maxlen=self.length)).append(rank.step_period_s)

    def cpu(self, key: str) -> list[float | None]:
        return list(self._cpu.get(key, ()))

    def gpu(self, key: str) -> list[float | None]:
        return list(self._gpu.get(key, ()))

    def step_period(self, key: str) -> list[float | None]:
        """Seconds per step, for a sparkline scaled to the largest value shown."""
        return list(self._period.get(key, ()))
