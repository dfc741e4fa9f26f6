"""What a rank waits for, named by mechanism: the words after "rank 2 waits for …". Pure.

From the rank's phase and the kernel's view of its main thread (``KernelState``: the call it is
blocked in, what that call is on, who holds the other end), its threads and its DataLoader worker:

* a child process: ``its child process PID 812 `git push origin main` (running 4 min)``;
* a FIFO or a pipe: ``data from FIFO /run/job/ready (tmpfs on /run): no process has it open for
  writing``, ``data from a pipe whose write end PID 812 `tar czf …` (running 9 s) holds``;
* a socket: ``data on tcp 127.0.0.1:41234 -> 127.0.0.1:5555, whose other end PID 900 `python
  peer.py` (running 2 min) holds``;
* a file: ``read() on /mnt/ckpt/x.pt (fuse on /mnt/ckpt)``;
* a lock: ``a lock, which thread 'writer' (at train.py:175 _hold, the only other thread in your
  code) may hold`` (a ``threading.Lock`` records no owner: the threads that could hold it are named);
* a C call holding the GIL: ``a native call that holds the GIL: sleep() in libc.so.6``;
* its DataLoader: ``its DataLoader worker PID 812, in dataset.py:40 __getitem__``.

None when the rank is not waiting for a thing of its own (a collective, its GPU: the verdict says
those), or nothing more is known than its phase.
"""

from __future__ import annotations

import re

from ..frames import is_user
from ..snapshot import KernelState, PeerProcess, Rank, ThreadStack, age_text
from .kernel import CALL_WORDS
from .phases import main_thread, native_callee, where_frame

WRITE_CALLS = frozenset({"write", "writev", "pwrite64", "sendto", "sendmsg"})
CANDIDATE_THREADS = 3


def waits_for(rank: Rank) -> str | None:
    """The thing ``rank`` waits for, in words (see the module's list); None when none is named."""
    if rank.state in ("exited", "missing"):
        return None
    kernel = rank.kernel
    if rank.phase in ("dataloader", "subprocess") and rank.dataloader_worker:  # a DataLoader's or a Pool's
        return "its " + rank.dataloader_worker.replace(" is in ", ", in ", 1)
    if rank.phase == "subprocess" or (kernel is not None and kernel.target_kind == "child"):
        return _child(kernel)
    if rank.phase == "native":
        callee = _callee(rank.threads)
        return f"a native call that holds the GIL: {callee}" if callee else \
            "a native (C/C++) call that holds the GIL (a native sample names it: `n` in the live view, or --native)"
    if rank.phase == "lock":
        waited = _signalled(rank.threads)
        return _lock(rank.threads) if waited is None else _signal(waited, rank.threads, rank.log_tail or ())
    if kernel is not None and rank.phase in ("io", "checkpoint", "unknown", "compute") and kernel.target:
        return blocked_on(kernel)
    return None


def process_words(peer: PeerProcess) -> str:
    """``PID 812 `git push origin main` (running 4 min)``."""
    running = f" (running {age_text(peer.age_s)})" if peer.age_s is not None else ""
    return f"PID {peer.pid} `{peer.command}`{running}" if peer.command else f"PID {peer.pid}{running}"


def _processes(peers: tuple[PeerProcess, ...]) -> str:
    return ", ".join(process_words(p) for p in peers)


def _child(kernel: KernelState | None) -> str:
    """The child a rank in ``subprocess`` waits for: the one the kernel names (``wait4``), else whoever
    holds the other end of the pipe it reads (``communicate()``: the child's stdout)."""
    peers = kernel.peers if kernel is not None and kernel.target_kind in ("child", "pipe", "fifo") else ()
    if not peers:
        return "a child process it started (which one was not read)"
    noun = "its child process" if len(peers) == 1 else "its child processes"
    return f"{noun} {_processes(peers)}"


