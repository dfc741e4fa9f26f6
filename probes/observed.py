"""The evidence records: what was read about each rank and about the job, before any judgement.

``read/`` (and the schedulers over it: ``live.py``, ``remote/``, ``evidence/``) fill these in;
``judge/judgement.py`` turns them into ranks' states, groups and the verdict. Both sides import
this module and neither imports the other.

Adding a collective-state source: one module in ``read/collectives/sources/`` (its ``Source.field`` names
the field) and one field of :class:`ObservedJob`. A field holding a ``CollectiveState`` is
combined with the others for the judge (:meth:`ObservedJob.collective_state`); raw evidence that
must be judged across polls (NCCL RAS) adds one judge module too.
"""

from __future__ import annotations

import dataclasses
import operator
from dataclasses import dataclass, field
from typing import Any, NamedTuple, TypeVar

from .errors import TrainwatchError
from .snapshot import (CollectiveState, ExitInfo, Job, KernelState, LogActivity, Phase, Rank, RankCollective, RankGpu,
                       RasState, Snapshot, State, ThreadStack)

from .record import Record

T = TypeVar("T")

SIGNAL_REASONS = {"SIGSEGV": "segmentation fault", "SIGBUS": "bus error", "SIGABRT": "aborted",
                  "SIGFPE": "floating point exception", "SIGILL": "illegal instruction"}
# How a dead job's rank ended, when the files it left do not say (a dump, no log line about its end).
UNTOLD = "how it ended is not in these files"
# An armed rank (`trainwatch run`) that left no last words, exception or fault trace: its hook hears
# SIGTERM, SIGINT, an uncaught exception and a fatal signal, so none of them ended it. A cause.
SILENT = ("ended leaving no word although armed: no stop signal, exception or fatal signal ended it "
          "(a SIGKILL, its own, a person's or the OOM killer's, or os._exit)")
FrameInts = dict[int, dict[str, int]]  # main-thread frame index (innermost = 0) -> {allowed name: value}


@dataclass(frozen=True, repr=False)
class ThreadCounters(Record):
    """Scheduler counters of one thread; unchanged counters mean the thread did not run (the
    times are left out of that comparison)."""

    cpu_ticks: int
    voluntary: int
    involuntary: int
    # When read (CLOCK_MONOTONIC), and the kernel's nanoseconds on a CPU and waiting for one
    # (/proc/.../schedstat; run_ns from cpu_ticks and queued_ns None where the kernel keeps none).
    # Between two readings they say how much of that time the thread was runnable (judge/progress.py).
    at_ns: int | None = field(default=None, compare=False)
    run_ns: int | None = field(default=None, compare=False)
    queued_ns: int | None = field(default=None, compare=False)
    syscall: str | None = field(default=None, compare=False)  # the one it was in when read (None: running, none)
    # (thread ID, voluntary switches) of a few of the process's quietest other threads, read with it:
    # their wake-ups are what a pause of the whole process from outside does (judge/progress.py).
    others: tuple[tuple[int, int], ...] = field(default=(), compare=False)


@dataclass(frozen=True, repr=False)
class SharedStill(Record):
    """What another trainwatch process on this node established of a rank: that it made no progress
    from ``since`` to ``until`` (unix times), and, per kind of the job's own evidence, since when
    that evidence said so (``kinds``: (kind, since, words with ``{age}``)). Read from the node's
    runtime folder (``read/processes/stillness.py``)."""

    since: float
    until: float
    kinds: tuple[tuple[str, float, str], ...] = ()
    by: int | None = None  # the trainwatch process that wrote it
    # Its last reading of the rank's thread, and a digest of the stack it saw then: a later look that
    # finds the same stack and no wake-up but those pauses explain joins on (judge/judgement.py).
    counters: ThreadCounters | None = None
    signature: str | None = None
    # The rank's I/O (``rchar + wchar`` of /proc/PID/io) at ``until``: a rank that read or wrote since
    # (a collective's bytes over gloo, a batch from its DataLoader) ran on, whatever its counters say.
    io: int | None = None


