"""The memory cgroup's own count of OOM kills: evidence that outlives a rank the kernel killed.

A rank killed by the OOM killer dies of SIGKILL with no word of its own; the kernel log says
why only where it is readable (root, ``dmesg_restrict``). The rank's memory cgroup counts every
OOM kill in it: cgroup v2 ``memory.events`` (``oom_kill N``, with ``memory.peak`` and
``memory.max``), v1 ``memory.oom_control`` (``oom_kill N``, with ``memory.max_usage_in_bytes``
and ``memory.limit_in_bytes``). Read the count while the rank lives, again once it is gone: a
count that grew in between is an OOM kill in its cgroup.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from . import procfs
from ...record import Record

ROOT = Path("/sys/fs/cgroup")
UNLIMITED = 1 << 60  # v1 writes "no limit" as a number near 2**63


@dataclass(frozen=True, repr=False)
class MemoryCgroup(Record):
    """A memory cgroup (v1 or v2) and the OOM kills it counts."""

    path: str
    version: int  # 1 or 2

    def _read(self, name: str) -> str | None:
        return procfs.read_text(str(Path(self.path) / name))

    def oom_kills(self) -> int | None:
        text = self._read("memory.events" if self.version == 2 else "memory.oom_control")
        for line in (text or "").splitlines():
            key, _, value = line.partition(" ")
            if key == "oom_kill" and value.strip().isdigit():
                return int(value)
        return None

    def peak_and_limit(self) -> tuple[int | None, int | None]:
        names = ("memory.peak", "memory.max") if self.version == 2 else ("memory.max_usage_in_bytes",
                                                                          "memory.limit_in_bytes")
        values = []
        for name in names:
            text = (self._read(name) or "").strip()
            number = int(text) if text.isdigit() else None
            values.append(None if number is not None and number >= UNLIMITED else number)
        return values[0], values[1]


def memory_cgroup(pid: int, root: Path = ROOT) -> MemoryCgroup | None:
    """The process's memory cgroup folder, v1 or v2, where it is mounted at the usual place."""
    text = procfs.read_text(f"/proc/{pid}/cgroup") or ""
    v2 = None
    for line in text.splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        controllers, path = parts[1].split(","), parts[2].strip()
        if "memory" in controllers:
            folder = root / "memory" / path.lstrip("/")
            if (folder / "memory.oom_control").exists():
                return MemoryCgroup(str(folder), 1)
        elif parts[0] == "0" and parts[1] == "":
            v2 = path
    if v2 is not None:
        for base in (root, root / "unified"):
            folder = base / v2.lstrip("/")
            if (folder / "memory.events").exists():
                return MemoryCgroup(str(folder), 2)
    return None


def describe(before: int, after: int, cgroup: MemoryCgroup) -> str:
    """``cgroup memory.events oom_kill 0 -> 1; peak 1.0 GiB of a 1.0 GiB limit``."""
    peak, limit = cgroup.peak_and_limit()
    name = "memory.events" if cgroup.version == 2 else "memory.oom_control"
    text = f"its memory cgroup counted an OOM kill ({name} oom_kill {before} -> {after}"
    if peak is not None:
        text += f"; peak {_gib(peak)}" + (f" of a {_gib(limit)} limit" if limit else "")
    return text + ")"


def _gib(value: int) -> str:
    return f"{value / 2**30:.2f} GiB" if value >= 2**30 else f"{value / 2**20:.0f} MiB"
