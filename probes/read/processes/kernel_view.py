"""The kernel's view of a rank, from /proc alone: what its main thread is blocked in, on what.

When py-spy cannot read a rank (a pause would hurt, ptrace is denied, the rank is stopped or
traced), and even when it can, the kernel says what the thread waits for: its state (R, S, D, T,
t, Z), ``wchan``, the syscall it is in (``/proc/PID/syscall``, decoded for the calls that matter:
the file behind an fd or a path argument, with the mount and filesystem type it lives on; the
peer of a socket), who traces it (``TracerPid``), its I/O counters (``/proc/PID/io``) and, where
readable (root), its kernel stack. Cheap: a few small reads a rank a poll; a path argument is read
from ``/proc/PID/mem`` (the same access ``py-spy --nonblocking`` needs), never by stopping it.
"""

from __future__ import annotations

import os
import stat as stat_mode
import struct
import time
from dataclasses import dataclass, replace

from ...snapshot import FILE_SYSCALLS, KernelState, PeerProcess
from . import peers as peer_reader
from . import procfs
from .proc import Proc, ProcessError
from .syscalls import RESTART_SYSCALL, SYSCALLS, restarted_call

# Which argument names the file: a path (index) or an fd (index); *at calls take (dirfd, path).
PATH_ARG = {"open": 0, "stat": 0, "lstat": 0, "access": 0, "truncate": 0, "mkdir": 0, "rmdir": 0, "creat": 0,
            "unlink": 0, "readlink": 0, "chmod": 0, "statfs": 0, "rename": 0, "link": 0,
            "openat": 1, "mkdirat": 1, "newfstatat": 1, "unlinkat": 1, "renameat": 1, "statx": 1, "openat2": 1,
            "renameat2": 1}
FD_ARG = {name: 0 for name in ("read", "write", "close", "fstat", "lseek", "pread64", "pwrite64", "readv", "writev",
                               "fsync", "fdatasync", "ftruncate", "getdents", "getdents64", "flock", "fcntl",
                               "fstatfs", "sync_file_range", "sendto", "recvfrom", "sendmsg", "recvmsg", "connect",
                               "accept", "accept4")}
FILE_CALLS = FILE_SYSCALLS
AT_FDCWD = (1 << 64) - 100  # -100 as the kernel prints it: an unsigned 64-bit hex
STACK_FRAMES = 8
POLL_CALLS = frozenset({"poll", "ppoll"})  # (struct pollfd *fds, nfds, ...): the fds are read from memory
POLL_FDS = 16  # pollfds looked at
WAIT_CALLS = frozenset({"wait4", "waitid"})
P_ALL, P_PID, P_PIDFD = 0, 1, 3  # waitid's idtype
READ_CALLS = frozenset({"read", "readv", "pread64", "recvfrom", "recvmsg", "open", "openat", "openat2", "poll",
                        "ppoll", "accept", "accept4"})
CHILDREN_SHOWN = 3
# Two CPUs whose stolen time differs by no more than this keep task clocks close enough to read
# one's age on the other (a stuck time is shown to the second).
CLOCKS_AGREE_MS = 100.0


@dataclass(frozen=True)
class _Call:
    """What ``/proc/PID/syscall`` says the thread is blocked in, decoded."""

    name: str | None = None
    target: str | None = None
    fs_type: str | None = None
    kind: str | None = None  # file, fifo, pipe, socket, child
    peers: tuple[PeerProcess, ...] = ()
    peers_known: bool = False


