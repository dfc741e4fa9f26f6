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
from ...snapshot import FILE_SYSCALLS, KernelState, ThreadStack
from ...record import Record

MAX_PARALLEL = 32


@dataclass(repr=False)
class _RankRead(Record):
    """One rank's sample in the making: its counters and the kernel's view of it before, why it
    may not be paused, the py-spy run.

    A look reads the rank without pausing it (py-spy ``--nonblocking``): a pausing attach stops
    every thread of the rank, and a GPU rank holds ~160 (NCCL, CUDA, OpenMP, pin-memory), which
    stalls its step for tens of milliseconds, and in a lockstep job every rank with it. Only a
    native stack needs the pause. A read without pausing may be torn (the interpreter moved on
    while py-spy walked its frames): it is whole when the thread did not run while read (its
    counters did not move), or when its stack is a whole chain (:func:`whole`); else it is read
    once more without pausing, and then, that failing too, with the pause."""

    pid: int
    before: ThreadCounters | None
    kernel: KernelState | None
    tid: int | None
    native: bool
    locals: bool
    timeout: float
    why: str | None  # read without pausing, and why (no pause is ever attempted then)
    run: PySpyRun | None = None
    torn: int = 0  # reads without pausing that came back torn or failed

    @property
    def pausing(self) -> bool:
        """This read pauses the rank: it needs native frames, or reads without pausing kept failing."""
        return self.why is None and (self.native or self.torn > TORN_TRIES)

    def start(self) -> None:
        if self.why is not None:  # a pause would hurt or cannot work: never attempted
            self.run = PySpyRun(self.pid, timeout=self.timeout, nonblocking=True)
        elif self.pausing:
            self.run = PySpyRun(self.pid, native=self.native, timeout=self.timeout, locals=self.locals)
        else:
            self.run = PySpyRun(self.pid, timeout=self.timeout, locals=self.locals, nonblocking=True)

    def _again(self) -> None:
        """This read came back torn or failed without pausing: read again (with the pause once the
        tries without it are spent)."""
        self.torn += 1
        self.start()

    def end(self) -> StackSample | None:
        """The sample, from the ended run; None when it is started again (see the class doc)."""
        assert self.run is not None and self.run.ended is not None
        looking = self.why is None and not self.pausing  # read without pausing by choice
        try:
            stacks, ints = self.run.result()
        except RankGone as exc:
            return StackSample(self.pid, None, self.before, None, error=exc, gone=True)
        except (AccessDenied, PySpyTimeout) as exc:
            # Denied or unanswered without pausing: a pause would be no better (it needs the same
            # access, and more of the rank). Denied or unanswered pausing: once more without.
            if self.pausing and procfs.state_letter(self.pid) not in (None, "Z", "X"):
                self.why = f"a pausing attach failed: {exc.message}"
                self.start()
                return None
            return self._failed(exc)
        except TrainwatchError as exc:  # py-spy lost its way in the frames: torn, or not Python yet
            if looking and procfs.state_letter(self.pid) not in (None, "Z", "X"):
                self._again()
                return None
            return self._failed(exc)
        after = procfs.thread_counters(self.pid, self.tid)
        if looking and not whole(stacks, self.before, after, self.tid):
            self._again()
            return None
        at = (self.run.started + self.run.ended) / 2
        if self.pausing:  # a pausing dump: the node's other trainwatch processes may take it
            shared_dumps.leave(self.pid, tuple(stacks), ints, at, self.native, self.locals)
        return StackSample(self.pid, tuple(stacks), self.before, after, ints=ints, at=at, kernel=self.kernel,
                           read=f"read without pausing ({self.why})" if self.why else None)

    def _failed(self, exc: TrainwatchError) -> StackSample:
        return StackSample(self.pid, None, self.before, procfs.thread_counters(self.pid, self.tid), error=exc,
                           kernel=self.kernel)


TORN_TRIES = 1  # reads without pausing tried again before the pausing one
# Where a thread's Python stack starts: a script or ``-c`` (``<module>``), ``python -m`` (runpy), a
# ``threading.Thread`` (``_bootstrap``: Ray Train's TrainingThread, say).
THREAD_STARTS = frozenset({"<module>", "_run_module_as_main", "_run_code", "_bootstrap"})


def whole(stacks: list[ThreadStack], before: ThreadCounters | None, after: ThreadCounters | None,
          tid: int | None = None) -> bool:
    """Whether a read without pausing is whole: the thread judged (``tid``, else the main thread)
    did not run while read (its counters did not move, so its frames could not change under
    py-spy), or its Python frames form a whole chain, from where a thread starts to where it is. A
    torn read loses or mixes frames, and its chain ends elsewhere."""
    if before is not None and after is not None and before == after:
        return True
    judged = next((t for t in stacks if (t.tid == tid if tid is not None else t.is_main)), None)
    if judged is None:  # that thread has ended, or py-spy read no thread at all
        return bool(stacks)
    python = [f for f in judged.frames if not f.native]
    return not python or python[-1].function in THREAD_STARTS


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
