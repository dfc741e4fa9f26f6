"""One sampling round over a local job's ranks: what it reads, and when it saw each rank progress.

py-spy stacks (an unchanged rank's kept: its scheduler counters show it did not run), their
classification, native stacks where a Python stack cannot say (``judge/native.py``), step-like
locals (``judge/steps.py``), the growth of the ranks' logs, and the moments a rank showed progress
(``StackWatch``: handed to the judge with each rank's evidence). Used by ``live.py``.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Callable

from .errors import ToolMissing
from .judge.native import PARALLEL as NATIVE_PARALLEL, NativeCache, resolve_natively
from .judge.phases import Classification, classify, main_thread, stack_signature
from .judge.progress import StackWatch
from .judge.steps import StepReader
from .read.processes import procfs
from .read.processes.exits import ExitLedger
from .read.logs.loggrowth import LogGrowth, LogGrowthWatch
from .read.processes.process import JobProcesses
from .read.stacks.pyspy import NATIVE_TIMEOUT, find_pyspy
from .read.stacks.sampler import StackSample, sample_all
from .read.stacks.source_lines import source_line, source_line_of
from .observed import FirstLook
from .snapshot import KernelState, LogActivity

FULL_REFRESH_EVERY = 5  # every few polls, dump every rank anyway (other threads, stale lines)


def signature_digest(signature: tuple) -> str:
    """A short, stable name for a stack signature, to hold one process's look against another's."""
    return hashlib.sha1(repr(signature).encode()).hexdigest()[:16]


def io_of(kernel: KernelState | None) -> int | None:
    """A rank's bytes read and written through syscalls so far (``/proc/PID/io``); None unread."""
    if kernel is None or kernel.rchar is None or kernel.wchar is None:
        return None
    return kernel.rchar + kernel.wchar


def first_look(sample: StackSample, signature: tuple, now: float) -> FirstLook:
    """What this sample saw before its dump: the counters, the stack, and since when (and in what)
    the kernel had the thread asleep without running."""
    kernel = sample.kernel
    asleep = kernel is not None and kernel.asleep_since is not None and kernel.letter in ("S", "D")
    return FirstLook(at=sample.at or now, counters=sample.before, signature=signature_digest(signature),
                     asleep_since=kernel.asleep_since if asleep else None,
                     asleep_in=(f"{kernel.syscall}()" if kernel.syscall else (kernel.wchan or "one wait"))
                     if asleep else None, io=io_of(kernel))


