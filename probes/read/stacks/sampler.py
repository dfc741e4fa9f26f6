"""Sample every rank's stacks in parallel, each py-spy call bounded, with counters around each dump."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor

from ...errors import AccessDenied, TrainwatchError
from ...observed import StackSample, ThreadCounters
from ..processes import procfs
from ..processes.kernel_view import current_syscall
from .pyspy import DEFAULT_TIMEOUT, PySpyTimeout, RankGone, dump_stacks, tracer_of
from ...snapshot import FILE_SYSCALLS, ThreadStack

MAX_PARALLEL = 32


def sample_one(pid: int, native: bool, previous: tuple[ThreadStack, ...] | None,
               skip: bool, before: ThreadCounters | None = None, tid: int | None = None,
               timeout: float = DEFAULT_TIMEOUT, locals: bool = False) -> StackSample:
    """One rank: reuse ``previous`` when ``skip``, else a bounded py-spy dump between two counter
    reads. ``before``: the counters if the caller has just read them; ``tid``: the thread whose
    counters tell (the one that trains; default the main thread). ``locals``: dump with
    ``--locals`` (never skipped; not with ``native``) and keep the step-like integers."""
    before = before or procfs.thread_counters(pid, tid)
    if before is None:
        return StackSample(pid, None, None, None, gone=True)
    locals = locals and not native
    if skip and previous is not None and not native and not locals:
        return StackSample(pid, previous, before, before, reused=True)
    ints, started = None, time.time()
    why = no_pause_reason(pid)
    try:
        try:
            if why is not None:  # a pause would hurt or cannot work: never attempted
                stacks = dump_stacks(pid, timeout=timeout, nonblocking=True)
            elif locals:
                stacks, ints = dump_stacks(pid, timeout=timeout, locals=True)
            else:
                stacks = dump_stacks(pid, native=native, timeout=timeout)
        except (AccessDenied, PySpyTimeout) as exc:
            if why is not None or procfs.state_letter(pid) in (None, "Z", "X"):
                raise
            why = f"a pausing attach failed: {exc.message}"  # once more, without pausing
            stacks = dump_stacks(pid, timeout=timeout, nonblocking=True)
    except RankGone as exc:
        return StackSample(pid, None, before, None, error=exc, gone=True)
    except TrainwatchError as exc:
        return StackSample(pid, None, before, procfs.thread_counters(pid, tid), error=exc)
    at = (started + time.time()) / 2
    return StackSample(pid, tuple(stacks), before, procfs.thread_counters(pid, tid), ints=ints, at=at,
                       read=f"read without pausing ({why})" if why else None)


# Process states where a ptrace stop would hurt or cannot be had: D (an uninterruptible wait: on a
# network filesystem a stop may turn into EINTR for the job), T (stopped: py-spy would resume it),
# t (stopped by a tracer: only one tracer at a time).
NO_PAUSE_STATES = {"D": "in an uninterruptible kernel wait (D)", "T": "stopped (T)", "t": "held by a tracer (t)"}


def no_pause_reason(pid: int) -> str | None:
    """Why ``pid`` must be read without pausing it, or None: its state, or a tracer holding it."""
    state = procfs.state_letter(pid)
    if state in NO_PAUSE_STATES:
        return NO_PAUSE_STATES[state]
    tracer = tracer_of(pid)
    if tracer:
        return f"traced by {tracer}"
    call = current_syscall(pid)
    if call in FILE_SYSCALLS:  # a stop would interrupt the request (FUSE, NFS): the job could see EINTR
        return f"in {call}(), a file call"
    if call in NETWORK_SYSCALLS:
        return f"in {call}(), a network call"
    return None


NETWORK_SYSCALLS = frozenset({"connect", "accept", "accept4", "recvfrom", "recvmsg", "sendto", "sendmsg"})


# (pid, native, previous stacks, skip the py-spy call, counters just read[, the thread that trains])
Request = tuple


def sample_all(requests: list[Request], timeout: float = DEFAULT_TIMEOUT,
               parallel: int = MAX_PARALLEL, locals_for: frozenset[int] = frozenset()) -> dict[int, StackSample]:
    """requests: (pid, native, previous stacks, skip the py-spy call, counters just read) per rank;
    ``locals_for``: PIDs to dump with ``--locals`` in the same pass."""
    if not requests:
        return {}
    with ThreadPoolExecutor(max_workers=min(parallel, len(requests)), thread_name_prefix="tw-spy") as pool:
        futures = {req[0]: pool.submit(sample_one, *req, timeout=timeout, locals=req[0] in locals_for)
                   for req in requests}
        return {pid: future.result() for pid, future in futures.items()}
