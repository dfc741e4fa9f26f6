"""Who is at the other end of what a rank's main thread is blocked on, from /proc alone.

The kernel's view (``kernel_view.py``) names the call and its file descriptor; this finds the
process that could answer: the child a ``wait4`` waits for, the processes holding a pipe's or a
FIFO's write end, the local process holding a TCP connection's other end. A small reader for the
one blocked descriptor of a stuck rank: the scan of other processes' descriptors is bounded in
processes and time, and says nothing rather than guess when cut short.
"""

from __future__ import annotations

import os
import time

from ...redact import redact_cmdline, scrub
from ...snapshot import PeerProcess
from . import procfs

COMMAND_CHARS = 160  # a command line is cut here: enough to tell `git push origin main` from another
SCAN_PROCESSES = 4096  # at most this many processes' descriptors looked at per question
SCAN_BUDGET_S = 0.25
O_ACCMODE, O_WRONLY, O_RDWR = 0o3, 0o1, 0o2


def process(pid: int, now: float | None = None) -> PeerProcess | None:
    """The process ``pid``: its command line (secrets masked, cut) and how long it has run; None when gone."""
    raw = procfs.read_bytes(f"/proc/{pid}/cmdline")
    if raw is None:
        return None
    args = [a.decode(errors="replace") for a in raw.rstrip(b"\0").split(b"\0")] if raw else []
    if not args:  # a kernel thread, or a zombie: its name
        args = [(procfs.read_text(f"/proc/{pid}/comm") or "?").strip()]
    command = scrub(" ".join(redact_cmdline(args)))
    if len(command) > COMMAND_CHARS:
        command = command[:COMMAND_CHARS - 1] + "…"
    return PeerProcess(pid=pid, command=command, age_s=_age(pid, now or time.time()))


def _age(pid: int, now: float) -> float | None:
    """Seconds since ``pid`` started (its stat's start time after boot, the boot time from /proc/stat)."""
    stat = procfs.read_text(f"/proc/{pid}/stat")
    boot = next((line.split()[1] for line in (procfs.read_text("/proc/stat") or "").splitlines()
                 if line.startswith("btime ")), None)
    if not stat or boot is None:
        return None
    try:
        ticks = int(stat.rsplit(")", 1)[1].split()[19])
        return round(max(0.0, now - (int(boot) + ticks / os.sysconf("SC_CLK_TCK"))), 1)
    except (ValueError, IndexError, OSError):
        return None


def children(pid: int) -> list[int]:
    """The direct children of ``pid`` (every thread's)."""
    found: list[int] = []
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return found
    for tid in tasks:
        found += [int(c) for c in (procfs.read_text(f"/proc/{pid}/task/{tid}/children") or "").split()]
    return sorted(set(found))


def holders(link: str, exclude: int, writing: bool = False) -> list[int] | None:
    """PIDs other than ``exclude`` with a descriptor on ``link`` (``pipe:[123]``, ``socket:[456]``
    or a path), open for writing when ``writing``; None when the scan was cut short (too many
    processes, out of time) without finding one."""
    found: list[int] = []
    deadline = time.monotonic() + SCAN_BUDGET_S
    try:
        pids = [int(name) for name in os.listdir("/proc") if name.isdigit()]
    except OSError:
        return None
    complete = len(pids) <= SCAN_PROCESSES
    for pid in sorted(pids, reverse=True)[:SCAN_PROCESSES]:  # the newest first: helpers start after the job
        if pid == exclude:
            continue
        if time.monotonic() > deadline:
            complete = False
            break
        try:
            fds = os.listdir(f"/proc/{pid}/fd")
        except OSError:
            continue  # gone, or not ours to read
        for fd in fds:
            try:
                if os.readlink(f"/proc/{pid}/fd/{fd}") != link:
                    continue
            except OSError:
                continue
            if not writing or _open_for_writing(pid, fd):
                found.append(pid)
                break
    return found if found or complete else None


def _open_for_writing(pid: int, fd: str) -> bool:
    for line in (procfs.read_text(f"/proc/{pid}/fdinfo/{fd}") or "").splitlines():
        if line.startswith("flags:"):
            try:
                return int(line.split()[1], 8) & O_ACCMODE in (O_WRONLY, O_RDWR)
            except (IndexError, ValueError):
                return True
    return True  # unreadable flags: it holds the file, which is what matters


def listens_on(pid: int, port: int) -> bool:
    """Whether ``pid`` holds a TCP socket listening on ``port`` (any address)."""
    inodes = set()
    for proto in ("tcp", "tcp6"):
        for line in (procfs.read_text(f"/proc/{pid}/net/{proto}") or "").splitlines()[1:]:
            parts = line.split()
            if len(parts) >= 10 and parts[3] == "0A" and parts[1].rsplit(":", 1)[-1] == f"{port:04X}":
                inodes.add(f"socket:[{parts[9]}]")
    if not inodes:
        return False
    try:
        fds = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return False
    for fd in fds:
        try:
            if os.readlink(f"/proc/{pid}/fd/{fd}") in inodes:
                return True
        except OSError:
            continue
    return False


def tcp_peer_inode(local: str, remote: str, pid: int | None = None) -> str | None:
    """The socket inode of a local TCP connection's other end: the entry whose local address is
    ``remote`` and whose remote address is ``local`` (addresses as ``procfacts`` writes them), in
    the network namespace of ``pid`` (default: ours)."""
    from .procfacts import _addr

    net = f"/proc/{pid}/net" if pid is not None else "/proc/net"
    for proto in ("tcp", "tcp6"):
        for line in (procfs.read_text(f"{net}/{proto}") or "").splitlines()[1:]:
            parts = line.split()
            if len(parts) >= 10 and _addr(parts[1]) == remote and _addr(parts[2]) == local:
                return parts[9]
    return None
