"""Sample every rank's stacks in parallel, each py-spy call bounded, with counters around each dump."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from ...errors import AccessDenied, TrainwatchError
from ...observed import StackSample, ThreadCounters
from ..processes import procfs
from ..processes.kernel_view import kernel_state
from . import shared_dumps
from .pyspy import DEFAULT_TIMEOUT, PySpyRun, PySpyTimeout, RankGone, wait_any
from ...snapshot import FILE_SYSCALLS, KernelState
from ...record import Record

MAX_PARALLEL = 32


@dataclass(repr=False)
class _RankRead(Record):
    """One rank's sample in the making: its counters and the kernel's view of it before, why it
    may not be paused, the py-spy run."""

    pid: int
    before: ThreadCounters
    kernel: KernelState | None
    tid: int | None
    native: bool
    locals: bool
    timeout: float
    why: str | None  # read without pausing, and why
    run: PySpyRun | None = None

    def start(self) -> None:
        if self.why is not None:  # a pause would hurt or cannot work: never attempted
            self.run = PySpyRun(self.pid, timeout=self.timeout, nonblocking=True)
        else:
            self.run = PySpyRun(self.pid, native=self.native, timeout=self.timeout, locals=self.locals)

    def end(self) -> StackSample | None:
        """The sample, from the ended run; None when it is started again without pausing."""
        assert self.run is not None and self.run.ended is not None
        try:
            try:
                stacks, ints = self.run.result()
            except (AccessDenied, PySpyTimeout) as exc:
                if self.why is not None or procfs.state_letter(self.pid) in (None, "Z", "X"):
                    raise
                self.why = f"a pausing attach failed: {exc.message}"  # once more, without pausing
                self.start()
                return None
        except RankGone as exc:
            return StackSample(self.pid, None, self.before, None, error=exc, gone=True)
        except TrainwatchError as exc:
            return StackSample(self.pid, None, self.before, procfs.thread_counters(self.pid, self.tid), error=exc,
                               kernel=self.kernel)
        at = (self.run.started + self.run.ended) / 2
        if self.why is None:  # a pausing dump: the node's other trainwatch processes may take it
            shared_dumps.leave(self.pid, tuple(stacks), ints, at, self.native, self.locals)
        return StackSample(self.pid, tuple(stacks), self.before, procfs.thread_counters(self.pid, self.tid),
                           ints=ints, at=at, kernel=self.kernel,
                           read=f"read without pausing ({self.why})" if self.why else None)


def _begin(request: tuple, timeout: float, locals: bool) -> StackSample | _RankRead:
    """A request's sample when no py-spy is needed (gone, or unchanged), else its read, started."""
    pid, native, previous, skip, before, *rest = request
    tid = rest[0] if rest else None
    before = before or procfs.thread_counters(pid, tid)
    if before is None:
        return StackSample(pid, None, None, None, gone=True)
    locals = locals and not native
    if skip and previous is not None and not native and not locals:
        return StackSample(pid, previous, before, before, reused=True)
    # Read here, not after every dump ends: the rank is as it was before any pause of this round,
    # and the read overlaps the runs already started instead of adding to the round's end.
    kernel = kernel_state(pid, tid)
    shared = shared_dumps.fresh(pid, native, locals)
    if shared is not None:  # another trainwatch process just paused it for the same: no second pause
        return StackSample(pid, shared.threads, before, before, ints=shared.ints, at=shared.at, kernel=kernel)
    read = _RankRead(pid, before, kernel, tid, native, locals, timeout, no_pause_reason(kernel))
    read.start()
    return read


# Process states where a ptrace stop would hurt or cannot be had: D (an uninterruptible wait: on a
# network filesystem a stop may turn into EINTR for the job), T (stopped: py-spy would resume it),
# t (stopped by a tracer: only one tracer at a time).
NO_PAUSE_STATES = {"D": "in an uninterruptible kernel wait (D)", "T": "stopped (T)", "t": "held by a tracer (t)"}


def no_pause_reason(kernel: KernelState | None) -> str | None:
    """Why a rank the kernel sees so (read just before) must be read without pausing it, or None:
    its state, or a tracer holding it, or the call it is in."""
    if kernel is None:  # gone: py-spy says so
        return None
    if kernel.letter in NO_PAUSE_STATES:
        return NO_PAUSE_STATES[kernel.letter]
    if kernel.tracer:
        return f"traced by {kernel.tracer}"
    if kernel.syscall in FILE_SYSCALLS:  # a stop would interrupt the request (FUSE, NFS): the job could see EINTR
        return f"in {kernel.syscall}(), a file call"
    if kernel.syscall in NETWORK_SYSCALLS:
        return f"in {kernel.syscall}(), a network call"
    return None


NETWORK_SYSCALLS = frozenset({"connect", "accept", "accept4", "recvfrom", "recvmsg", "sendto", "sendmsg"})


# (pid, native, previous stacks, skip the py-spy call, counters just read[, the thread that trains])
Request = tuple


def sample_all(requests: list[Request], timeout: float = DEFAULT_TIMEOUT,
               parallel: int = MAX_PARALLEL, locals_for: frozenset[int] = frozenset(),
               started: Callable[[], None] | None = None) -> dict[int, StackSample]:
    """requests: (pid, native, previous stacks, skip the py-spy call, counters just read[, tid]) per
    rank; ``locals_for``: PIDs to dump with ``--locals`` in the same pass. Up to ``parallel`` py-spy
    run at once, all started and read from this thread: a thread per rank cost more in start-up
    and hand-offs than the reads themselves, with py-spy holding every core. ``started``: called
    once, when every run has started (or the last is queued behind ``parallel``)."""
    samples: dict[int, StackSample] = {}
    queue = list(requests)
    running: dict[PySpyRun, _RankRead] = {}
    try:
        while queue or running:
            while queue and len(running) < parallel:
                request = queue.pop(0)
                begun = _begin(request, timeout, locals=request[0] in locals_for)
                if isinstance(begun, StackSample):
                    samples[begun.pid] = begun
                else:
                    running[begun.run] = begun
            if started is not None and (not queue or len(running) >= parallel):
                started()
                started = None
            for run in wait_any(list(running)) if running else ():
                read = running.pop(run)
                sample = read.end()
                if sample is None:  # started again without pausing
                    running[read.run] = read
                else:
                    samples[read.pid] = sample
    finally:
        for run in running:  # left by an error on the way: stopped, and no rank left paused
            run.give_up()
    return {req[0]: samples[req[0]] for req in requests}