def kernel_state(pid: int, tid: int | None = None) -> KernelState | None:
    """The kernel's view of ``pid``'s thread ``tid`` (default: the main thread); None when gone."""
    tid = tid or pid
    base = f"/proc/{pid}/task/{tid}"
    for _ in range(5):  # a py-spy attach (another viewer's) holds a rank for milliseconds: look past it
        stat = procfs.read_text(f"{base}/stat")
        tracer_pid = procfs.status_field(pid, "TracerPid") or "0"
        state = stat.rsplit(")", 1)[1].split()[0] if stat else None
        tracing = tracer_pid.isdigit() and tracer_pid != "0"
        comm = (procfs.read_text(f"/proc/{tracer_pid}/comm") or "").strip() if tracing else None
        # Reads of one moment only: a tracing stop (t) whose tracer had gone by the next read, or a
        # tracer gone before its name was read, is a stop that just ended (seen: a healthy rank called
        # "stopped by a tracer" as another shell's py-spy dump detached).
        ended = (state == "t" and not tracing) or (tracing and not comm)
        if not (ended or comm == "py-spy"):
            break
        time.sleep(0.05)
    if not stat:
        return None
    wchan = procfs.wchan(pid, tid)
    call = _syscall(pid, base, wchan)
    tracer = f"{comm or '?'} (PID {tracer_pid})" if tracing else None
    io = _io(pid)
    return KernelState(letter=state, wchan=wchan if wchan not in (None, "0") else None, syscall=call.name,
                       target=call.target, fs_type=call.fs_type, tracer=tracer, read_bytes=io.get("read_bytes"),
                       write_bytes=io.get("write_bytes"), rchar=io.get("rchar"), wchar=io.get("wchar"),
                       kernel_stack=_stack(base), target_kind=call.kind, peers=call.peers,
                       peers_known=call.peers_known,
                       asleep_since=asleep_since(base, stat) if state in ("S", "D") else None,
                       tracer_since=_started(int(tracer_pid)) if tracer else None)


def asleep_since(base: str, stat: str | None = None) -> float | None:
    """Unix time the thread at ``base`` (``/proc/PID/task/TID``) last got a CPU, for a thread read
    asleep: it has slept since (in one wait or several, without running in between). From the
    scheduler's ``se.exec_start``, which runs on the task clock of the CPU the thread last ran on.
    Each CPU's task clock leaves out its own stolen time (in a VM): two CPUs' clocks drift apart,
    4.8 s after 7 hours of a loaded 2-core VM here, so ours is read on the thread's CPU
    (:func:`_own_exec_start_ms`) and only time stolen during the sleep is left out: a figure a
    little short, never long. None where that clock cannot be read (another cpuset, the clocks
    apart). ``stat``: the thread's ``stat`` if just read. None where the kernel
    has no such file."""
    cpu = _last_cpu(stat or procfs.read_text(f"{base}/stat") or "")
    theirs = _exec_start_ms(f"{base}/sched")
    ours = _own_exec_start_ms(cpu) if theirs is not None else None
    if theirs is None or ours is None:
        return None
    return time.time() - max(0.0, ours - theirs) / 1000


def _last_cpu(stat: str) -> int | None:
    """The CPU a thread last ran on, from its ``stat`` (field 39)."""
    fields = stat.rsplit(")", 1)[-1].split()
    try:
        return int(fields[36])  # field 39, counted from field 3 (the state) after the name
    except (IndexError, ValueError):
        return None


def _own_exec_start_ms(cpu: int | None) -> float | None:
    """Our own thread's ``se.exec_start`` (we are running: it is now, give or take a tick), read
    on ``cpu``. Where we may not run there (another cpuset), our own CPU's clock stands in only
    while the two CPUs have had about the same time stolen (``/proc/stat``); else None: the two
    clocks differ by more than the stolen ticks tell (0.6 s off after 6 hours of a 2-core VM, in
    either direction), and an age we cannot vouch for is not given."""
    try:
        allowed = os.sched_getaffinity(0)
    except OSError:  # no affinity calls here (seccomp): read on whatever CPU we are on
        allowed = set()
    if cpu is None or cpu not in allowed:
        ours = _exec_start_ms("/proc/thread-self/sched")
        if ours is None or cpu is None:
            return ours
        here = _last_cpu(procfs.read_text("/proc/thread-self/stat") or "")
        if here == cpu:
            return ours
        stolen = _stolen_ms()
        if here is None or cpu not in stolen or here not in stolen:
            return None
        return ours if abs(stolen[cpu] - stolen[here]) <= CLOCKS_AGREE_MS else None
    if allowed == {cpu}:
        return _exec_start_ms("/proc/thread-self/sched")
    try:
        os.sched_setaffinity(0, {cpu})  # this thread only; it runs on that CPU when the call returns
    except OSError:  # the CPU went offline, or the cpuset changed since
        return None
    try:
        return _exec_start_ms("/proc/thread-self/sched")
    finally:
        try:
            os.sched_setaffinity(0, allowed)
        except OSError:  # the cpuset shrank meanwhile: the kernel keeps us where it allows
            pass


