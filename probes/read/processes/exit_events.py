"""The kernel's record of every process exit, with its wait status, from the proc connector.

A launcher reaps a dead rank within its monitor interval (torchrun: 0.1 s): after that no zombie,
no exit status is left in /proc. The kernel still announces each exit on the netlink process
connector (``NETLINK_CONNECTOR``, ``CN_IDX_PROC``; ``linux/cn_proc.h``): ``PROC_EVENT_EXIT`` with
the PID and the wait status, whoever reaps it. Listening needs ``CAP_NET_ADMIN`` (root): without
it :attr:`ExitEvents.unavailable` says why, and the other witnesses (the launcher's log, the
kernel log, the cgroup's OOM count) are asked instead.

One listener thread per process (:func:`shared`); it keeps the last :data:`KEEP` exits.
"""

from __future__ import annotations

import os
import select
import socket
import struct
import threading
import time
from collections import OrderedDict

NETLINK_CONNECTOR = 11
CN_IDX_PROC = CN_VAL_PROC = 1
PROC_CN_MCAST_LISTEN = 1
NLMSG_DONE = 3
PROC_EVENT_EXIT = 0x80000000
_HEADERS = 16 + 20  # nlmsghdr + cn_msg
KEEP = 4096  # exits remembered (a week-long watch sees many short-lived processes)


class ExitEvents:
    """Listens in a daemon thread; :meth:`status` answers from what it heard."""

    def __init__(self) -> None:
        self.unavailable: str | None = None
        self._exits: OrderedDict[int, tuple[int, float]] = OrderedDict()  # pid -> (wait status, unix time)
        self._lock = threading.Lock()
        self._heard = threading.Condition(self._lock)
        try:
            self._sock = socket.socket(socket.AF_NETLINK, socket.SOCK_DGRAM, NETLINK_CONNECTOR)
            self._sock.bind((0, CN_IDX_PROC))
            op = struct.pack("=I", PROC_CN_MCAST_LISTEN)
            cn = struct.pack("=IIIIHH", CN_IDX_PROC, CN_VAL_PROC, 0, 0, len(op), 0) + op
            self._sock.send(struct.pack("=IHHII", 16 + len(cn), NLMSG_DONE, 0, 0, os.getpid()) + cn)
        except (OSError, AttributeError) as exc:  # no netlink here, or no CAP_NET_ADMIN
            self.unavailable = (f"the kernel's exit events are not readable ({getattr(exc, 'strerror', None) or exc}; "
                                "they need root or CAP_NET_ADMIN)")
            return
        threading.Thread(target=self._listen, name="tw-exit-events", daemon=True).start()

    def status(self, pid: int, wait: float = 0.0) -> tuple[int, float] | None:
        """(wait status, when) of ``pid``'s exit, waiting up to ``wait`` s for it to be heard."""
        deadline = time.monotonic() + wait
        with self._heard:
            while pid not in self._exits and self.unavailable is None:
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                self._heard.wait(left)
            return self._exits.get(pid)

    def wait_any(self, pids: set[int], timeout: float) -> int | None:
        """Block until one of ``pids`` exits (returns it) or ``timeout`` s pass (None): a watcher
        wakes at the death itself, not at its next look."""
        deadline = time.monotonic() + timeout
        with self._heard:
            while self.unavailable is None:
                found = next((pid for pid in pids if pid in self._exits), None)
                left = deadline - time.monotonic()
                if found is not None or left <= 0:
                    return found
                self._heard.wait(left)
        return None

    def _listen(self) -> None:
        while True:
            try:
                ready, _, _ = select.select([self._sock], [], [], 5.0)
                if not ready:
                    continue
                data = self._sock.recv(65536)
            except OSError as exc:  # ENOBUFS: the kernel dropped events while we were slow; keep listening
                if getattr(exc, "errno", None) == 105:
                    continue
                self.unavailable = f"the kernel's exit events stopped ({exc.strerror or exc})"
                return
            self._read(data)

    def _read(self, data: bytes) -> None:
        offset = 0
        while offset + _HEADERS + 16 <= len(data):
            length = struct.unpack_from("=I", data, offset)[0]
            what = struct.unpack_from("=I", data, offset + _HEADERS)[0]
            if what == PROC_EVENT_EXIT and offset + _HEADERS + 32 <= len(data):
                pid, tgid, status, _ = struct.unpack_from("=IIII", data, offset + _HEADERS + 16)
                if pid == tgid:  # the process itself, not one of its threads
                    with self._heard:
                        self._exits[pid] = (status, time.time())
                        self._exits.move_to_end(pid)
                        while len(self._exits) > KEEP:
                            self._exits.popitem(last=False)
                        self._heard.notify_all()
            if length <= 0:
                break
            offset += (length + 3) & ~3


_shared: ExitEvents | None = None
_shared_lock = threading.Lock()


def shared() -> ExitEvents | None:
    """The process's one listener, started on first use; None when ``TRAINWATCH_EXIT_EVENTS=0``
    (as a user without root would see it)."""
    global _shared
    if os.environ.get("TRAINWATCH_EXIT_EVENTS", "1") == "0":
        return None
    with _shared_lock:
        if _shared is None:
            _shared = ExitEvents()
        return _shared