@dataclass(frozen=True, repr=False)
class FirstLook(Record):
    """The sampler's first look at a rank, before any dump of its own woke it: what the job had
    been doing before trainwatch looked."""

    at: float  # unix time
    counters: ThreadCounters | None = None  # its thread's counters, read just before the first dump
    signature: str | None = None  # a digest of the stack that dump read
    asleep_since: float | None = None  # since when the kernel had the thread asleep without running once
    asleep_in: str | None = None  # in what: "futex()"
    io: int | None = None  # the rank's rchar + wchar then (see ``SharedStill.io``)


@dataclass(frozen=True, repr=False)
class StackSample(Record):
    """One py-spy dump of a rank between two reads of its counters (or why there is none)."""

    pid: int
    threads: tuple[ThreadStack, ...] | None  # None: could not sample
    before: ThreadCounters | None
    after: ThreadCounters | None
    error: TrainwatchError | None = None
    reused: bool = False  # no py-spy call: the previous stacks were kept (see ProgressTracker.needs_dump)
    gone: bool = False
    ints: FrameInts | None = None  # step-like integer locals when read with --locals (see probes/judge/steps.py)
    at: float | None = None  # unix time of the py-spy call (the middle of it)
    read: str | None = None  # how it was read when not by a pausing attach: "without pausing (…why…)"
    kernel: KernelState | None = None  # the kernel's view of its main thread just before the dump



@dataclass(frozen=True, repr=False)
class ObservedRank(Record):
    """One rank as read in one poll.

    ``seen``: ``exited`` or ``missing`` when read so; ``stuck``/``running`` when the state was
    judged where the rank was sampled (a bundle, another node's snapshot); ``unknown`` for a live
    rank whose progress the judge's memory decides. The classification fields (phase, op, where,
    user_frame, detail, native) describe ``threads`` (``judge.phases.classify``)."""

    rank: int | None
    pid: int | None = None
    host: str = ""
    local_rank: int | None = None
    seen: State = "unknown"
    phase: Phase = "unknown"
    op: str | None = None
    where: str | None = None
    user_frame: str | None = None
    detail: str | None = None
    native: bool = False
    threads: tuple[ThreadStack, ...] = ()
    stuck_for_s: float | None = None  # as reported along with ``seen`` (bundles, other nodes)
    stuck_source: str | None = None  # what says how long (as reported along with ``seen``)
    sampled: bool = True  # False: this poll's sample failed (py-spy error); progress is not judged
    cpu_pct: float | None = None
    rss_bytes: int | None = None
    gpu: RankGpu | None = None
    exit: ExitInfo | None = None  # how it ended, or (alive) the exception its log shows
    children: tuple[int, ...] = ()
    dataloader_worker: str | None = None  # its busy DataLoader worker and where, read when the judge asked
    waits_for: str | None = None  # as reported (bundles, other nodes); the judge words it again (judge/waits.py)
    log_path: str | None = None
    step: int | None = None
    step_period_s: float | None = None
    step_held_s: float | None = None  # how long the current step is known to have lasted (read/… steps clock)
    log: LogActivity | None = None  # growth of the file at log_path
    log_tail: tuple[str, ...] | None = None  # the telling end of that log, secrets masked (read/logs/ranklog.py)
    collective_timeout_s: float | None = None  # from the rank's environment
    kernel: KernelState | None = None  # the kernel's view of its main thread (read/processes/kernel_view.py)
    container_pid: int | None = None  # its PID in its own PID namespace (a container's), when not ours
    scheduler: str | None = None  # what Kubernetes says of the pod that should run it (never ran, died)
    longest_quiet_s: float | None = None  # as reported (bundles, other nodes); live: the judge's memory
    # Live ranks: when the readers saw it progress this poll (stacks, log, storage), and since when it
    # is watched; the judge's memory of its progress takes them in (judge/progress.py).
    progress_seen: tuple[float, ...] = ()
    watched_since: float | None = None
    # Live ranks: the sampler's first look at it (how long it had waited before trainwatch looked).
    first_look: FirstLook | None = None
    # What another trainwatch process on this node had established of it when this one first looked.
    still_elsewhere: SharedStill | None = None

    def as_rank(self, state: State, stuck_for_s: float | None, stuck_source: str | None = None) -> Rank:
        """The snapshot's rank record for this evidence in ``state``."""
        values = dict(zip(_RANK_FIELDS, _rank_values(self)))
        values["state"], values["stuck_for_s"], values["stuck_source"] = state, stuck_for_s, stuck_source
        return _frozen(Rank, values)