def _stolen_ms() -> dict[int, float]:
    """Milliseconds each CPU has had stolen (``/proc/stat``: the 8th figure, in 10 ms ticks)."""
    out = {}
    for line in (procfs.read_text("/proc/stat") or "").splitlines():
        name, *values = line.split()
        if name.startswith("cpu") and name[3:].isdigit() and len(values) >= 8:
            out[int(name[3:])] = int(values[7]) * 1000 / os.sysconf("SC_CLK_TCK")
    return out


def _exec_start_ms(path: str) -> float | None:
    text = procfs.read_text(path) or ""
    start = text.find("se.exec_start")
    if start < 0:
        return None
    end = text.find("\n", start)
    try:
        return float(text[start:end if end >= 0 else None].split(":", 1)[1])
    except (IndexError, ValueError):
        return None


def _started(pid: int) -> float | None:
    """Unix time process ``pid`` started; None when gone."""
    try:
        return Proc(pid).create_time()
    except ProcessError:
        return None


def with_peers(pid: int, kernel: KernelState) -> KernelState:
    """``kernel`` with who holds the other end of its pipe, FIFO or TCP connection (a scan of other
    processes' descriptors: read only for a rank the judge asks about, see ``Judgement.read_peers``);
    for a call on nothing the kernel names (asked for a rank waiting in ``subprocess`` in a loop of
    sleeps), the rank's children."""
    if kernel.peers_known:
        return kernel
    if kernel.target_kind is None:  # asked for a rank waiting in subprocess in a sleep loop: its children
        now = time.time()
        found = tuple(p for p in (peer_reader.process(c, now) for c in peer_reader.children(pid)[:CHILDREN_SHOWN])
                      if p is not None)
        return replace(kernel, target_kind="child", target=kernel.target or "any child", peers=found, peers_known=True)
    if kernel.target_kind not in ("pipe", "fifo", "socket") or not kernel.target:
        return kernel
    link = _peer_link(kernel, pid)
    if link is None:
        return replace(kernel, peers_known=kernel.target_kind == "socket" and "LISTEN" in kernel.target)
    found = peer_reader.holders(link, exclude=pid, writing=kernel.target_kind in ("pipe", "fifo")
                                and kernel.syscall in READ_CALLS)
    if found is None:  # the scan was cut short: not known, rather than "nobody"
        return kernel
    now = time.time()
    shown = tuple(p for p in (peer_reader.process(pid_, now) for pid_ in found[:CHILDREN_SHOWN]) if p is not None)
    return replace(kernel, peers=shown, peers_known=True)


def _peer_link(kernel: KernelState, pid: int) -> str | None:
    """What another process's descriptor on the same thing reads as: ``pipe:[N]``, a FIFO's path, or
    the other end's ``socket:[N]`` (a local TCP connection's; None for anything else)."""
    target = kernel.target or ""
    if kernel.target_kind == "pipe":
        return target.split()[0]
    if kernel.target_kind == "fifo":
        return target.rsplit(" (", 1)[0]
    words = target.split()  # "tcp 127.0.0.1:5555 -> 127.0.0.1:41234 ESTABLISHED"
    if len(words) >= 4 and words[0] in ("tcp", "tcp6") and words[2] == "->" and "LISTEN" not in words:
        inode = peer_reader.tcp_peer_inode(words[1], words[3], pid)
        return f"socket:[{inode}]" if inode else None
    return None


