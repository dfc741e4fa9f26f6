"""The one judge: evidence records and the remembered history in; ranks' states, groups and verdict out.

Every verdict trainwatch shows comes from :func:`judge_job`: the live view, ``snapshot``,
``watch``, bundles re-judged with their own Flight Recorder traces, and merged multi-node views.
Pure: no I/O; :class:`JudgeMemory` is plain state the caller keeps between polls.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace

from .collectives import judge_collectives
from .exits import first_to_die
from .groups import group_ranks
from .phases import is_pool_op
from .progress import CompletedCollectives, ProgressTracker, quiet_between
from .ras import RasTracker, across_nodes, progress_pids
from .verdict import judge
from .waits import waits_for
from .warnings import job_warnings
from ..observed import FirstLook, ObservedJob, ObservedRank, SharedStill
from ..snapshot import (HANG_VERDICTS, UNJUDGED_VERDICTS, CollectiveState, Group, RasState, Rank, Snapshot, Verdict,
                        age_text)
from ..record import Record

# Rounding for "enough": a window of samples taken on a schedule ends a little early.
SLACK = 0.95
# Another trainwatch's last dump of a rank comes before its last judgement (``until``): a thread
# asleep since before that has not run since. The slack covers only the two clocks' difference
# (asleep_since is read off the scheduler's task clock): a wider one let a rank that ran a moment
# after the other trainwatch looked (a job resumed with SIGCONT) join a stillness it had left.
ELSEWHERE_SLACK_S = 0.1


@dataclass(repr=False)
class JudgeMemory(Record):
    """What the judge remembers between polls of one job.

    ``progress``: per PID, when each rank last showed progress (the readers' moments in its
    evidence, its completed collectives, RAS counts) and its rhythm;
    ``familiar``: per rank, the places it was seen at while running (breaks ties between groups);
    ``verdict``: the last verdict, so ``since`` says when the current one first held;
    ``alive``: the verdict of the last look that found a rank alive (running or stuck): what the job
    was doing before it ended (a look just after the ranks died, their ends not yet read, says
    "job finished", which is no look at the job)."""

    progress: ProgressTracker = field(default_factory=ProgressTracker)
    completed: CompletedCollectives = field(default_factory=CompletedCollectives)
    ras: RasTracker = field(default_factory=RasTracker)  # NCCL RAS counts of the previous reply
    ras_state: RasState | None = None
    ras_at: float = 0.0  # when the last RAS reply judged was asked for
    familiar: dict[int, frozenset[str]] = field(default_factory=dict)
    verdict: Verdict | None = None
    alive: Verdict | None = None

    @classmethod
    def after(cls, snapshot: Snapshot, familiar: Mapping[int, frozenset[str]] | None = None) -> JudgeMemory:
        """A memory that knows ``snapshot``'s verdict (re-judging a snapshot keeps its ``since``)
        and, when given, the places its source saw each rank at while running (a copy)."""
        alive = snapshot.verdict if any(r.state in ("running", "stuck") for r in snapshot.ranks) else None
        return cls(verdict=snapshot.verdict, alive=alive, familiar=dict(familiar or {}))


@dataclass(frozen=True, repr=False)
class JudgeOptions(Record):
    """``window``: seconds over which progress was sampled (0: not judged); ``stuck_after``: a
    fixed stuck threshold instead of each rank's own rhythm."""

    window: float = 0.0
    stuck_after: float | None = None


@dataclass(frozen=True, repr=False)
class Judgement(Record):
    """The ranks with their states, the groups, the verdict, and the collective state judged with
    (every source's, combined: what the snapshot shows)."""

    ranks: tuple[Rank, ...]
    groups: tuple[Group, ...]
    verdict: Verdict
    collectives: CollectiveState | None = None  # the evidence's, with NCCL RAS's judged state
    warnings: tuple[str, ...] = ()  # about the whole job judged (judge/warnings.py)
    # PIDs of ranks stuck waiting for their DataLoader whose workers were not read: the caller reads
    # them (``dataloader_worker``) and asks again; the answer then explains the rank.
    read_workers: tuple[int, ...] = ()
    # PIDs of stuck ranks blocked on a pipe, FIFO or socket whose other end was not looked for: the
    # caller reads who holds it (``KernelState.peers``) and asks again.
    read_peers: tuple[int, ...] = ()
    notes: tuple[str, ...] = ()  # where the evidence contradicts itself (nodes' RAS views)