# -- NCCL RAS (read/collectives/ras.py asks, read/collectives/ras_report.py parses, judge/ras.py judges) -----------------------
ANY_OP = "collective"  # NCCL < 2.26 counts every collective together


class RasReportRank(NamedTuple):
    """One rank of one communicator as RAS saw it (a tuple: big jobs have thousands)."""

    rank: int  # rank within the communicator
    host: str = ""  # the rank's node as RAS prints it (its IP address)
    pid: int | None = None
    cuda_dev: int | None = None
    nvml_dev: int | None = None
    counts: tuple[tuple[str, int], ...] = ()  # (operation, collectives launched), ops RAS reported
    status: str = "ok"  # ok, nocomm (answered RAS, not a member of the communicator), unreachable, dead
    error: str | None = None  # an initialization or asynchronous NCCL error
    comm_status: str | None = None  # the communicator on that rank: abort, finalize, init; None: running


class CountGroup(NamedTuple):
    """Text format: ``26 ranks have launched up to operation 6650`` (for one operation type)."""

    op: str
    count: int
    ranks: int


@dataclass(frozen=True, repr=False)
class RasComm(Record):
    """One communicator in an NCCL RAS report."""

    hash: str  # hex without 0x, as NCCL logs it
    size: int | None = None  # ranks in the communicator
    ranks: tuple[RasReportRank, ...] = ()  # JSON: every rank; text: the ranks it names
    groups: tuple[CountGroup, ...] = ()  # text only
    complete: bool = False  # ranks lists every rank with its counts (JSON)
    problems: tuple[str, ...] = ()  # text: MISMATCH, INCOMPLETE, ERROR


@dataclass(frozen=True, repr=False)
class RasProcess(Record):
    """A process NCCL RAS reports dead or unreachable: its PID, host and GPUs."""

    pid: int | None
    host: str
    gpus: str = ""


@dataclass(frozen=True, repr=False)
class RasReport(Record):
    """One NCCL RAS reply, parsed: its communicators and what it said of them."""

    format: str  # "json" or "text"
    nccl_version: str | None = None
    comms: tuple[RasComm, ...] = ()
    dead: tuple[RasProcess, ...] = ()  # text DEAD section
    unreachable: tuple[RasProcess, ...] = ()  # text INCOMPLETE section (job processes)
    timeouts: int = 0
    healthy_groups: int = 0  # text: communicator groups whose table row says OK
    notes: tuple[str, ...] = field(default=())
    processes: int | None = None  # text job summary: the job's processes in total (RAS's whole job)
    per_node: tuple[int, ...] = ()  # text job summary: the distinct counts of processes per node
    unnamed: tuple[int, ...] = ()  # ranks NCCL listed with "[process information not found]"

    def pids(self) -> set[int]:
        """Every process ID the report names."""
        return {pid for _, pid in self.processes_named()}

    def processes_named(self) -> set[tuple[str, int]]:
        """Every (host, PID) the report names."""
        found = {(r.host, r.pid) for c in self.comms for r in c.ranks if r.pid is not None}
        return found | {(p.host, p.pid) for p in (*self.dead, *self.unreachable) if p.pid is not None}


@dataclass(frozen=True, repr=False)
class ObservedRas(Record):
    """One NCCL RAS reply of this job (another job's is not one): when it was asked, and the
    node names its host addresses stand for where known (this node's)."""

    origin: str  # host:port asked
    at: float  # unix time it was asked
    report: RasReport | None = None  # None: the job's RAS gave nothing usable this time
    names: tuple[tuple[str, str], ...] = ()  # (address, node name)
    caveat: str | None = None  # why the report could not be matched to this job for sure (kept, labelled)


