"""Verdicts from the kernel's view of the ranks (``Rank.kernel``): a rank stopped, held by a
debugger, or blocked on its storage is the culprit, whatever its Python stack says. Pure.

* every local rank stopped (T): the job is suspended (SIGSTOP, ``scontrol suspend``), not hung;
* a rank stopped (T) or held by a tracer (t) while others wait for it: the culprit, with how;
* a rank stuck in a file call on a filesystem (or in an uninterruptible wait, D): the culprit
  ("rank 1 blocked 43 s in stat() on /mnt/ckpt/x.pt (fuse.gcsfuse on /mnt/ckpt) from torch.save
  at train.py:88").
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from ..snapshot import FILE_SYSCALLS, Rank, Verdict, age_text, who

STALL_SLACK_S = 5.0  # a tracer started within this of the stall may have caused it (a loaded node delays a rank seconds)

# How a syscall reads in a sentence.
CALL_WORDS = {"newfstatat": "stat", "statx": "stat", "lstat": "stat", "fstat": "stat", "openat": "open",
              "openat2": "open", "pread64": "read", "readv": "read", "pwrite64": "write", "writev": "write",
              "fdatasync": "fsync", "renameat": "rename", "renameat2": "rename", "unlinkat": "unlink",
              "mkdirat": "mkdir", "getdents64": "getdents", "recvfrom": "recv", "recvmsg": "recv", "sendto": "send",
              "sendmsg": "send", "accept4": "accept", "ppoll": "poll"}


def from_kernel(ranks: Sequence[Rank], waits_text: Callable[[list[Rank]], str],
                others_text: Callable[[list[Rank]], str] | None = None, now: float | None = None) -> Verdict | None:
    """The kernel's verdict, or None when it shows nothing wrong. ``waits_text``: how the ranks
    waiting for the culprits wait, in words (``verdict.waits``); ``others_text``: where ranks that
    are neither culprits nor waiting for them are stuck (``verdict.each_at``). ``now``: when the
    ranks were read; with it, a rank a tracer holds is no culprit if the job had stalled before the
    tracer started: someone looked at a hang (``gdb -p``), they did not cause it.

    One meaning per kind: culprits with ranks waiting for them, or running on without them, make
    a ``straggler``; every rank blocked on its storage is a ``hang`` that names no rank (the
    storage holds the job, not one rank). A rank held a moment (stopped, traced) that nothing
    waits on and that is not stuck itself is no verdict: the job goes on."""
    local = [r for r in ranks if r.state in ("running", "stuck", "unknown") and r.kernel is not None]
    if not local:
        return None
    stalled = _stalled_since(local, now)
    stopped = [r for r in local if r.kernel.letter in ("T", "t") and not looked_at_after(r, stalled)
               and not being_dumped(r)]
    if stopped and len(stopped) == len(local) and all(r.kernel.letter == "T" for r in stopped):
        return Verdict("unknown", (), "every rank is stopped (T): the job is suspended (SIGSTOP, `scontrol "
                                      "suspend`, job control), not hung; `kill -CONT` resumes it")
    blocked = [r for r in local if r not in stopped and r.state == "stuck" and _on_storage(r)]
    culprits = stopped + blocked
    if not culprits:
        return None
    live = [r for r in ranks if r.state in ("running", "stuck", "unknown")]  # a rank read without its kernel's view too
    waiting = [r for r in live if r not in culprits and r.state == "stuck" and r.phase in ("collective", "gpu_wait")]
    text = "; ".join(_why(r) for r in culprits)
    if waiting:
        return Verdict("straggler", _numbers(culprits), f"{text} while {who(_numbers(waiting))} {waits_text(waiting)}")
    others = [r for r in live if r not in culprits]
    if not others:
        if stopped:
            return None  # stopped and traced ranks alone: the stack rules say where they are
        return Verdict("hang", (), f"{text}: every rank waits on its storage, not on another rank")
    if not blocked and not any(r.state == "stuck" for r in stopped):
        return None  # held a moment, nothing waits on it yet (a py-spy or gdb attach): no verdict of its own
    running = [r for r in others if r.state == "running"]
    if len(running) == len(others):
        return Verdict("straggler", _numbers(culprits),
                       f"{text} while {who(_numbers(running))} {'runs' if len(running) == 1 else 'run'} on")
    if others_text is not None:
        return Verdict("straggler", _numbers(culprits), f"{text}; {others_text(others)}")
    return None


def _stalled_since(ranks: Sequence[Rank], now: float | None) -> float | None:
    """Since when the job is known to have stalled: the earliest a stuck rank stopped progressing."""
    if now is None:
        return None
    return min((now - r.stuck_for_s for r in ranks if r.state == "stuck" and r.stuck_for_s is not None), default=None)


def being_dumped(rank: Rank) -> bool:
    """Held by py-spy: a dump (another trainwatch's, someone's `py-spy dump`) holds a rank for
    milliseconds; it is a look, never what the job waits for."""
    kernel = rank.kernel
    return kernel is not None and kernel.letter == "t" and (kernel.tracer or "").startswith("py-spy ")


def looked_at_after(rank: Rank, stalled_since: float | None) -> bool:
    """A rank held by a tracer (t) whose tracer started only after the job had stalled: it looks at
    a hang that was already there (``gdb -p`` on a stuck rank), it did not cause it."""
    kernel = rank.kernel
    if stalled_since is None or kernel is None or kernel.letter != "t" or kernel.tracer_since is None:
        return False
    return stalled_since + STALL_SLACK_S < kernel.tracer_since


def _on_storage(rank: Rank) -> bool:
    """In an uninterruptible wait, or a file call on a file (a FIFO waits for a process, not storage)."""
    kernel = rank.kernel
    return kernel is not None and (kernel.letter == "D" or (kernel.syscall in FILE_SYSCALLS and bool(kernel.fs_type)
                                                            and kernel.target_kind in (None, "file")))


def _why(rank: Rank) -> str:
    kernel = rank.kernel
    name = who([rank.rank]) if rank.rank is not None else f"PID {rank.pid}"
    if kernel.letter == "T":
        return f"{name} is stopped (T: SIGSTOP or job control; left so)"
    if kernel.letter == "t":
        return f"{name} is held by {kernel.tracer}" if kernel.tracer else f"{name} is stopped by a tracer (t)"
    since = f" {age_text(rank.stuck_for_s)}" if rank.stuck_for_s else ""
    if kernel.syscall in FILE_SYSCALLS:
        call = CALL_WORDS.get(kernel.syscall, kernel.syscall)
        text = f"{name} blocked{since} in {call}() on {kernel.target or 'a file'}"
    else:
        text = f"{name} is in an uninterruptible kernel wait (D){since} in {kernel.wchan or 'the kernel'}"
    frame = rank.user_frame or rank.where
    return text + (f" from {frame}" if frame else "")


def _numbers(ranks: Sequence[Rank]) -> tuple[int, ...]:
    return tuple(sorted({r.rank for r in ranks if r.rank is not None}))