def judge_job(evidence: ObservedJob, memory: JudgeMemory, now: float,
              options: JudgeOptions = JudgeOptions()) -> Judgement:
    """Judge one poll's evidence; updates ``memory``."""
    _take_progress(evidence, memory.progress)
    collectives = judge_collectives(evidence.collective_state())
    # Completed collectives that advanced are progress, whatever the stacks showed.
    moved = memory.completed.advanced(collectives)
    for ev in evidence.ranks:
        if ev.rank in moved and ev.pid is not None:
            memory.progress.mark_progress(ev.pid, now)
    collectives = _with_ras(evidence, memory, now, collectives)
    pending = _pending_bounds(collectives)
    _hold_still(evidence, pending, memory.progress, now)
    ranks = _first_to_die([_reported_stillness(rank_state(ev, memory.progress, now, options), pending, now)
                           for ev in evidence.ranks])
    ranks = [_held_up_by_worker(replace(r, waits_for=waits_for(r))) for r in ranks]
    collectives, notes = _with_nodes_ras(evidence, ranks, collectives)
    for rank in ranks:  # where each rank goes while it makes progress: breaks ties between waiting ranks
        if rank.state == "running" and rank.where and rank.rank is not None:
            memory.familiar[rank.rank] = memory.familiar.get(rank.rank, frozenset()) | {rank.where}
    verdict = judge(ranks, evidence.job, collectives, familiar=memory.familiar, now=now, before=memory.alive)
    if verdict.kind in UNJUDGED_VERDICTS:
        verdict = _unjudged(verdict, ranks, evidence.unsampled)
    if memory.verdict is not None and memory.verdict.kind == verdict.kind and memory.verdict.since is not None:
        verdict = replace(verdict, since=memory.verdict.since)
    else:
        verdict = replace(verdict, since=now)
    if verdict.kind in HANG_VERDICTS:  # a hang began when its ranks stopped, not when trainwatch looked
        began = min((now - r.stuck_for_s for r in ranks if r.state == "stuck" and r.stuck_for_s is not None),
                    default=verdict.since)
        verdict = replace(verdict, since=min(verdict.since, began))
    memory.verdict = verdict
    if any(r.state in ("running", "stuck") for r in ranks):
        memory.alive = verdict
    return Judgement(ranks=tuple(ranks), groups=group_ranks(ranks, verdict.culprits), verdict=verdict,
                     collectives=collectives, warnings=job_warnings(evidence.job, ranks, options.window),
                     read_workers=tuple(r.pid for r in ranks if _waits_on_worker(r) and r.dataloader_worker is None),
                     read_peers=tuple(r.pid for r in ranks if _peers_unread(r)), notes=tuple(notes))


def _take_progress(evidence: ObservedJob, progress: ProgressTracker) -> None:
    """The readers' moments of progress join the memory; ranks no longer in the evidence leave it."""
    for ev in evidence.ranks:
        if ev.pid is not None and ev.watched_since is not None:
            progress.watch(ev.pid, ev.watched_since)
            for at in ev.progress_seen:
                progress.mark_progress(ev.pid, at)
            if not ev.progress_seen and ev.sampled:
                progress.saw_still(ev.pid)
    progress.forget_except({ev.pid for ev in evidence.ranks if ev.pid is not None})


def _pending_bounds(collectives: CollectiveState | None) -> dict[int, tuple[float, str]]:
    """Per rank, since when its Flight Recorder shows it waiting on the collective it enqueued last
    (none enqueued since), and the words for it with ``{age}``."""
    pending: dict[int, tuple[float, str]] = {}
    for row in collectives.ranks if collectives is not None else ():
        if row.pending_since is not None and row.pending_seq is not None and row.pending_seq == row.last_enqueued:
            what = f"{row.pending_op or 'collective'} #{row.pending_seq} pending {{age}}"
            if row.rank not in pending or row.pending_since < pending[row.rank][0]:
                pending[row.rank] = (row.pending_since, what)
    return pending


