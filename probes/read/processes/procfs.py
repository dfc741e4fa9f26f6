"""Cheap reads of /proc: thread counters, process state, zombie exit status, signal masks."""

from __future__ import annotations

import os
import time
from ...observed import ThreadCounters
from ...rundir import signal_name
from .namespaces import path_here
from .syscalls import syscall_name

NS_PER_TICK = 1_000_000_000 // os.sysconf("SC_CLK_TCK")


def read_all(path: str) -> bytes:
    """A whole file, read with the OS's own calls: a sampling round reads hundreds of small /proc
    files, and a Python file object costs more than the read (a third of the time). Raises OSError."""
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        chunks = []
        while chunk := os.read(fd, 65536):  # /proc hands some files over in pieces
            chunks.append(chunk)
        return b"".join(chunks)
    finally:
        os.close(fd)


def read_bytes(path: str) -> bytes | None:
    """:func:`read_all`, or None when unreadable (gone, denied)."""
    try:
        return read_all(path)
    except OSError:
        return None


def read_text(path: str) -> str | None:
    data = read_bytes(path)
    return None if data is None else data.decode("utf-8", "replace")


def read_maps(pid: int) -> bytes | None:
    """``pid``'s memory map, as bytes (a rank's is hundreds of KiB: decoding it costs more than
    reading it, and its readers look for a few names); None when unreadable."""
    return read_bytes(f"/proc/{pid}/maps")


def maps_mention(pid: int, *names: bytes) -> bool:
    """Whether ``pid``'s memory map names any of ``names`` (a loaded library)."""
    maps = read_maps(pid) or b""
    return any(name in maps for name in names)


def parse_environ(raw: bytes) -> dict[str, str]:
    """``/proc/PID/environ``'s NUL-separated ``KEY=value`` entries (decoded once, not per entry)."""
    env: dict[str, str] = {}
    for item in raw.decode(errors="replace").split("\0"):
        key, eq, value = item.partition("=")
        if eq and key:
            env[key] = value
    return env


def thread_counters(pid: int, tid: int | None = None) -> ThreadCounters | None:
    """Counters of thread ``tid`` (default: the main thread) of ``pid``; None if gone. Its
    times on and waiting for a CPU come from ``schedstat`` where the kernel keeps them; the
    syscall it is in from ``syscall`` (unreadable without ptrace access: then None); the wake-ups
    of a few of the process's quietest other threads, read with it (:func:`witness_threads`)."""
    base = f"/proc/{pid}/task/{tid or pid}"
    at_ns = time.monotonic_ns()
    stat, status = read_text(f"{base}/stat"), read_text(f"{base}/status")
    if stat is None or status is None:
        return None
    fields = stat.rsplit(")", 1)[1].split()
    ticks = int(fields[11]) + int(fields[12])
    run_ns, queued_ns = _schedstat(base)
    return ThreadCounters(
        cpu_ticks=ticks,
        voluntary=_switches(status, "voluntary_ctxt_switches") or 0,
        involuntary=_switches(status, "nonvoluntary_ctxt_switches") or 0,
        at_ns=at_ns,
        run_ns=ticks * NS_PER_TICK if run_ns is None else run_ns,
        queued_ns=queued_ns,
        syscall=syscall_name(read_text(f"{base}/syscall"), lambda: read_text(f"{base}/wchan")),
        others=_witness_wakeups(pid, tid or pid),
    )


def _switches(status: str, name: str) -> int | None:
    """One ``*_ctxt_switches`` count of a ``status`` file's text; None when absent."""
    start = status.find(f"\n{name}:\t")
    if start < 0:
        return None
    start += len(name) + 3
    end = status.find("\n", start)
    value = status[start:end if end >= 0 else None].strip()
    return int(value) if value.isdigit() else None


