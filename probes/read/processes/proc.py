"""One process's facts from /proc: the part of psutil's ``Process`` that discovery uses.

Read directly because every command starts by finding the job: psutil's import alone costs a
one-shot ``snapshot`` 8 ms, and its objects read each ``stat`` twice. Values match psutil's
(``create_time`` to the bit, ``cmdline`` of a process that set its title), so records made here
and by the readers that still use psutil agree.
"""

from __future__ import annotations

import errno
import os
from collections.abc import Iterator

from . import procfs

CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
_boot_time: float | None = None


class ProcessError(Exception):
    """A process could not be read."""

    def __init__(self, pid: int, why: str = "") -> None:
        super().__init__(f"PID {pid}: {why}" if why else f"PID {pid}")
        self.pid = pid


class ProcessGone(ProcessError):
    """The process does not exist (any more)."""


class ProcessDenied(ProcessError):
    """The kernel refuses to show this part of the process (another user's, or more privileged)."""


def _failure(pid: int, exc: OSError) -> ProcessError:
    if exc.errno in (errno.EACCES, errno.EPERM):
        return ProcessDenied(pid, exc.strerror or "permission denied")
    return ProcessGone(pid, exc.strerror or "gone")


def boot_time() -> float:
    """When the machine booted (``btime`` of /proc/stat), as psutil reads it."""
    global _boot_time
    if _boot_time is None:
        for line in (procfs.read_text("/proc/stat") or "").splitlines():
            if line.startswith("btime"):
                _boot_time = float(line.split()[1])
                break
        else:
            _boot_time = 0.0
    return _boot_time


class Proc:
    """A process by PID; each method reads /proc when called. Raises :class:`ProcessGone` at
    construction when there is no such process."""

    __slots__ = ("pid",)

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self._stat()  # as psutil: a PID that does not exist is refused at once

    def __repr__(self) -> str:
        return f"Proc({self.pid})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Proc) and other.pid == self.pid

    def __hash__(self) -> int:
        return hash(self.pid)

    def _read(self, name: str) -> bytes:
        try:
            return procfs.read_all(f"/proc/{self.pid}/{name}")
        except OSError as exc:
            raise _failure(self.pid, exc) from None

    def _stat(self) -> tuple[str, list[bytes]]:
        """(comm, the fields after it): comm may hold spaces and parentheses, so cut at the last ")"."""
        data = self._read("stat")
        left, _, right = data.rpartition(b")")
        return left.partition(b"(")[2].decode(errors="replace"), right.split()

    def state(self) -> str:
        """R, S, D, T, t, Z, ..."""
        return self._stat()[1][0].decode()

    def ppid(self) -> int:
        return int(self._stat()[1][1])

    def create_time(self) -> float:
        """Seconds since the epoch, as psutil computes it (start ticks over the clock rate, plus boot time)."""
        return float(self._stat()[1][19]) / CLOCK_TICKS + boot_time()

    def name(self) -> str:
        """The kernel's name for it, completed from the command line where the kernel cut it (15 bytes)."""
        comm = self._stat()[0]
        if len(comm) >= 15:
            try:
                args = self.cmdline()
            except ProcessError:
                return comm
            if args:
                full = os.path.basename(args[0])
                if full.startswith(comm):
                    return full
        return comm

    def exe(self) -> str:
        """Its executable's path (without the kernel's " (deleted)" when the file is gone, as psutil)."""
        try:
            path = os.readlink(f"/proc/{self.pid}/exe").split("\0")[0]
        except OSError as exc:
            raise _failure(self.pid, exc) from None
        if path.endswith(" (deleted)") and not os.path.exists(path):
            path = path[:-len(" (deleted)")]
        return path

    def cmdline(self) -> list[str]:
        """Its arguments. A process that rewrote its title (setproctitle: Ray's workers) may separate
        them with spaces instead of NUL bytes; psutil splits those on spaces too."""
        data = self._read("cmdline").decode(errors="replace")
        if not data:
            return []
        sep = "\0" if data.endswith("\0") else " "
        if data.endswith(sep):
            data = data[:-1]
        args = data.split(sep)
        if sep == "\0" and len(args) == 1 and " " in data:
            args = data.split(" ")
        return args

    def environ(self) -> dict[str, str]:
        """The environment it started with (empty for a zombie)."""
        return procfs.parse_environ(self._read("environ"))

    def uid(self) -> int:
        """Its real user ID."""
        for line in self._read("status").decode(errors="replace").splitlines():
            if line.startswith("Uid:"):
                return int(line.split()[1])
        raise ProcessGone(self.pid, "no Uid in its status")

    def parent(self) -> Proc | None:
        ppid = self.ppid()
        if ppid <= 0:
            return None
        try:
            return Proc(ppid)
        except ProcessGone:
            return None

    def parents(self) -> list[Proc]:
        """Its ancestors, nearest first."""
        chain: list[Proc] = []
        proc = self.parent()
        while proc is not None and proc.pid not in {p.pid for p in chain}:
            chain.append(proc)
            proc = proc.parent()
        return chain

    def children(self, recursive: bool = False) -> list[Proc]:
        """Its children (every descendant with ``recursive``), from one scan of /proc."""
        tree = procfs.parent_map()
        pids = procfs.descendants(tree, self.pid) if recursive else tree.get(self.pid, ())
        return [proc for proc in map(_existing, pids) if proc is not None]


def _existing(pid: int) -> Proc | None:
    try:
        return Proc(pid)
    except ProcessGone:
        return None  # exited between the scan and the look


def all_processes() -> Iterator[Proc]:
    """Every process now, in PID order (those that exit meanwhile are left out)."""
    pids = sorted(int(name) for name in os.listdir("/proc") if name.isdigit())
    for pid in pids:
        proc = _existing(pid)
        if proc is not None:
            yield proc
