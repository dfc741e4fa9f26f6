"""The kernel's own word on how a process died: ``segfault at``, ``traps:`` and OOM-killer lines of /dev/kmsg.

When the launcher reaps a dead rank before anyone reads its exit status (torchrun polls every
0.1 s), the kernel log still names the PID that faulted. Each look reads only the records logged
since the last (non-blocking, bounded): ranks that die together cost one read of the log, and a
fault logged a moment after another rank's is still seen.
"""

from __future__ import annotations

import re
import threading

from .kmsg import KmsgRecords

# x86 words them "comm[pid]: segfault at …", "traps: comm[pid] trap invalid opcode …" and
# "traps: comm[pid] general protection fault …" (no colon after the PID but for segfaults).
FAULT_LINE = re.compile(r"\[(?P<pid>\d+)\]:? (?P<what>segfault at|general protection|trap (?P<trap>[a-z0-9 ]+?) ip:)")
OOM_LINE = re.compile(r"Killed process (?P<pid>\d+) ")  # the kernel's OOM killer
TRAP_SIGNALS = {"invalid opcode": "SIGILL", "divide error": "SIGFPE", "int3": "SIGTRAP"}
FAULTS_KEPT = 4096  # PIDs whose last fault is remembered (the latest)


class KernelFaults:
    """The last fault the kernel logged for each PID, kept up to date from one kernel log."""

    def __init__(self, path: str) -> None:
        self._records = KmsgRecords(path)
        self._faults: dict[int, tuple[str, str]] = {}
        self._lock = threading.Lock()  # the live view and the crash catcher's thread both ask

    def of(self, pid: int) -> tuple[str, str] | None:
        with self._lock:
            for line in self._records.new_lines():
                self._take(line)
            while len(self._faults) > FAULTS_KEPT:
                del self._faults[next(iter(self._faults))]
            return self._faults.get(pid)

    def _take(self, line: str) -> None:
        match = FAULT_LINE.search(line)
        if match:
            trap = (match.group("trap") or "").strip()
            self._note(int(match.group("pid")), (TRAP_SIGNALS.get(trap, "SIGSEGV"), line.split(";", 1)[-1].strip()))
        oom = OOM_LINE.search(line)
        if oom:
            self._note(int(oom.group("pid")), ("SIGKILL", line.split(";", 1)[-1].strip()))

    def _note(self, pid: int, fault: tuple[str, str]) -> None:
        self._faults.pop(pid, None)  # the latest fault last, so the oldest PIDs go first
        self._faults[pid] = fault


_logs: dict[str, KernelFaults] = {}
_logs_lock = threading.Lock()


def kernel_fault(pid: int, path: str = "/dev/kmsg") -> tuple[str, str] | None:
    """(signal name, kernel line) for the last fault the kernel logged for ``pid``, or None."""
    with _logs_lock:
        faults = _logs.get(path) or _logs.setdefault(path, KernelFaults(path))
    return faults.of(pid)