# -- witnesses of a pause of the whole process --------------------------------------------------
# A ptrace attach (py-spy, gdb, another trainwatch, a profiler) or a stop signal halts every thread
# of a process and wakes each one that was blocked: every thread's voluntary switches grow by about
# two per pause. An answered wait wakes only its waiter. So a few threads that rarely wake by
# themselves, read with the main thread, tell how many of its wake-ups a pause from outside
# explains (judge/progress.py). They are chosen once per process (re-chosen when one ends) among
# its first MAX_CANDIDATES threads, by fewest wake-ups in their lifetime.
WITNESSES = 3
MAX_CANDIDATES = 64
RECHOOSE_S = 10.0  # a process with fewer witnesses than wanted (young: torch starts threads later) looks again
_witnesses: dict[int, tuple[tuple[int, ...], float]] = {}  # pid -> (witnesses, when chosen)
_WITNESS_PROCESSES = 4096  # a week-long watch of restarting jobs must not grow this forever


def witness_threads(pid: int, main: int) -> tuple[int, ...]:
    """The thread IDs of ``pid`` that witness pauses of the whole process (see above); () when the
    process has no thread but ``main`` (or the one that trains)."""
    known = _witnesses.get(pid)
    now = time.monotonic()
    if known is not None and main not in known[0] and (len(known[0]) >= WITNESSES or now - known[1] < RECHOOSE_S):
        return known[0]
    try:
        tids = [int(t) for t in os.listdir(f"/proc/{pid}/task")[:MAX_CANDIDATES] if int(t) not in (pid, main)]
    except OSError:
        return ()
    counted = []
    for tid in tids:
        status = read_text(f"/proc/{pid}/task/{tid}/status")
        woke = _switches(status, "voluntary_ctxt_switches") if status else None
        if woke is not None:
            counted.append((woke, tid))
    chosen = tuple(tid for _, tid in sorted(counted)[:WITNESSES])
    if len(_witnesses) >= _WITNESS_PROCESSES:
        _witnesses.clear()
    _witnesses[pid] = (chosen, now)
    return chosen


def _witness_wakeups(pid: int, main: int) -> tuple[tuple[int, int], ...]:
    """(thread ID, voluntary switches) of ``pid``'s witness threads, read now; a witness that ended
    makes the next reading choose again."""
    read = []
    for tid in witness_threads(pid, main):
        status = read_text(f"/proc/{pid}/task/{tid}/status")
        woke = _switches(status, "voluntary_ctxt_switches") if status else None
        if woke is None:
            _witnesses.pop(pid, None)
            continue
        read.append((tid, woke))
    return tuple(read)


def _schedstat(base: str) -> tuple[int | None, int | None]:
    """(ns on a CPU, ns runnable but waiting for one) from ``base/schedstat``; (None, None) where
    the kernel was built without it (CONFIG_SCHED_INFO) or the thread is gone."""
    text = read_text(f"{base}/schedstat")
    parts = text.split() if text else []
    if len(parts) < 2 or not (parts[0].isdigit() and parts[1].isdigit()):
        return None, None
    return int(parts[0]), int(parts[1])


def status_field(pid: int, name: str) -> str | None:
    """One field of /proc/PID/status (``TracerPid``), stripped; None when the process is gone or
    has no such field. Cheaper than :func:`status_fields` for the one field read per rank per poll."""
    text = read_text(f"/proc/{pid}/status")
    if text is None:
        return None
    text = "\n" + text  # every field, the first too, follows a line break
    start = text.find(f"\n{name}:\t")
    if start < 0:
        return None
    start += len(name) + 3
    end = text.find("\n", start)
    return text[start:end if end >= 0 else None].strip()


def status_fields(pid: int) -> dict[str, str]:
    text = read_text(f"/proc/{pid}/status") or ""
    return dict(line.split(":\t", 1) for line in text.splitlines() if ":\t" in line)


def state_letter(pid: int) -> str | None:
    """R, S, D, T, t, Z, ... or None when the process is gone."""
    stat = read_text(f"/proc/{pid}/stat")
    return stat.rsplit(")", 1)[1].split()[0] if stat else None


