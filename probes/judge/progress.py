"""Decide whether a rank made progress, from repeated stack samples and its main thread's counters.

A rank is *stuck* when, for at least the stuck threshold, its main thread showed no sign of
progress. Signs of progress between two samples:

* its Python stack changed (any frame or line);
* it blocked and woke up again, at least twice, in a gap it mostly slept through: its voluntary
  context switches grew between our dumps (a pausing attach, as a native dump is, adds two, so
  only the gaps between dumps are counted; a single wake-up is what a signal such as faulthandler's does to a thread
  that stays blocked), and it was on a CPU or waiting for one for less than ``SPIN_SHARE`` of
  that gap. Wake-ups that a pause from outside explains do not count: any other ptrace attach
  (another trainwatch, ``py-spy dump/top/record``, ``gdb -p``, pystack, a profiler) or a stop
  signal halts every thread of the process and wakes each blocked one twice, while an answered
  wait wakes only its waiter. A few of the process's quietest other threads (its *witnesses*,
  ``procfs.witness_threads``) are read with the main thread; twice the fewest wake-ups any of them
  made in the gap is taken off the main thread's (measured on a hung gloo rank: three py-spy dumps
  from another shell gave every one of its six threads the same +4 but the gloo loop thread, which
  wakes on its own). A blocking wait (a gloo or socket receive, a lock, a CUDA sync under
  ``cudaDeviceScheduleBlockingSync``) sleeps until it is answered: its wake-ups are the answers.
  A spinning wait (a CUDA sync under the default schedule: how hung NCCL ranks wait) stays
  runnable, and the few voluntary switches it makes come from elsewhere (measured on an H200,
  ``tests/fixtures/h200/``: hung ranks made 0 to 4 in 4 s, as many as a healthy rank whose step
  blocks once in a short gloo all_reduce). A spinning rank's progress shows in its stack, its
  step (below) or its collectives, not in its wake-ups. Counters that carry no times (recordings)
  leave the wake-ups alone to count. Nor are the wake-ups of a rank in a collective or GPU wait that
  sleeps on a timer (``nanosleep``, ``clock_nanosleep``) progress: that wait polls for completion
  (PyTorch's ``WorkNCCL::wait`` under ``TORCH_NCCL_BLOCKING_WAIT`` or with a timeout sleeps 10 ms
  between ``isCompleted()`` checks), and each wake-up is its timer's, not an answer;
* its step-like local (``step``, ``global_step``... read with ``--locals``, see
  :mod:`trainwatch.probes.judge.steps`) changed: the loop went round, whatever line it waits at.
  Read at each dump of a rank whose last look was :meth:`StackWatch.unclear` or found it in a
  wait its counters cannot see through (:meth:`StackWatch.blind`);
* it burnt CPU (2 ms or more between two looks) while not in a wait that spins (a long compute
  line is still work, and so is a loop read at its short ``time.sleep`` each time; a thread
  spinning inside a collective or a CUDA synchronize is not: the phase comes from a native sample
  when the Python stack alone is ambiguous, see :mod:`trainwatch.probes.judge.native`);
* something outside the stacks saw it advance (its Flight Recorder's completed collectives).

A rank is judged against its own rhythm: the threshold for "stuck" is the window, or twice the
longest quiet stretch it recently went through before progressing, or three of its step periods,
whichever is longest. A job with 30-second steps is not called hung after 3 s; one with 50 ms
steps is flagged after the window.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ..observed import FirstLook, ThreadCounters
from ..snapshot import CollectiveState, age_text
from ..record import Record

MIN_WAKEUPS = 2
SPIN_SHARE = 0.5
QUIET_SHARE = 0.02  # of a stretch between two looks, the most CPU a thread that made no progress used
# Waits in which a thread may burn CPU without going anywhere: a collective or a CUDA sync spins (NCCL),
# TCPStore's master polls every 10 ms in init, the interpreter's shutdown joins threads. CPU burnt in
# any other phase is work, whatever line the samples catch the thread at: a loop that sleeps a little
# each step is read at its `time.sleep` again and again (on a loaded node its wake-ups come while it
# is runnable, which reads as spinning), yet it computes in between. ``subprocess``: a wait with a
# timeout wakes 20 times a second (see ``POLLED_PHASES``), a little CPU each time.
SPINNING_WAITS = frozenset({"collective", "gpu_wait", "init", "exiting", "native", "subprocess"})
RAN_NS = 2_000_000  # on a CPU this long between two looks: work, not the microseconds a ptrace pause costs
TIMER_SLEEPS = frozenset({"nanosleep", "clock_nanosleep"})
# Waits that end on an event: a timer in one is a poll loop. ``init`` too: TCPStore's master polls
# every 10 ms until all its workers joined (``TCPStore::waitForWorkers``, torch's TCPStore.cpp).
# ``subprocess`` too: ``subprocess.run(timeout=…)`` waits in a loop of sleeps of up to 50 ms
# (``Popen._wait``), however long the child runs.
POLLED_PHASES = frozenset({"collective", "gpu_wait", "init", "subprocess"})
DATALOADER_CHECK_NS = 5_000_000_000  # torch's MP_STATUS_CHECK_INTERVAL: a waiting DataLoader checks its workers
CHECK_RUN_NS = 5_000_000  # the most CPU one such check is taken to cost, on a loaded machine
GAPS_KEPT = 16  # recent quiet stretches that set a rank's rhythm
GAP_FACTOR = 2.0
STEP_FACTOR = 3.0


@dataclass(repr=False)
class _Look(Record):
    """The sampler's last look at one rank's main thread."""

    signature: tuple
    after: ThreadCounters | None  # counters at the last observation (right after a dump, if any)
    first_seen: float
    dumped_after: ThreadCounters | None = None  # counters right after the last real py-spy dump
    unclear: bool = False  # the last look found the same stack and no sign of progress in the counters
    signs: list[float] = field(default_factory=list)  # when progress was seen, not yet handed on
    first: FirstLook | None = None  # the first look, before any dump of ours woke it
    seen_at: float = 0.0  # unix time of the last look
    phase: str = ""  # the main thread's phase at the last look


def spun(before: ThreadCounters, after: ThreadCounters) -> bool | None:
    """Whether the thread was on a CPU or waiting for one for at least ``SPIN_SHARE`` of the time
    between two readings (see the module doc); None when the readings carry no times."""
    if before.at_ns is None or after.at_ns is None or before.run_ns is None or after.run_ns is None:
        return None
    wall = after.at_ns - before.at_ns
    busy = after.run_ns - before.run_ns
    if before.queued_ns is not None and after.queued_ns is not None:
        busy += after.queued_ns - before.queued_ns
    return wall > 0 and busy >= SPIN_SHARE * wall


def paused(before: ThreadCounters, after: ThreadCounters) -> int:
    """How many of the main thread's wake-ups between two readings a pause of the whole process
    from outside explains (see the module doc): twice the fewest wake-ups any of its witness
    threads made meanwhile (a blocked thread wakes twice a pause, a running one once); 0 when no
    witness was read both times."""
    earlier = dict(before.others)
    moved = [woke - earlier[tid] for tid, woke in after.others if tid in earlier]
    return 2 * max(0, min(moved)) if moved else 0


def wakeups(before: ThreadCounters, after: ThreadCounters) -> int:
    """The main thread's wake-ups between two readings that no pause from outside explains."""
    return after.voluntary - before.voluntary - paused(before, after)


