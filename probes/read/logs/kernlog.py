"""The kernel's own word on how a process died: ``segfault at``, ``traps:`` and OOM-killer lines of /dev/kmsg.

When the launcher reaps a dead rank before anyone reads its exit status (torchrun polls every
0.1 s), the kernel log still names the PID that faulted. Read non-blocking and bounded.
"""

from __future__ import annotations

import os
import re

FAULT_LINE = re.compile(r"\[(?P<pid>\d+)\]: (?P<what>segfault at|general protection|trap (?P<trap>[a-z ]+?))\b")
OOM_LINE = re.compile(r"Killed process (?P<pid>\d+) ")  # the kernel's OOM killer
TRAP_SIGNALS = {"invalid opcode": "SIGILL", "divide error": "SIGFPE", "int3": "SIGTRAP"}
MAX_RECORDS = 20000


def kernel_fault(pid: int, path: str = "/dev/kmsg") -> tuple[str, str] | None:
    """(signal name, kernel line) for the last fault the kernel logged for ``pid``, or None."""
    found = None
    for line in _records(path):
        match = FAULT_LINE.search(line)
        if match and int(match.group("pid")) == pid:
            trap = (match.group("trap") or "").strip()
            found = (TRAP_SIGNALS.get(trap, "SIGSEGV"), line.split(";", 1)[-1].strip())
        oom = OOM_LINE.search(line)
        if oom and int(oom.group("pid")) == pid:
            found = ("SIGKILL", line.split(";", 1)[-1].strip())
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
            records.append(chunk.decode("utf-8", "replace"))
    finally:
        os.close(fd)
    return records