def _syscall(pid: int, base: str, wchan: str | None) -> _Call:
    """The syscall name, what it is on (a file, FIFO, pipe, socket or child) and the filesystem type,
    from ``/proc/PID/task/TID/syscall``; a restarted wait named by ``wchan``, without its arguments
    (they are restart_syscall's)."""
    text = (procfs.read_text(f"{base}/syscall") or "").split()
    if not text or text[0] in ("running", "-1"):
        return _Call()
    try:
        number, args = int(text[0]), [int(a, 16) for a in text[1:7]]
    except ValueError:
        return _Call()
    if number == RESTART_SYSCALL:
        return _Call(restarted_call(wchan))
    name = SYSCALLS.get(number, f"syscall {number}")
    if name in WAIT_CALLS:
        return _child_wait(pid, name, args)
    path = None
    if name in POLL_CALLS and len(args) > 1:
        path = _polled(pid, args[0], args[1])
    elif name in PATH_ARG and len(args) > PATH_ARG[name]:
        path = _string_at(pid, args[PATH_ARG[name]])
        if path and not path.startswith("/"):
            index = PATH_ARG[name]
            directory = _fd_path(pid, args[0]) if index == 1 and args[0] != AT_FDCWD else _link(f"/proc/{pid}/cwd")
            path = os.path.normpath(os.path.join(directory, path)) if directory else path
    elif name in FD_ARG and args:
        path = _fd_path(pid, args[0])
    if path is None:
        return _Call(name)
    if path.startswith("socket:["):
        return _Call(name, _socket(path, pid), kind="socket")
    if path.startswith("pipe:["):
        return _Call(name, path, kind="pipe")
    if not path.startswith("/"):  # anon_inode:[eventfd] and the like
        return _Call(name, path)
    mount, fs_type = _mount_of(pid, path)
    return _Call(name, f"{path} ({fs_type} on {mount})" if mount else path, fs_type,
                 kind="fifo" if _is_fifo(pid, path, fs_type) else "file")


# Filesystems whose stat never waits on a daemon or the network: a FIFO is told apart only there. A
# stat on a hung FUSE or NFS mount would block trainwatch as it blocks the rank.
LOCAL_FILESYSTEMS = frozenset({"ext2", "ext3", "ext4", "xfs", "btrfs", "tmpfs", "ramfs", "overlay", "devtmpfs", "zfs",
                               "f2fs", "bcachefs"})


def _is_fifo(pid: int, path: str, fs_type: str | None) -> bool:
    """Whether ``path`` (as the rank sees it: through its root) is a named pipe, on a local filesystem."""
    if fs_type not in LOCAL_FILESYSTEMS:
        return False
    try:
        return stat_mode.S_ISFIFO(os.stat(f"/proc/{pid}/root{path}").st_mode)
    except OSError:
        return False


def _signed(value: int) -> int:
    return value - (1 << 64) if value >= 1 << 63 else value


def _child_wait(pid: int, name: str, args: list[int]) -> _Call:
    """``wait4(pid, …)`` or ``waitid(P_PID, pid, …)``: the child waited for; -1 or P_ALL: any child."""
    child = None
    if name == "wait4" and args:
        child = _signed(args[0])
    elif name == "waitid" and len(args) > 1:
        idtype, ident = args[0], _signed(args[1])
        child = ident if idtype == P_PID else -1 if idtype == P_ALL else None
        if idtype == P_PIDFD:
            child = _pidfd_pid(pid, ident)
    if child is None or child == 0 or child < -1:
        return _Call(name, kind="child")  # a process group: not looked into
    pids = [child] if child > 0 else peer_reader.children(pid)[:CHILDREN_SHOWN]
    now = time.time()
    found = tuple(p for p in (peer_reader.process(c, now) for c in pids) if p is not None)
    target = f"child PID {child}" if child > 0 else "any child"
    return _Call(name, target, kind="child", peers=found, peers_known=True)