def ran(before: ThreadCounters, after: ThreadCounters) -> bool:
    """The thread was on a CPU for at least ``RAN_NS`` between two readings (another tracer's pauses
    cost it microseconds each); by the clock ticks where the kernel keeps no schedstat."""
    if before.run_ns is not None and after.run_ns is not None and before.queued_ns is not None:
        return after.run_ns - before.run_ns >= RAN_NS
    return after.cpu_ticks > before.cpu_ticks


def status_checks_only(before: ThreadCounters, after: ThreadCounters) -> bool:
    """A rank waiting for its next batch woke no more, and used no more CPU, than the DataLoader's
    own check of its workers does: it wakes every 5 s (``MP_STATUS_CHECK_INTERVAL``) to see that
    they live, a millisecond or so each time. Under load a look's gap spans two of those checks
    (seen in CI: a rank waiting for its hung worker read as running). A batch that came is more
    wake-ups than that, and the stack moves on."""
    if before.at_ns is None or after.at_ns is None or before.run_ns is None or after.run_ns is None:
        return False
    checks = (after.at_ns - before.at_ns) / DATALOADER_CHECK_NS + 1
    return wakeups(before, after) <= checks and after.run_ns - before.run_ns <= checks * CHECK_RUN_NS


def quiet_between(before: ThreadCounters, after: ThreadCounters) -> bool:
    """No sign of progress between two readings of a thread, however far apart and whoever took
    them: no wake-up but those pauses from outside explain, and hardly any time on a CPU (a
    ptrace stop costs the thread microseconds)."""
    if before.run_ns is None or after.run_ns is None or before.at_ns is None or after.at_ns is None:
        return False
    wall = after.at_ns - before.at_ns
    return wall > 0 and wakeups(before, after) < MIN_WAKEUPS and after.run_ns - before.run_ns <= QUIET_SHARE * wall