def blocked_on(kernel: KernelState) -> str | None:
    """A blocked call on a file, FIFO, pipe or socket, and who could answer it."""
    call = CALL_WORDS.get(kernel.syscall or "", kernel.syscall or "a call")
    kind, target, peers = kernel.target_kind, kernel.target or "", kernel.peers
    writes = kernel.syscall in WRITE_CALLS
    if kind == "fifo":
        what = f"{'room to write in' if writes else 'data from'} FIFO {target}"
        if not kernel.peers_known:
            return what
        side = "reading" if writes else "writing"
        return f"{what}: no process has it open for {side}" if not peers else \
            f"{what}, open for {side} by {_processes(peers)}"
    if kind == "pipe":
        what = f"{'room to write in' if writes else 'data from'} a pipe ({target})"
        end = "read end" if writes else "write end"
        if not kernel.peers_known:
            return what
        return f"{what}: no other process holds its {end}" if not peers else \
            f"{what} whose {end} {_processes(peers)} {'holds' if len(peers) == 1 else 'hold'}"
    if kind == "socket":
        if "LISTEN" in target:
            return f"a connection on {target.removesuffix(' LISTEN')} (listening, in {call}())"
        what = f"{'room to send on' if writes else 'data on'} {target.removesuffix(' ESTABLISHED')}"
        if peers:
            return f"{what}, whose other end {_processes(peers)} {'holds' if len(peers) == 1 else 'hold'}"
        return what + (": no local process holds its other end (a peer on another host)"
                       if kernel.peers_known else "")
    if kind == "file":
        return f"{call}() on {target}"
    return None


def _callee(threads: tuple[ThreadStack, ...]) -> str | None:
    main = main_thread(threads)
    return native_callee(main.frames) if main is not None else None


# What a thread waits in when another thread must wake it (set, notify, put): threading's and queue's.
_SIGNALLED = {"Event.wait": "an Event", "Condition.wait": "a Condition", "Condition.wait_for": "a Condition",
              "Queue.get": "a queue", "Barrier.wait": "a threading.Barrier"}
# Python's report of a thread that died of an exception (threading.excepthook).
_THREAD_DIED = re.compile(r"^Exception in thread (?P<name>.+?)(?: \(.*\))?:\s*$")


def _signalled(threads: tuple[ThreadStack, ...]) -> str | None:
    """``an Event`` when the main thread waits in ``Event.wait`` (or a Condition, a queue's get, a
    Barrier) called from outside the standard library: a thing another thread must set, not a lock."""
    main = main_thread(threads)
    found = None
    for frame in main.frames if main is not None else ():
        if frame.native:
            continue
        if frame.file.endswith(("/threading.py", "/queue.py")):
            found = _SIGNALLED.get(frame.function, found)
        else:
            break
    return found


def _signal(what: str, threads: tuple[ThreadStack, ...], log_tail: tuple[str, ...]) -> str:
    """``an Event, which thread 'ckpt' (at …) may set``; a thread that died of an exception (its
    report in the rank's log) is named: it may be the one that was to set it."""
    others = _user_threads(threads)
    dead = list(dict.fromkeys(m.group("name") for line in log_tail if (m := _THREAD_DIED.match(line.strip()))))
    died = ""
    if dead:
        error = _last_error(log_tail)
        died = f"thread '{dead[-1]}' died{f' of {error}' if error else ''} (its report in the log)"
    verb = "set" if what == "an Event" else "put to" if what == "a queue" else "notify"
    if not others:
        alone = f"no other thread in your code is left to {verb} it"
        return f"{what}: {died}, and {alone}" if died else f"{what}, which {alone}"
    who = others[0] + ", the only other thread in your code," if len(others) == 1 else \
        "one of " + ", ".join(others[:CANDIDATE_THREADS])
    return f"{what}, which {who} may {verb}" + (f"; {died}" if died else "")


def _last_error(lines: tuple[str, ...]) -> str | None:
    """The last ``SomeError: message`` line of a traceback in ``lines``."""
    for line in reversed(lines):
        match = re.match(r"^\s*([A-Za-z_][\w.]*(?:Error|Exception|Interrupt|Exit)): ?(.*)$", line)
        if match:
            return f"{match.group(1)}: {match.group(2)}".rstrip(": ")
    return None


def _user_threads(threads: tuple[ThreadStack, ...]) -> list[str]:
    """The threads other than the main one that are in the user's code, in words."""
    main = main_thread(threads)
    others = []
    for thread in threads:
        if thread is main or not thread.frames or thread.name.startswith("trainwatch"):
            continue
        frame = where_frame(thread.frames)
        if frame is not None and is_user(frame):
            others.append(f"thread '{thread.name}' (at {frame.label()})")
    return others


def _lock(threads: tuple[ThreadStack, ...]) -> str:
    """A lock, and the other threads in the user's code that may hold it (a ``threading.Lock``
    records no owner; these are the ones that could)."""
    others = _user_threads(threads)
    if not others:
        return "a lock (no other thread is in your code: a library's thread, or a lock never released, holds it)"
    if len(others) == 1:
        return f"a lock, which {others[0]}, the only other thread in your code, may hold"
    return f"a lock, which one of {', '.join(others[:CANDIDATE_THREADS])} may hold"