def _pidfd_pid(pid: int, fd: int) -> int | None:
    for line in (procfs.read_text(f"/proc/{pid}/fdinfo/{fd}") or "").splitlines():
        if line.startswith("Pid:"):
            value = line.split()[1:2]
            return int(value[0]) if value and value[0].lstrip("-").isdigit() else None
    return None


def _polled(pid: int, address: int, count: int) -> str | None:
    """The first pipe, socket or file among the descriptors a ``poll`` waits on (its ``struct
    pollfd`` array, read from the process's memory)."""
    if not 0 < count <= 1024:
        return None
    try:
        with open(f"/proc/{pid}/mem", "rb", buffering=0) as mem:
            mem.seek(address)
            data = mem.read(8 * min(count, POLL_FDS))
    except (OSError, OverflowError, ValueError):
        return None
    links = [_fd_path(pid, fd) for fd, _events, _revents in struct.iter_unpack("ihh", data[: len(data) // 8 * 8])]
    for wanted in ("pipe:[", "socket:[", "/"):
        found = next((link for link in links if link and link.startswith(wanted)), None)
        if found:
            return found
    return None


def _string_at(pid: int, address: int, limit: int = 4096) -> str | None:
    """A NUL-terminated string from the process's memory, without stopping it."""
    if address <= 0:
        return None
    try:
        with open(f"/proc/{pid}/mem", "rb", buffering=0) as mem:
            mem.seek(address)
            data = mem.read(limit)
    except (OSError, OverflowError, ValueError):  # no access, or an address outside its mappings
        return None
    return data.split(b"\0", 1)[0].decode(errors="replace") or None


def _link(path: str) -> str | None:
    try:
        return os.readlink(path)
    except OSError:
        return None


def _fd_path(pid: int, fd: int) -> str | None:
    return _link(f"/proc/{pid}/fd/{fd}") if 0 <= fd < (1 << 31) else None


def _socket(link: str, pid: int) -> str:
    """``socket:[123]`` of ``pid`` -> ``tcp 127.0.0.1:29500 -> 127.0.0.1:41234 ESTABLISHED`` where known."""
    from .procfacts import socket_description
    return socket_description(link[len("socket:["):-1], pid) or link


def _mount_of(pid: int, path: str) -> tuple[str | None, str | None]:
    """(mount point, filesystem type) of the longest mount point ``path`` lies under."""
    best, fs_type = None, None
    for line in (procfs.read_text(f"/proc/{pid}/mountinfo") or "").splitlines():
        left, _, right = line.partition(" - ")
        fields = left.split()
        if len(fields) < 5 or not right:
            continue
        point = fields[4].replace("\\040", " ")
        if (path == point or path.startswith(point.rstrip("/") + "/")) and (best is None or len(point) > len(best)):
            best, fs_type = point, right.split()[0]
    return best, fs_type


def _io(pid: int) -> dict[str, int]:
    found = {}
    for line in (procfs.read_text(f"/proc/{pid}/io") or "").splitlines():
        key, _, value = line.partition(":")
        if value.strip().isdigit():
            found[key.strip()] = int(value)
    return found


def _stack(base: str) -> tuple[str, ...]:
    """The thread's kernel stack, innermost first (root only): ``request_wait_answer``, …"""
    frames = []
    for line in (procfs.read_text(f"{base}/stack") or "").splitlines()[:STACK_FRAMES]:
        name = line.split("]", 1)[-1].strip().split("+", 1)[0]
        if name:
            frames.append(name)
    return tuple(frames)