def _woke(look: _Look, counters: ThreadCounters | None) -> bool:
    """The main thread blocked and woke up at least ``MIN_WAKEUPS`` times since the last look, more
    than a pause of the whole process explains, and mostly slept in between (see the module doc)."""
    if counters is None or look.after is None or wakeups(look.after, counters) < MIN_WAKEUPS:
        return False
    return not spun(look.after, counters)


def _on_timer(counters: ThreadCounters | None) -> bool:
    """The thread was read asleep on a timer: its wake-ups may be a poll loop's (see the module doc)."""
    return counters is not None and counters.syscall in TIMER_SLEEPS


class StackWatch:
    """What the sampler read of each rank across its rounds: the last stack signature and
    counters, and the moments they showed progress (or its log or storage counters grew), handed
    to the judge with the rank's evidence (``ObservedRank.progress_seen``) and then forgotten.
    Owned by the sampler; the judge keeps its own memory (:class:`ProgressTracker`)."""

    SIGNS_KEPT = 64  # between two polls; a sampler that is never asked keeps only the latest

    def __init__(self) -> None:
        self._looks: dict[int, _Look] = {}

    def observe(self, pid: int, signature: tuple, phase: str, before: ThreadCounters | None,
                after: ThreadCounters | None, now: float, dumped: bool = True,
                first: FirstLook | None = None, asleep_since: float | None = None) -> None:
        """One look at ``pid``'s main thread; ``first``: what the first look saw before its dump
        (kept for the judge: :meth:`first_look`). ``asleep_since``: the kernel found the thread
        asleep, without running, since then: progress seen in this look happened by that moment,
        not at the look (a rank that stops is called stuck from when it stopped)."""
        look = self._looks.get(pid)
        if look is None:
            self._looks[pid] = _Look(signature, after, now, dumped_after=after if dumped else None, first=first,
                                     seen_at=now)
            return
        progressed = self._progressed(look, signature, phase, before)
        if progressed:
            went_still = asleep_since is not None and look.seen_at < asleep_since < now
            self.mark(pid, asleep_since if went_still else now)
        look.seen_at = now
        look.unclear = not progressed
        look.phase = phase
        look.signature, look.after = signature, after
        if dumped:
            look.dumped_after = after

    @staticmethod
    def _progressed(look: _Look, signature: tuple, phase: str, before: ThreadCounters | None) -> bool:
        if signature != look.signature:
            return True
        if before is None or look.after is None:
            return False
        if phase == "dataloader" and status_checks_only(look.after, before):
            return False
        if _woke(look, before) and not (phase in POLLED_PHASES and _on_timer(before)):
            return True
        return phase not in SPINNING_WAITS and ran(look.after, before)

    def mark(self, pid: int, now: float) -> None:
        """Progress seen now by a reader (the stacks, the rank's own log, its storage counters)."""
        look = self._looks.get(pid)
        if look is not None:
            look.signs = (look.signs + [now])[-self.SIGNS_KEPT:]

    def take_signs(self, pid: int) -> tuple[float, ...]:
        """The moments progress was seen since the last call (for this poll's evidence)."""
        look = self._looks.get(pid)
        if look is None:
            return ()
        signs, look.signs = tuple(look.signs), []
        return signs

    def first_look(self, pid: int) -> FirstLook | None:
        """What the sampler's first look at ``pid`` saw before its dump."""
        look = self._looks.get(pid)
        return None if look is None else look.first

    def last_counters(self, pid: int) -> ThreadCounters | None:
        """The counters of ``pid``'s thread at the last look (after its dump, if any)."""
        look = self._looks.get(pid)
        return None if look is None else look.after

    def first_seen(self, pid: int) -> float | None:
        """When the sampler first looked at ``pid`` (None: never)."""
        look = self._looks.get(pid)
        return None if look is None else look.first_seen

    def signature(self, pid: int) -> tuple | None:
        """The Python stack signature last observed for ``pid``."""
        look = self._looks.get(pid)
        return None if look is None else look.signature

    def unclear(self, pid: int) -> bool:
        """Whether the last look found neither a new stack nor a sign of progress in the main
        thread's counters: only the rank's step (or its collectives) can tell whether it went round
        its loop."""
        look = self._looks.get(pid)
        return look is not None and look.unclear

    def blind(self, pid: int) -> bool:
        """Whether the last look found the main thread in a wait where its counters cannot tell
        progress from waiting (a collective or GPU wait: CPU there may be spin, wake-ups a poll
        loop's timer). Its step is then read at the next dump, in the same pass: the ranks of a
        lockstep job wait for each other every step, and a healthy one caught at the same wait at
        two looks in a row showed nothing else (seen: the healthy job called a straggler under
        load, the kernel's read catching its `time.sleep` timer and the dump its all_reduce)."""
        look = self._looks.get(pid)
        return look is not None and look.phase in SPINNING_WAITS  # the polled waits among them

    def woke(self, pid: int, before: ThreadCounters | None) -> bool:
        """Whether the main thread blocked and woke up repeatedly since the last observation (not
        on a timer, which may be a poll loop's)."""
        look = self._looks.get(pid)
        return look is not None and _woke(look, before) and not _on_timer(before)

    def rebaseline(self, pid: int, counters: ThreadCounters | None) -> None:
        """Forget counter changes someone else caused (an evidence dump's py-spy attaches)."""
        look = self._looks.get(pid)
        if look is not None and counters is not None:
            look.after = counters

    def needs_dump(self, pid: int, counters: ThreadCounters | None) -> bool:
        """Whether a fresh stack is worth a py-spy call. Not when the main thread has not run at
        all since the last dump (its stack cannot differ), nor when it plainly keeps working
        (woke up repeatedly since the last look: progress is already known; the stack shown
        may be a few polls old)."""
        look = self._looks.get(pid)
        if look is None or counters is None or look.dumped_after is None or look.after is None:
            return True
        if counters == look.dumped_after:
            return False
        return not _woke(look, counters) or _on_timer(counters)

    def forget(self, pid: int) -> None:
        self._looks.pop(pid, None)