def _hold_still(evidence: ObservedJob, pending: dict[int, tuple[float, str]], progress: ProgressTracker,
                now: float) -> None:
    """What the job's own evidence says of how long each rank has made no progress, for the ranks
    the judge has seen none from yet (``ProgressTracker.hold_still``): its thread asleep without
    running once when first looked at (the kernel), the collective it enqueued last and still waits
    for (the Flight Recorder), the last time its own log grew."""
    for ev in evidence.ranks:
        if ev.pid is None or ev.seen != "unknown":
            continue
        first = ev.first_look
        if first is not None and first.asleep_since is not None:
            progress.hold_still(ev.pid, first.asleep_since, "kernel", f"asleep in {first.asleep_in} for {{age}}")
        if first is not None and ev.still_elsewhere is not None and _joins(ev.still_elsewhere, first):
            for kind, since, words in ev.still_elsewhere.kinds:
                progress.hold_still(ev.pid, since, kind, words)
            progress.hold_still(ev.pid, ev.still_elsewhere.since, "elsewhere", "seen still by another trainwatch for {age}")
        if ev.rank is not None and ev.rank in pending:
            progress.hold_still(ev.pid, pending[ev.rank][0], "collective", pending[ev.rank][1])
        if ev.log is not None and ev.log.own and ev.log.age_s is not None:
            progress.hold_still(ev.pid, now - ev.log.age_s, "log", "last output {age} ago")


def _joins(other: SharedStill, first: FirstLook) -> bool:
    """Whether what another trainwatch process on this node established of a rank (no progress from
    its ``since`` to ``until``) reaches this one's first look, so that the rank has made no progress
    since the other's ``since`` (``read/processes/stillness.py``): the first look found its thread
    asleep since before that ``until``; or the same stack as the other's last look and, since that
    look, no byte read or written, no wake-up but those pauses from outside explain (py-spy, gdb,
    ...) and hardly any CPU."""
    if first.asleep_since is not None and first.asleep_since <= other.until + ELSEWHERE_SLACK_S:
        return True
    if other.counters is None or first.counters is None or other.signature != first.signature:
        return False
    if other.io is not None and first.io is not None and first.io != other.io:
        # It read or wrote since: a job that ran on (a rank that checkpoints every few steps, the
        # others back in the same all_reduce each time) looks like pauses from outside when every
        # other thread of the rank works each step too (gloo's), but pauses move no bytes.
        return False
    return quiet_between(other.counters, first.counters)


def _reported_stillness(rank: Rank, pending: dict[int, tuple[float, str]], now: float) -> Rank:
    """A rank judged stuck where it was read (a bundle, another node), held against the Flight
    Recorder state it is judged with now: a pending collective older than the reported time
    reaches further back, as it does for a live rank."""
    if rank.state != "stuck" or rank.rank not in pending or rank.stuck_for_s is None:
        return rank
    since, what = pending[rank.rank]
    if since >= now - rank.stuck_for_s:
        return rank
    words = what.format(age=age_text(now - since))
    source = words if not rank.stuck_source or rank.stuck_source.startswith("since trainwatch") else \
        f"{rank.stuck_source}; {words}"
    return replace(rank, stuck_for_s=round(now - since, 1), stuck_source=source)


def _waits_on_worker(rank: Rank) -> bool:
    """Stuck waiting for a worker process of its own: its DataLoader's, or a ``multiprocessing`` Pool's."""
    waits = rank.phase == "dataloader" or (rank.phase == "subprocess" and is_pool_op(rank.op))
    return rank.state == "stuck" and waits and bool(rank.children) and rank.pid is not None


def _peers_unread(rank: Rank) -> bool:
    """A stuck rank blocked on a pipe, FIFO or socket whose other end is not read yet, or waiting in
    ``subprocess`` for a child the kernel did not name (a sleep loop with a timeout)."""
    kernel = rank.kernel
    if rank.state != "stuck" or rank.pid is None or kernel is None or kernel.peers_known:
        return False
    return kernel.target_kind in ("pipe", "fifo", "socket") or (rank.phase == "subprocess" and kernel.target_kind is None)


