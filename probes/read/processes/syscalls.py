"""Syscall numbers worth naming, for the two architectures trainwatch meets (``/proc/.../syscall``
prints the number)."""

from __future__ import annotations

import os
from collections.abc import Callable

# Syscalls worth naming, by number, for the two architectures trainwatch meets.
_X86_64 = {0: "read", 1: "write", 2: "open", 3: "close", 4: "stat", 5: "fstat", 6: "lstat", 7: "poll", 8: "lseek",
           17: "pread64", 18: "pwrite64", 19: "readv", 20: "writev", 21: "access", 23: "select", 35: "nanosleep",
           42: "connect", 43: "accept", 44: "sendto", 45: "recvfrom", 46: "sendmsg", 47: "recvmsg", 61: "wait4",
           72: "fcntl", 73: "flock", 74: "fsync", 75: "fdatasync", 76: "truncate", 77: "ftruncate", 78: "getdents",
           82: "rename", 83: "mkdir", 84: "rmdir", 85: "creat", 86: "link", 87: "unlink", 89: "readlink",
           90: "chmod", 137: "statfs", 138: "fstatfs", 162: "sync", 202: "futex", 217: "getdents64",
           230: "clock_nanosleep", 232: "epoll_wait", 247: "waitid", 257: "openat", 258: "mkdirat", 262: "newfstatat",
           263: "unlinkat", 264: "renameat", 270: "pselect6", 271: "ppoll", 277: "sync_file_range",
           281: "epoll_pwait", 288: "accept4", 316: "renameat2", 332: "statx", 426: "io_uring_enter",
           437: "openat2", 441: "epoll_pwait2"}
_AARCH64 = {22: "epoll_pwait", 95: "waitid", 25: "fcntl", 32: "flock", 34: "mkdirat", 35: "unlinkat", 38: "renameat",
            43: "statfs", 44: "fstatfs", 45: "truncate", 46: "ftruncate", 56: "openat", 57: "close",
            61: "getdents64", 62: "lseek", 63: "read", 64: "write", 65: "readv", 66: "writev", 67: "pread64",
            68: "pwrite64", 72: "pselect6", 73: "ppoll", 79: "newfstatat", 80: "fstat", 81: "sync", 82: "fsync",
            83: "fdatasync", 98: "futex", 101: "nanosleep", 115: "clock_nanosleep", 202: "accept", 203: "connect",
            206: "sendto", 207: "recvfrom", 211: "sendmsg", 212: "recvmsg", 242: "accept4", 260: "wait4",
            276: "renameat2", 291: "statx", 426: "io_uring_enter", 437: "openat2", 441: "epoll_pwait2"}
SYSCALLS = _AARCH64 if os.uname().machine in ("aarch64", "arm64") else _X86_64
RESTART_SYSCALL = 128 if SYSCALLS is _AARCH64 else 219

# A timed wait interrupted by a ptrace stop (any py-spy dump: ours, another viewer's) goes on as
# restart_syscall, which /proc/.../syscall shows for the rest of the wait: a hung rank's timed
# futex or poll reads so forever after the first dump. Where the kernel holds the thread (wchan)
# says which wait it is. (wchan part, the call it belongs to), first match wins.
RESTARTED_BY_WCHAN = (("futex", "futex"), ("nanosleep", "nanosleep"), ("poll_schedule", "poll"),
                      ("do_sys_poll", "poll"), ("ep_poll", "epoll_wait"), ("select", "select"))


def syscall_name(text: str | None, wchan: Callable[[], str | None] | None = None) -> str | None:
    """The syscall a ``/proc/.../syscall`` reading shows the thread in; None: running, or none.
    ``wchan`` (read only when needed) names a restarted wait by what it is."""
    first = (text or "").split(maxsplit=1)[:1]
    if not first or not first[0].isdigit():
        return None
    number = int(first[0])
    if number == RESTART_SYSCALL:
        return restarted_call(wchan() if wchan else None)
    return SYSCALLS.get(number, f"syscall {number}")


def restarted_call(wchan: str | None) -> str:
    """The wait a thread in restart_syscall goes on with, by its ``wchan``; else restart_syscall."""
    for part, name in RESTARTED_BY_WCHAN:
        if wchan and part in wchan:
            return name
    return "restart_syscall"
