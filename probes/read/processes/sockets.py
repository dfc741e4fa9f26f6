"""TCP sockets from /proc, and which process holds each: ``/proc/PID/net/tcp{,6}`` joined with the
``socket:[inode]`` links of processes' fds. Read only, no packet seen, nothing asked of anyone.

``/proc/PID/net/tcp`` lists every TCP socket of PID's network namespace (its node's, outside
containers), both ends of a loopback connection included; a process's fds name the inodes it
holds. A forked child (a DataLoader worker) holds copies of its parent's sockets: the owner kept
for an inode is the top-most of its holders (:func:`owners`).
"""

from __future__ import annotations

import errno
import os
from dataclasses import dataclass

from . import procfs
from ...record import Record

LISTEN, ESTABLISHED = "0A", "01"
MAX_FDS = 4096  # fds read of one process: a rank holds tens to hundreds; past this, its sockets go unread
_V4_MAPPED = "0000000000000000FFFF0000"


@dataclass(frozen=True, repr=False)
class TcpSocket(Record):
    """One row of /proc/net/tcp{,6}: addresses as (ip, port), IPv4-mapped IPv6 shown as IPv4."""

    inode: int
    local: tuple[str, int]
    remote: tuple[str, int]
    state: str  # the kernel's hex state: 0A listening, 01 established

    @property
    def listening(self) -> bool:
        return self.state == LISTEN

    @property
    def established(self) -> bool:
        return self.state == ESTABLISHED


def address(hexaddr: str) -> tuple[str, int]:
    """``0100007F:7530`` -> ("127.0.0.1", 30000); IPv6 in its full form, IPv4-mapped ones as IPv4."""
    host, _, port = hexaddr.partition(":")
    if host.startswith(_V4_MAPPED) and len(host) == 32:
        host = host[24:]
    if len(host) == 8:
        ip = ".".join(str(int(host[i:i + 2], 16)) for i in (6, 4, 2, 0))
    else:  # four little-endian 32-bit words
        words = [host[i:i + 8] for i in range(0, 32, 8)]
        raw = "".join(w[6:8] + w[4:6] + w[2:4] + w[0:2] for w in words)
        ip = ":".join(raw[i:i + 4].lstrip("0") or "0" for i in range(0, 32, 4))
        ip = "::" if ip == "0:0:0:0:0:0:0:0" else ip
    return ip, int(port, 16)


def tcp_table(pid: int) -> dict[int, TcpSocket]:
    """Every TCP socket of ``pid``'s network namespace, by inode (empty when unreadable)."""
    found: dict[int, TcpSocket] = {}
    for proto in ("tcp", "tcp6"):
        text = procfs.read_text(f"/proc/{pid}/net/{proto}") or ""
        for line in text.splitlines()[1:]:
            parts = line.split()
            if len(parts) < 10 or not parts[9].isdigit() or parts[9] == "0":
                continue  # inode 0: a socket already closed, in TIME_WAIT
            try:
                found[int(parts[9])] = TcpSocket(int(parts[9]), address(parts[1]), address(parts[2]), parts[3])
            except ValueError:
                continue  # a row cut mid-write: the rest still reads
    return found


def socket_inodes(pid: int, limit: int = MAX_FDS) -> list[int] | None:
    """The socket inodes ``pid`` holds (its first ``limit`` fds); None when its fds may not be read
    (another user's process: the caller notes it), [] when it is gone."""
    try:
        fds = os.listdir(f"/proc/{pid}/fd")
    except OSError as exc:
        return None if exc.errno in (errno.EACCES, errno.EPERM) else []
    found = []
    for fd in fds[:limit]:
        target = procfs.fd_target(pid, int(fd)) if fd.isdigit() else None
        if target and target.startswith("socket:["):
            found.append(int(target[8:-1]))
    return found


def net_namespace(pid: int) -> str | None:
    """``net:[4026531840]``: processes with the same one see the same sockets; None when unreadable."""
    try:
        return os.readlink(f"/proc/{pid}/ns/net")
    except OSError:
        return None


def owners(holders: dict[int, list[int]], parents: dict[int, int]) -> dict[int, int]:
    """inode -> the process that owns it, from ``holders`` (PID -> inodes it holds): of several
    holders (a fork copies its parent's fds), the one none of whose ancestors holds it too."""
    held_by: dict[int, list[int]] = {}
    for pid, inodes in holders.items():
        for inode in inodes:
            held_by.setdefault(inode, []).append(pid)
    out = {}
    for inode, pids in held_by.items():
        if len(pids) == 1:
            out[inode] = pids[0]
            continue
        among = set(pids)
        out[inode] = min(pids, key=lambda p: (_has_ancestor_in(p, among, parents), p))
    return out


def _has_ancestor_in(pid: int, among: set[int], parents: dict[int, int]) -> bool:
    seen = set()
    parent = parents.get(pid)
    while parent and parent not in seen:
        if parent in among:
            return True
        seen.add(parent)
        parent = parents.get(parent)
    return False