def _held_up_by_worker(rank: Rank) -> Rank:
    """A rank stuck waiting for its DataLoader is explained by the worker that holds it up, once read."""
    return replace(rank, detail=rank.dataloader_worker) if _waits_on_worker(rank) and rank.dataloader_worker else rank


def _with_ras(evidence: ObservedJob, memory: JudgeMemory, now: float,
              collectives: CollectiveState | None) -> CollectiveState | None:
    """NCCL RAS's new replies, each judged against the one before; counts that advanced are
    progress for the local ranks that launched them, like completed collectives. A reply without
    a report (nothing usable, another job's) ends the state. Evidence without replies (bundles,
    other nodes' snapshots) keeps the RAS state it carries."""
    if not evidence.ras:
        return collectives
    pids = {ev.pid for ev in evidence.ranks if ev.pid is not None}
    for seen in sorted(evidence.ras, key=lambda s: s.at):
        if seen.at <= memory.ras_at:
            continue
        memory.ras_at = seen.at
        if seen.report is None:
            memory.ras_state = None
            continue
        memory.ras_state = memory.ras.observe(seen.report, seen.at, seen.origin, local_pids=pids,
                                              names=dict(seen.names), caveat=seen.caveat)
        for pid in progress_pids(memory.ras_state, pids):
            memory.progress.mark_progress(pid, now)
    if memory.ras_state is None:
        return collectives
    return replace(collectives or CollectiveState(source="ras"), ras=memory.ras_state)


def _with_nodes_ras(evidence: ObservedJob, ranks: list[Rank],
                    collectives: CollectiveState | None) -> tuple[CollectiveState | None, list[str]]:
    """A merged view: the RAS state that counts among those the nodes judged, in the nodes' names."""
    if not evidence.ras_views:
        return collectives, []
    chosen, notes = across_nodes(evidence.ras_views, ranks)
    return replace(collectives or CollectiveState(source="ras"), ras=chosen), notes


def rank_state(ev: ObservedRank, progress: ProgressTracker, now: float, options: JudgeOptions) -> Rank:
    """Stuck or running: stuck when the rank showed no progress for its threshold (see
    ``progress``), once it was watched for a whole window. A state judged where the rank was
    sampled (``ev.seen``) stands; an unsampled rank is ``unknown``."""
    if ev.seen != "unknown":
        return ev.as_rank(ev.seen, ev.stuck_for_s, ev.stuck_source)
    idle = progress.idle_for(ev.pid, now) if ev.pid is not None else None
    if (not ev.sampled or idle is None or options.window <= 0
            or progress.observed_for(ev.pid, now) < options.window * SLACK):
        return ev.as_rank("unknown", None)
    threshold = options.stuck_after or progress.threshold(ev.pid, options.window, ev.step_period_s)
    if idle < threshold * SLACK:
        rank = ev.as_rank("running", None)
    else:  # how long: from the job's own evidence where it reaches further back than our watch
        still = progress.still_since(ev.pid, now)
        since = min(still.since, now - idle) if still is not None else now - idle
        rank = ev.as_rank("stuck", round(now - since, 1), still.source if still is not None else None)
    return replace(rank, longest_quiet_s=progress.longest_gap(ev.pid))  # its rhythm, for judge/gpuwait.py


def _first_to_die(ranks: list[Rank]) -> list[Rank]:
    """Mark the one rank whose death (or uncaught exception) came first (``exits.first_to_die``)."""
    first = first_to_die((i, r.exit) for i, r in enumerate(ranks) if r.exit is not None)
    return [r if r.exit is None or r.exit.first == (i == first) else replace(r, exit=replace(r.exit, first=i == first))
            for i, r in enumerate(ranks)]


def _unjudged(verdict: Verdict, ranks: list[Rank], unsampled: str | None) -> Verdict:
    """Say why progress was not judged instead of calling unsampled ranks healthy."""
    if unsampled is not None:
        return Verdict("unknown", (), f"no stacks: {unsampled}")
    live = [r for r in ranks if r.state not in ("exited", "missing")]
    if live and all(r.state == "unknown" for r in live):
        return Verdict("unknown", (), "progress not judged (single sample): the groups show where ranks are")
    return verdict