@dataclass(frozen=True, repr=False)
class ObservedJob(Record):
    """Everything read about one job in one poll: the ranks, and every collective-state source.

    Each collective-state source fills one field (``read/collectives/sources/<module>.py``); a field holding
    a ``CollectiveState`` joins the others for the judge (:meth:`collective_state`, earlier
    fields first). ``collectives``: the Flight Recorder's view (``flight_recorder.py``: hook,
    dump files, pipe, debug server; read back from a snapshot: every source's, combined).
    ``ras``: NCCL RAS's recent replies, oldest first (``nccl_ras.py``): judging them takes memory
    across polls, so they are raw evidence, not a ``CollectiveState`` (``judge/ras.py``; the
    judged state joins the collective state as ``CollectiveState.ras``); empty: none this poll.
    ``unsampled``: why no rank could be sampled at all (py-spy missing), or None. ``ras_views``:
    the RAS states other nodes judged (a merged view); the judge picks the one that counts."""

    job: Job
    ranks: tuple[ObservedRank, ...] = ()
    collectives: CollectiveState | None = None
    unsampled: str | None = None
    ras: tuple[ObservedRas, ...] = ()
    watchdog: CollectiveState | None = None  # the NCCL watchdog's timeout lines in the ranks' logs
    # Merged views: each node's NCCL RAS state as that node judged its replies, (node, state).
    ras_views: tuple[tuple[str, RasState], ...] = ()

    def collective_state(self) -> CollectiveState | None:
        """Every collective-state source of this poll as one state (:func:`combine_states`)."""
        return combine_states([value for f in dataclasses.fields(self)
                               if isinstance(value := getattr(self, f.name), CollectiveState)])


def combine_states(states: list[CollectiveState | None]) -> CollectiveState | None:
    """Several collective states as one: each (rank, process group) row from the first state that
    has it, the sources joined with ``+``, the first NCCL RAS state. Where the rows disagree is
    judged afresh (``judge/collectives.py``), so no state's own finding is kept."""
    present = [s for s in states if s is not None]
    if len(present) <= 1:
        return present[0] if present else None
    rows: dict[tuple[int, str], RankCollective] = {}
    for state in present:
        for row in state.ranks:
            rows.setdefault((row.rank, row.pg), row)
    return CollectiveState(source="+".join(dict.fromkeys(s.source for s in present)),
                           ranks=tuple(sorted(rows.values(), key=lambda r: (r.rank, r.pg))),
                           ras=next((s.ras for s in present if s.ras is not None), None))


def observed_rank(rank: Rank) -> ObservedRank:
    """A judged rank (from a snapshot) read back as evidence: its state is what was reported."""
    values = dict(_OBSERVED_DEFAULTS)
    values.update(zip(_OBSERVED_FIELDS, _observed_values(rank)))
    values["seen"] = rank.state
    return _frozen(ObservedRank, values)


def _frozen(cls: type[T], values: dict[str, Any]) -> T:
    """An instance of the frozen dataclass ``cls`` holding ``values`` (every one of its fields),
    built without its ``__init__``: a merged view turns thousands of ranks into evidence and back
    each poll, and a frozen ``__init__`` sets each of ~30 fields through ``object.__setattr__``
    (7 µs a rank, a third of merging 8,192 ranks). Neither class has a ``__post_init__``."""
    built = object.__new__(cls)
    built.__dict__.update(values)
    return built


# Field names looked up once: merged views turn thousands of ranks into evidence and back each poll.
_RANK_FIELDS = tuple(f.name for f in dataclasses.fields(Rank) if f.name not in ("state", "stuck_for_s", "stuck_source"))
_OBSERVED_FIELDS = tuple(f.name for f in dataclasses.fields(ObservedRank)
                         if f.name not in ("seen", "sampled", "progress_seen", "watched_since", "first_look",
                                      "still_elsewhere"))
_OBSERVED_DEFAULTS = {f.name: f.default for f in dataclasses.fields(ObservedRank)
                      if f.name not in _OBSERVED_FIELDS and f.name != "seen"}  # plain values, no factories
_rank_values = operator.attrgetter(*_RANK_FIELDS)  # all of them in one call: thousands of ranks a poll
_observed_values = operator.attrgetter(*_OBSERVED_FIELDS)


def observed_snapshot(snapshot: Snapshot) -> ObservedJob:
    """A snapshot read back as evidence (bundles, other nodes, ``watch``): to be judged again."""
    return ObservedJob(job=snapshot.job, ranks=tuple(observed_rank(r) for r in snapshot.ranks),
                       collectives=snapshot.collectives)


def abnormal(info: ExitInfo | None) -> bool:
    """A crash: a signal, a non-zero exit code, or a rank reaped unseen whose evidence says why.
    A rank reaped with no evidence at all is taken as a normal exit, not invented as a crash."""
    if info is None:
        return False
    if info.signal is not None:
        return True
    if info.code is not None:
        return info.code != 0
    return bool(info.reason or info.message or info.frame)