@dataclass(repr=False)
class _Track(Record):
    """One rank's last look and when it last showed progress."""

    progress_at: float  # last time progress was seen (or first seen)
    first_seen: float
    gaps: list[float] = field(default_factory=list)  # recent quiet stretches that ended in progress
    # A look since the last progress saw none: the next progress ends a quiet stretch (without one,
    # the time between two progress marks is the sampling period, not the rank's rhythm).
    seen_still: bool = False
    # While no progress was seen since it was first watched: per kind of evidence ("kernel",
    # "collective", "log"), the earliest time the job's own evidence says it made none since, and
    # what says so (see ProgressTracker.still_since).
    still: dict[str, tuple[float, str]] = field(default_factory=dict)


@dataclass(frozen=True, repr=False)
class Stillness(Record):
    """Since when a rank made no progress, and what says so: the job's own evidence where it reaches
    back before trainwatch looked, else trainwatch's watch."""

    since: float
    source: str  # "last output 9 min ago; all_reduce #11 pending 9 min", or "since trainwatch first looked"
    watched_only: bool  # nothing older than trainwatch's own watch is known


class ProgressTracker:
    """The judge's memory of each rank's progress across polls (per PID): when it was first
    watched, when it last progressed (seen by the readers, or by its completed collectives and
    NCCL RAS counts), and its recent quiet stretches, its rhythm."""

    def __init__(self) -> None:
        self._tracks: dict[int, _Track] = {}

    def watch(self, pid: int, since: float) -> None:
        """Start following ``pid``, watched (sampled) since ``since``; nothing if already followed."""
        if pid not in self._tracks:
            self._tracks[pid] = _Track(since, since)

    def mark_progress(self, pid: int, now: float) -> None:
        """Record progress seen at ``now`` (by a reader, or by another source such as Flight Recorder)."""
        track = self._tracks.get(pid)
        if track is None or now <= track.progress_at:
            return
        if track.seen_still:
            track.gaps = (track.gaps + [now - track.progress_at])[-GAPS_KEPT:]
            track.seen_still = False
        track.progress_at = now
        track.still.clear()  # what it says of the time before is superseded by the progress seen

    def saw_still(self, pid: int) -> None:
        """A look at ``pid`` saw no progress: the stretch that the next progress ends was a quiet one."""
        track = self._tracks.get(pid)
        if track is not None:
            track.seen_still = True

    def hold_still(self, pid: int, since: float, kind: str, what: str) -> None:
        """The job's own evidence says ``pid`` made no progress since ``since`` (``kind``: one name per
        kind of evidence; ``what``: a template with ``{age}`` for its age, "last output {age} ago").
        Kept only while no progress was seen since the rank was first watched: a bound from the job
        (read at or after that first look) joined to trainwatch's own watch bounds the whole stretch.
        The earliest of each kind wins."""
        track = self._tracks.get(pid)
        if track is None or track.progress_at > track.first_seen or since >= track.first_seen:
            return
        known = track.still.get(kind)
        if known is None or since < known[0]:
            track.still[kind] = (since, what)

    def still_since(self, pid: int, now: float) -> Stillness | None:
        """Since when ``pid`` made no progress: the earliest of the job's own bounds (its main thread
        asleep in one wait, its pending collective, its last output) where no progress was seen since
        it was first watched, else the last progress seen (or the first look). None if never watched."""
        track = self._tracks.get(pid)
        if track is None:
            return None
        if not track.still:
            words = "since trainwatch first looked" if track.progress_at == track.first_seen else \
                "since trainwatch last saw it progress"
            return Stillness(track.progress_at, words, watched_only=True)
        kinds = sorted(track.still.values())
        own = [since for kind, (since, _) in track.still.items() if kind != "elsewhere"]
        if "elsewhere" in track.still and own and min(own) <= track.still["elsewhere"][0] + 1.0:
            kinds.remove(track.still["elsewhere"])  # the job's own evidence says as much: say that
        words = "; ".join(what.format(age=age_text(now - since)) for since, what in kinds)
        return Stillness(min(kinds[0][0], track.progress_at), words, watched_only=False)

    def still_kinds(self, pid: int) -> tuple[tuple[str, float, str], ...]:
        """The job's own bounds held for ``pid``: (kind, since, words with ``{age}``)."""
        track = self._tracks.get(pid)
        return tuple((kind, since, what) for kind, (since, what) in track.still.items()) if track else ()

    def threshold(self, pid: int, window: float, step_period: float | None = None) -> float:
        """Seconds without progress after which this rank counts as stuck (see the module doc)."""
        track = self._tracks.get(pid)
        rhythm = GAP_FACTOR * max(track.gaps) if track is not None and track.gaps else 0.0
        steps = STEP_FACTOR * step_period if step_period else 0.0
        return max(window, rhythm, steps)

    def longest_gap(self, pid: int) -> float | None:
        """The longest recent quiet stretch that ended in progress; None before any progress was seen."""
        track = self._tracks.get(pid)
        return max(track.gaps) if track is not None and track.gaps else None

    def idle_for(self, pid: int, now: float) -> float | None:
        """Seconds since the rank last showed progress; None if never watched."""
        track = self._tracks.get(pid)
        return None if track is None else now - track.progress_at

    def observed_for(self, pid: int, now: float) -> float:
        track = self._tracks.get(pid)
        return 0.0 if track is None else now - track.first_seen

    def forget_except(self, pids: set[int]) -> None:
        """Forget every PID not in ``pids`` (ranks no longer in the evidence: restarted, gone)."""
        for pid in [p for p in self._tracks if p not in pids]:
            del self._tracks[pid]


class CompletedCollectives:
    """Per rank and process group, the last completed collective seen in the Flight Recorder."""

    def __init__(self) -> None:
        self._done: dict[tuple[int, str], int] = {}

    def advanced(self, state: CollectiveState | None) -> set[int]:
        """Ranks whose completed collectives advanced since the previous state (first sight: none)."""
        moved: set[int] = set()
        for row in state.ranks if state is not None else ():
            if row.last_completed is None:
                continue
            key = (row.rank, row.pg)
            if key in self._done and row.last_completed > self._done[key]:
                moved.add(row.rank)
            self._done[key] = max(row.last_completed, self._done.get(key, row.last_completed))
        return moved