def zombie_exit(pid: int) -> tuple[int | None, str | None] | None:
    """(exit code, signal name) of a zombie not yet reaped by its parent, else None."""
    stat = read_text(f"/proc/{pid}/stat")
    if not stat:
        return None
    fields = stat.rsplit(")", 1)[1].split()
    if fields[0] != "Z" or len(fields) < 50:
        return None
    return decode_wait_status(int(fields[-1]))


def decode_wait_status(status: int) -> tuple[int | None, str | None]:
    if os.WIFSIGNALED(status):
        return None, signal_name(os.WTERMSIG(status))
    return os.WEXITSTATUS(status), None


def caught_signals(pid: int) -> set[int]:
    """Signals the process has a handler for (SigCgt of /proc/PID/status)."""
    mask = int(status_fields(pid).get("SigCgt", "0").strip() or "0", 16)
    return {n for n in range(1, 65) if mask & (1 << (n - 1))}


def fd_target(pid: int, fd: int) -> str | None:
    try:
        return os.readlink(f"/proc/{pid}/fd/{fd}")
    except OSError:
        return None


def log_file_of(pid: int) -> str | None:
    """A regular file behind stdout or stderr, if any (torchrun --log-dir, `> log 2>&1`), as a
    path openable from here (a container's file through /proc/PID/root)."""
    for fd in (1, 2):
        target = fd_target(pid, fd)
        if target and target.startswith("/") and not target.startswith("/dev/"):
            here = path_here(pid, target)
            if os.path.isfile(here):
                return here
    return None


def descendant_pids(pid: int) -> frozenset[int] | None:
    """Every descendant of ``pid`` from /proc/*/task/*/children (a few small reads, no full scan);
    None when the kernel does not provide those files."""
    found: set[int] = set()
    stack = [pid]
    while stack:
        current = stack.pop()
        try:
            tasks = os.listdir(f"/proc/{current}/task")
        except OSError:
            continue  # exited meanwhile: it has no children left to list
        for tid in tasks:
            text = read_text(f"/proc/{current}/task/{tid}/children")
            if text is None:
                if current == pid:
                    return None
                continue
            for child in map(int, text.split()):
                if child not in found:
                    found.add(child)
                    stack.append(child)
    return frozenset(found)


def pids() -> list[int]:
    """Every process ID in /proc now."""
    try:
        return [int(name) for name in os.listdir("/proc") if name.isdigit()]
    except OSError:
        return []


def parent_map() -> dict[int, list[int]]:
    """parent PID -> child PIDs, from one read of each /proc/PID/stat (psutil's process_iter builds
    an object per process and reads each stat twice: three times slower on a busy node)."""
    tree: dict[int, list[int]] = {}
    with os.scandir("/proc") as entries:
        for entry in entries:
            if not entry.name.isdigit():
                continue
            stat = read_bytes(f"/proc/{entry.name}/stat")
            if stat is None:
                continue  # exited while listed: it is nobody's child any more
            # "pid (comm) state ppid ...": comm may hold spaces and parentheses, so cut at the last ")"
            fields = stat[stat.rfind(b")") + 2:].split(b" ", 2)
            if len(fields) > 1 and fields[1].isdigit():
                tree.setdefault(int(fields[1]), []).append(int(entry.name))
    return tree


def descendants(tree: dict[int, list[int]], pid: int) -> tuple[int, ...]:
    """Every descendant of ``pid`` in ``tree`` (:func:`parent_map`), sorted."""
    out, stack = [], list(tree.get(pid, ()))
    while stack:
        child = stack.pop()
        out.append(child)
        stack.extend(tree.get(child, ()))
    return tuple(sorted(out))


def wchan(pid: int, tid: int | None = None) -> str | None:
    text = read_text(f"/proc/{pid}/task/{tid or pid}/wchan")
    return text.strip() if text and text.strip() not in ("", "0") else None
