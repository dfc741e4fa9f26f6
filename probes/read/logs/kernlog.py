"""The kernel's own word on how a process died: ``segfault at``, ``traps:`` and OOM-killer lines of /dev/kmsg.

When the launcher reaps a dead rank before anyone reads its exit status (torchrun polls every
0.1 s), the kernel log still names the PID that faulted. Read non-blocking and bounded.
"""

from __future__ import annotations

import os
import re
import time

# x86 words them "comm[pid]: segfault at …", "traps: comm[pid] trap invalid opcode …" and
# "traps: comm[pid] general protection fault …" (no colon after the PID but for segfaults).
FAULT_LINE = re.compile(r"\[(?P<pid>\d+)\]:? (?P<what>segfault at|general protection|trap (?P<trap>[a-z0-9 ]+?) ip:)")
OOM_LINE = re.compile(r"Killed process (?P<pid>\d+) ")  # the kernel's OOM killer
TRAP_SIGNALS = {"invalid opcode": "SIGILL", "divide error": "SIGFPE", "int3": "SIGTRAP"}
MAX_RECORDS = 20000
FRESH_S = 0.5  # ranks that die together (a restart, a crash of all ranks) share one read of the log

_read: dict[str, tuple[float, dict[int, tuple[str, str]]]] = {}  # path -> (when read, faults by PID)


def kernel_fault(pid: int, path: str = "/dev/kmsg") -> tuple[str, str] | None:
    """(signal name, kernel line) for the last fault the kernel logged for ``pid``, or None."""
    at, faults = _read.get(path, (None, {}))
    if at is None or time.monotonic() - at > FRESH_S:
        faults = _faults(_records(path))
        _read[path] = (time.monotonic(), faults)
    return faults.get(pid)


def _faults(records: list[str]) -> dict[int, tuple[str, str]]:
    """The last fault the kernel logged for each PID in ``records``."""
    found: dict[int, tuple[str, str]] = {}
    for line in records:
        match = FAULT_LINE.search(line)
        if match:
            trap = (match.group("trap") or "").strip()
            found[int(match.group("pid"))] = (TRAP_SIGNALS.get(trap, "SIGSEGV"), line.split(";", 1)[-1].strip())
        oom = OOM_LINE.search(line)
        if oom:
            found[int(oom.group("pid"))] = ("SIGKILL", line.split(";", 1)[-1].strip())
    return found


def _records(path: str) -> list[str]:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except OSError:
        return []
    records: list[str] = []
    try:
        while len(records) < MAX_RECORDS:
            try:
                chunk = os.read(fd, 8192)
            except BlockingIOError:
                break
            except OSError:  # EPIPE: a record was overwritten while reading; go on
                continue
            if not chunk:
                break
            records.extend(chunk.decode("utf-8", "replace").splitlines())  # /dev/kmsg: one record a read
    finally:
        os.close(fd)
    return records