class Sampler:
    """What the last rounds saw of each rank: its stacks and their classification, its steps,
    its log's growth; and why no rank could be sampled (py-spy missing)."""

    def __init__(self, exits: ExitLedger, auto_native: bool = True) -> None:
        self.watch = StackWatch()  # each rank's last look, and when it progressed
        self.exits = exits  # who writes which log (growth of a shared one is nobody's in particular)
        self.auto_native = auto_native
        self.native = NativeCache()
        self.steps = StepReader(every=FULL_REFRESH_EVERY)
        self.stacks: dict[int, tuple] = {}
        self.classes: dict[int, Classification] = {}
        self.train_tid: dict[int, int] = {}  # pid -> the thread that trains, when not the main one
        self.pyspy_missing: ToolMissing | None = None
        self._logs = LogGrowthWatch()
        self._growth: dict[str, LogGrowth] = {}  # path -> its growth at the last look

    def forget_except(self, keep: set[int], logs: set[str]) -> None:
        """Drop what is remembered of PIDs not in ``keep`` and logs not in ``logs`` (ranks gone and
        no longer shown: a week-long view of a job whose ranks restart must not grow with them)."""
        for pid in [p for p in {*self.stacks, *self.classes, *self.train_tid} if p not in keep]:
            self.stacks.pop(pid, None)
            self.classes.pop(pid, None)
            self.train_tid.pop(pid, None)
            self.native.forget(pid)
            self.steps.forget(pid)
            self.watch.forget(pid)
        for path in [p for p in self._growth if p not in logs]:
            del self._growth[path]
            self._logs.forget(path)

    def round(self, job: JobProcesses, poll: int, native_for: frozenset[int],
              resolve: bool = True, problem: bool = False,
              started: Callable[[], None] | None = None) -> dict[int, StackSample]:
        """One sampling round in poll number ``poll``. ``resolve``: take native samples where needed
        (the last two rounds of a poll: the first of them finds an unchanged stack, its dumps
        overlap the pause before the last, which then reuses them from the cache). ``problem``:
        the last verdict was a problem (step-like locals are read every poll then). ``started``:
        called once every py-spy run of the round has started (work that can overlap them)."""
        try:
            find_pyspy()
            self.pyspy_missing = None
        except ToolMissing as exc:  # one clear line for the whole job, not one per rank
            self.pyspy_missing = exc
            return {}
        requests = []
        for proc in job.ranks:
            if procfs.state_letter(proc.pid) in (None, "Z", "X"):
                continue
            native = proc.rank in native_for
            tid = self.train_tid.get(proc.pid)
            counters = procfs.thread_counters(proc.pid, tid)
            skip = poll % FULL_REFRESH_EVERY and not self.watch.needs_dump(proc.pid, counters)
            requests.append((proc.pid, native, self.stacks.get(proc.pid), bool(skip), counters, tid))
        samples = sample_all(requests, locals_for=self._steps_due(requests, poll, problem), started=started)
        now = time.time()
        take = lambda pids: sample_all([(pid, True, None, False, None) for pid in pids],  # noqa: E731
                                       parallel=NATIVE_PARALLEL, timeout=NATIVE_TIMEOUT)
        samples = self.absorb(samples, now, take, resolve=resolve)
        self._look_at_logs(job, now)
        return samples

    def absorb(self, samples: dict[int, StackSample], now: float,
               take_native: Callable[[list[int]], dict[int, StackSample]], resolve: bool = True) -> dict[int, StackSample]:
        """The part of a round after py-spy: read the steps, classify the samples, take native ones
        (``take_native``) where a Python stack cannot say, and look at each rank's progress
        (``watch``). Recorded samples replayed by the tests come through here too."""
        self._read_steps(samples, now)
        classified = {pid: classify(sample.threads, source_line_of(pid), sample.kernel)
                      for pid, sample in samples.items() if sample.threads is not None}
        if self.auto_native and resolve:
            samples, classified = resolve_natively(samples, classified, self.native, self.watch, now,
                                                   take_native, source_line)
        for pid, cls in classified.items():
            sample = samples[pid]
            self.stacks[pid] = sample.threads
            self.classes[pid] = cls
            signature = stack_signature(main_thread(sample.threads))
            first = first_look(sample, signature, now) if self.watch.first_seen(pid) is None else None
            kernel = sample.kernel
            asleep = kernel.asleep_since if kernel is not None and kernel.letter in ("S", "D") else None
            self.watch.observe(pid, signature, cls.phase, sample.before, sample.after, now, dumped=not sample.reused,
                               first=first, asleep_since=asleep)
            self._follow_training_thread(pid, sample.threads)
        return samples

    def _follow_training_thread(self, pid: int, threads: tuple) -> None:
        """Count the progress of the thread that trains (Ray's TrainingThread, say) from now on: the
        main thread of such a rank only waits, its counters never move."""
        trains = main_thread(threads)
        tid = trains.tid if trains is not None and not trains.is_main and trains.tid else None
        if tid != self.train_tid.get(pid):
            if tid is None:
                self.train_tid.pop(pid, None)
            else:
                self.train_tid[pid] = tid
            self.watch.rebaseline(pid, procfs.thread_counters(pid, tid))  # compare like with like

    def log_activity(self, path: str | None, now: float) -> LogActivity | None:
        """The growth of the log at ``path`` as last looked at."""
        growth = self._growth.get(path) if path else None
        if growth is None:
            return None
        return LogActivity(age_s=round(max(0.0, now - growth.last_write_at), 1), every_s=growth.usual_every_s,
                           longest_s=growth.longest_s, own=self.exits.logs.own(growth.path), bar_s=growth.bar_s)

    def _look_at_logs(self, job: JobProcesses, now: float) -> None:
        """One stat per log file; a rank's own log that grew is that rank's progress."""
        self.exits.note_job(job)
        looked = {path: self._logs.look(path) for path in {p.log_path for p in job.ranks if p.log_path}}
        self._growth.update({path: growth for path, growth in looked.items() if growth is not None})
        for proc in job.ranks:
            growth = looked.get(proc.log_path) if proc.log_path else None
            if growth is not None and growth.grew and self.exits.logs.own(growth.path):
                self.watch.mark(proc.pid, now)

    # -- steps (probes/judge/steps.py) ---------------------------------------------------------------
    def _steps_due(self, requests: list, poll: int, problem: bool) -> frozenset[int]:
        """Ranks whose step-like locals this round reads, with --locals in the same pass: every
        round of the first window and of the full refreshes (every rank is dumped then anyway),
        every poll while the verdict is a problem; see StepReader.due."""
        self.steps.next_round()
        force, now = poll % FULL_REFRESH_EVERY == 0 or problem, time.time()
        # Also every rank whose last look showed neither a new stack nor a sign in its counters: a loop
        # spinning at one wait each step (a CUDA sync) shows only that, and only its step tells
        # whether it went round (judge/progress.py); and every rank last seen in such a wait, so that
        # a second look there reads the step in the same pass. Other waits that wake, and moving ranks, need none.
        return frozenset(pid for pid, native, _prev, _skip, counters, *_ in requests
                         if not native and self.steps.due(pid, counters, now, force=force or self.watch.unclear(pid)
                                                          or self.watch.blind(pid)))

    def _read_steps(self, samples: dict[int, StackSample], now: float) -> None:
        """Feed the step clock; a step that changed is that rank's progress."""
        for pid, sample in samples.items():
            if sample.ints is not None and sample.threads:
                at = sample.at or now
                if self.steps.observe(pid, main_thread(sample.threads).frames, sample.ints, sample.after, at):
                    self.watch.mark(pid, at)
