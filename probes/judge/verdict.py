"""One verdict over all ranks: healthy, straggler, mismatch, hang, rendezvous or crashed."""

from __future__ import annotations

from dataclasses import replace
from typing import Mapping, Sequence

from . import exits
from .aborts import abort_cause
from .collectives import disagreements
from .exits import raised_while_alive
from .gpuwait import judge_gpu_wait, span
from .groups import group_key
from .kernel import from_kernel
from .native import AMBIGUOUS_PHASES
from .rendezvous import launcher_waiting, never_joined, never_scheduled
from .restarts import with_restarts
from .steps import step_note
from ..observed import UNTOLD
from ..snapshot import PROBLEM_VERDICTS, UNJUDGED_VERDICTS, CollectiveState, Job, Phase, Rank, Verdict, VerdictKind, age_text, who


def verb(ranks: Sequence, singular: str, plural: str) -> str:
    return singular if len(ranks) == 1 else plural


# Phases in which a rank waits for its peers: in a collective, or (NCCL) blocked on its GPU behind one.
PEER_WAITS: frozenset[Phase] = frozenset({"collective", "gpu_wait"})
# Places whose Python line cannot say what a thread asleep there waits for (the ones a native sample
# is taken for, judge/native.py; "native" is a place a native sample already named): DDP's gradient
# all_reduce waits inside ``backward``, an async collective's ``work.wait()`` reads as a lock. Where
# no native sample was read, the wait is unnamed, not the rank's own work.
UNNAMED_WAITS: frozenset[Phase] = AMBIGUOUS_PHASES - {"native"}


def place(rank: Rank) -> str:
    """Where a rank sits, in words: ``all_reduce at train.py:44 sync_gradients``."""
    what = rank.op if rank.phase == "collective" and rank.op else rank.phase
    if rank.phase == "dataloader":
        what = "the DataLoader"
    elif rank.phase == "gpu_wait":
        what = f"a GPU wait ({rank.op})" if rank.op else "a GPU wait"
    return f"{what} at {rank.where}" if rank.where else what


def waits(ranks: Sequence[Rank], collectives: CollectiveState | None = None, now: float | None = None) -> str:
    """What waiting ranks do, in words: ``waits on its GPU (item()) at train.py:100 behind all_reduce #5``."""
    lead = ranks[0]
    if lead.phase == "gpu_wait":
        own = "its" if len(ranks) == 1 else "their"
        text = f"{verb(ranks, 'waits', 'wait')} on {own} GPU" + (f" ({lead.op})" if lead.op else "")
        text += f" at {lead.where}" if lead.where else ""
    else:
        text = f"{verb(ranks, 'waits', 'wait')} in {place(lead)}"
    extra = behind(lead.rank, collectives, now) if lead.rank is not None and now is not None else None
    return f"{text} {extra}" if extra else text


def by_place(ranks: Sequence[Rank]) -> list[list[Rank]]:
    """Ranks grouped as the stack groups are (phase, op, where), biggest group first, then lowest rank."""
    groups: dict[tuple, list[Rank]] = {}
    for rank in ranks:
        groups.setdefault(group_key(rank), []).append(rank)
    return sorted(groups.values(), key=lambda g: (-len(g), min(_numbers(g), default=0)))


def each_at(ranks: Sequence[Rank], stuck: bool = False) -> str:
    """Each group of ranks by its own place, and what it waits for where that is known: ``rank 2 at
    cb.py:9 upload waits for its child process PID 812 `sleep 3600` (running 41 s); rank 3 is
    missing`` (``rank 2 is stuck in sleep at …`` with ``stuck``)."""
    parts = []
    for group in by_place(ranks):
        for lead, members in _by_waited(group):
            if lead.state == "missing":
                parts.append(f"{who(_numbers(members))} {verb(members, 'is', 'are')} missing")
            elif lead.exit is not None and lead.phase == "unknown" and not lead.where:  # dead, its last place unknown
                parts.append(f"{who(_numbers(members))} left no record of where {verb(members, 'it', 'they')} "
                             f"{verb(members, 'was', 'were')} ({exits.how(lead.exit)})")
            elif lead.waits_for:
                at = f" at {lead.where}" if lead.where else ""
                parts.append(f"{who(_numbers(members))}{at} {verb(members, 'waits', 'wait')} for {lead.waits_for}")
            else:
                where = f"{'stuck ' if stuck else ''}in {place(lead)}"
                parts.append(f"{who(_numbers(members))} {verb(members, 'is', 'are')} {where}")
    return "; ".join(parts)


def _by_waited(group: list[Rank]) -> list[tuple[Rank, list[Rank]]]:
    """A place's ranks split by what each waits for (two ranks at one line may wait for two children)."""
    split: dict[str | None, list[Rank]] = {}
    for rank in group:
        split.setdefault(rank.waits_for, []).append(rank)
    return [(members[0], members) for members in split.values()]


def _without(ranks: Sequence[Rank], drop: Sequence[Rank]) -> list[Rank]:
    """``ranks`` less the very objects in ``drop`` (by identity: equality would compare whole stacks)."""
    gone = {id(r) for r in drop}
    return [r for r in ranks if id(r) not in gone]


def _numbers(ranks: Sequence[Rank]) -> list[int]:
    return sorted(r.rank for r in ranks if r.rank is not None)


def abnormal(rank: Rank) -> bool:
    """An exited rank whose exit was a crash (see ``exits.abnormal``)."""
    return rank.state == "exited" and exits.abnormal(rank.exit)


def judge(ranks: Sequence[Rank], job: Job | None = None,
          collectives: CollectiveState | None = None, familiar: Mapping[int, frozenset[str]] | None = None,
          now: float | None = None, before: Verdict | None = None) -> Verdict:
    """The verdict and its culprits over judged ranks (``judgement.judge_job`` calls it).

    ``familiar``: per rank, the places (``where``) it was seen at while making progress; it breaks
    ties between ranks that wait in different places (a place nobody else ever visited is the odd one).
    ``now``: the time the ranks were observed, for the age of pending collectives.
    ``before``: the verdict of the last earlier look that found a rank alive, if there was one.
    """
    familiar = familiar or {}
    verdict = (_ended_while_hung(ranks, collectives, familiar, now, job, before) or _crashed(ranks, collectives)
               or _rendezvous(ranks, job)
               or from_kernel(ranks, lambda waiting: waits(by_place(waiting)[0], collectives, now),
                              lambda others: each_at(others, stuck=True), now=now)
               or _from_collectives(ranks, collectives, familiar, now)
               or _from_ras(ranks, collectives, familiar, now) or _from_stacks(ranks, collectives, familiar, now))
    # Which ranks are at another step; not said of a healthy job (ranks read a few ms apart straddle steps).
    note = step_note(ranks) if verdict.kind in PROBLEM_VERDICTS else None
    verdict = replace(verdict, summary=f"{verdict.summary}; {note}") if note else verdict
    return with_restarts(verdict, ranks, job, now)  # a restarted job's earlier attempts are its history


def _crashed(ranks: Sequence[Rank], collectives: CollectiveState | None = None) -> Verdict | None:
    exited = [r for r in ranks if r.state == "exited"]
    if exited and len(exited) == len(ranks) and not any(abnormal(r) for r in exited):
        return Verdict("healthy", (), f"job finished: all {len(exited)} ranks exited normally")
    # A rank that raised and lingers (a non-daemon thread keeps its process) is as dead as one that exited.
    dead = [r for r in exited if abnormal(r)] + [r for r in ranks if raised_while_alive(r)]
    if not dead:
        return None
    # A library failed ranks over calls that disagree: the culprit is the odd call's rank, not its witness.
    cause = abort_cause(ranks, collectives)
    if cause is not None:
        others = [r for r in dead if r.rank not in cause.culprits and r.rank != cause.witness]
        text = cause.text + (f"; {who(_numbers(others))} then ended too" if others else "")
        return Verdict("crashed", cause.culprits, text)
    first = [r for r in dead if r.exit and r.exit.first]
    # Ranks that ended because another did (a lost peer, the launcher's teardown) are never culprits beside it.
    deaths = [r.exit for r in dead if r.exit]
    cause = [r for r in dead if r.exit and exits.is_cause(r.exit, deaths)][:1]
    culprits = first or cause or sorted(dead, key=lambda r: (r.exit.at or 0) if r.exit else 0)[:1]
    lead = culprits[0]
    if lead.exit is not None and lead.exit.source == exits.KUBERNETES:  # a pod died: every rank it ran
        culprits = [r for r in dead if r.exit is not None and r.exit.source == exits.KUBERNETES
                    and r.exit.message == lead.exit.message]
    numbers = _numbers(culprits)
    if raised_while_alive(lead):
        text = f"{who(numbers)} raised {_raised(lead)}"
    else:
        if lead.exit and lead.exit.reason == exits.VANISHED and lead.exit.message:
            text = f"{who(numbers)} {lead.exit.message}"
        else:
            text = f"{who(numbers)} died: {exits.describe_exit(lead.exit) if lead.exit else 'exited'}"
        if lead.where:
            text += f" (last seen in {place(lead)})"
    others = _without(dead, culprits)
    if others:
        text += f"; {who(_numbers(others))} then ended too"
    return Verdict("crashed", tuple(numbers), text)


def _ended_while_hung(ranks: Sequence[Rank], collectives: CollectiveState | None,
                      familiar: Mapping[int, frozenset[str]], now: float | None, job: Job | None = None,
                      before: Verdict | None = None) -> Verdict | None:
    """A job that is over, where no rank died of a cause of its own: each ended by a teardown
    (SIGTERM from a launcher, ``timeout`` or SLURM), a collective timeout, which follow a hang, or
    a stop from outside (every rank killed at one moment; the launcher saying it was signalled).
    The ranks are judged where they were when they ended (their last stacks, their pending
    collectives), as stuck ranks of a live job are; a rank that left nothing is missing, and a
    rank that had exited normally is absent from the collective the others waited in. A job
    stopped while every rank made progress was stopped, not crashed: healthy. So is one stopped
    from outside after a look that found it healthy (``before``) and with no rank seen stuck since:
    a lockstep job's ranks wait for each other every step, so where each last was (one in its
    sleep, one in all_reduce) says nothing of a hang that no look saw."""
    over = ranks and all(r.state in ("exited", "missing") for r in ranks)
    dead = [r for r in ranks if r.state == "exited" and abnormal(r)]
    infos = [d.exit for d in dead if d.exit]
    if not over or not dead or (any(exits.is_cause(info, infos) for info in infos)
                                and not exits.killed_together(infos)):
        return None
    ended = exits.how_they_ended(infos)
    stop = f"was stopped by {job.stopped_by}" if job is not None and job.stopped_by else f"ended ({ended})"
    if (before is not None and before.kind == "healthy" and not any(r.stuck_for_s is not None for r in dead)
            and not any(info.reason in exits.WAITED for info in infos)):  # its own end says it waited: no
        return Verdict("healthy", (), f"the job {stop} while its ranks made progress: no rank failed")
    held = [_as_left(r, collectives, now) for r in ranks]
    if not any(r.state == "stuck" and r.phase in PEER_WAITS for r in held) and not (collectives and collectives.divergence):
        if all(r.exit and r.exit.reason == UNTOLD for r in dead):
            return Verdict("unknown", (), "nothing in these files says the job failed (no rank's error, no failure "
                                          "report, no rank's last record waiting on its peers), nor how its ranks "
                                          "ended")
        if all(r.phase == "unknown" for r in dead):
            return Verdict("unknown", (), f"every rank was stopped ({ended}) and none left its stacks or a Flight "
                                          "Recorder trace: nothing shows which one the others waited for (start it "
                                          "with `trainwatch run` to keep each rank's last words)")
        if not any(r.stuck_for_s is not None for r in dead):  # none was stuck when last seen
            return Verdict("healthy", (), f"the job {stop} while its ranks made progress: no rank failed")
        return None
    verdict = _from_collectives(held, collectives, familiar, now) or _from_stacks(held, collectives, familiar, now)
    if verdict.kind in UNJUDGED_VERDICTS:
        return Verdict("hang", (), f"every rank waited on its peers when it ended ({ended}): no rank's last "
                                   "stacks or collectives show which one held the others up")
    return replace(verdict, summary=f"{verdict.summary}; then the job {stop}")


def _as_left(rank: Rank, collectives: CollectiveState | None, now: float | None) -> Rank:
    """A dead rank as it was when it ended: stuck at its last place, or, with no stack, in the
    collective its Flight Recorder shows pending; a rank that had exited normally counts as missing."""
    if rank.state != "exited":
        return rank
    if not abnormal(rank):
        return replace(rank, state="missing")
    if rank.phase == "unknown" and collectives is not None:
        rows = [r for r in collectives.ranks if r.rank == rank.rank and r.pending_seq is not None]
        if rows:
            row = min(rows, key=lambda r: r.pending_seq or 0)
            waited = now - row.pending_since if now is not None and row.pending_since is not None else None
            return replace(rank, state="stuck", phase="collective", op=row.pending_op,
                           stuck_for_s=round(waited, 1) if waited is not None and waited >= 0 else None)
        # Its own end says it waited in a collective (its timeout): its last one, though gloo retires
        # a collective that timed out as if it had completed.
        rows = [r for r in collectives.ranks if r.rank == rank.rank and r.last_enqueued is not None]
        if rows and rank.exit is not None and rank.exit.reason in exits.WAITED:
            row = max(rows, key=lambda r: r.last_enqueued or 0)
            return replace(rank, state="stuck", phase="collective", op=row.op)
    return replace(rank, state="stuck")


def _raised(rank: Rank) -> str:
    """``RuntimeError: boom (main thread exited; kept alive by non-daemon thread 'worker' …)``."""
    info = rank.exit
    what = (exits.headline(info) if info else None) or "an exception"
    if info and info.reason and info.message and info.message not in what:
        what += f" ({info.message})"
    return what + (f" ({rank.detail})" if rank.detail else "")


def _rendezvous(ranks: Sequence[Rank], job: Job | None) -> Verdict | None:
    """The job never formed (``judge/rendezvous.py``): a launcher waiting for nodes, ranks waiting in
    init for ranks elsewhere, or every live rank in init while others never joined."""
    unscheduled = never_scheduled(ranks, place, job)  # a pod Kubernetes never ran: its words
    if unscheduled is not None:
        return unscheduled
    if job is not None and job.waiting_rendezvous:
        return launcher_waiting(job)
    formed = never_joined(ranks, place, job)
    if formed is not None:
        return formed
    live = [r for r in ranks if r.state in ("running", "stuck")]
    missing = [r for r in ranks if r.state == "missing"]
    if live and all(r.phase == "init" and r.state == "stuck" for r in live):
        text = f"{who(_numbers(live))} {verb(live, 'waits', 'wait')} in {place(live[0])}"
        text += f"; {who(_numbers(missing))} never joined" if missing else "; waiting for ranks that have not joined"
        return Verdict("rendezvous", tuple(_numbers(missing)), text)
    return None


def _from_collectives(ranks: Sequence[Rank], state: CollectiveState | None,
                      familiar: Mapping[int, frozenset[str]], now: float | None) -> Verdict | None:
    """Flight Recorder order beats stacks: the first sequence number where the ranks disagree.

    Different collectives under one sequence number are a ``mismatch``, however far the other
    ranks went on enqueueing (an NCCL rank's host runs ahead of its GPU by hundreds of
    collectives; a gloo rank's does not). Ranks that never reached a collective the others
    enqueued are elsewhere: a ``straggler``, and only while some rank is stuck (in a running job
    ranks are a step apart all the time); when the stacks blame the same ranks, their wording
    (where the culprits are) is kept.
    """
    if state is None or not state.divergence:
        return None
    text = f"{state.divergence} ({source_words(state.source)})"
    if not _trailing(state) or _took_another_path(state):
        return Verdict("mismatch", tuple(state.culprits), text)
    if not any(r.state == "stuck" for r in ranks):
        return None
    stacks = _from_stacks(ranks, state, familiar, now)
    if stacks.kind == "straggler" and set(stacks.culprits) == set(state.culprits):
        return stacks
    return Verdict("straggler", tuple(state.culprits), text)


FLIGHT_RECORDER_SOURCES = frozenset({"hook", "flight-recorder-file", "pipe", "debug-server", "flight-recorder",
                                     "last-words"})
SOURCE_NAMES = {"watchdog": "NCCL watchdog timeouts in the logs"}  # others: the source's own name


def source_words(source: str) -> str:
    """Where a divergence was read, in words: ``Flight Recorder, hook+pipe; NCCL watchdog timeouts
    in the logs``."""
    parts = source.split("+")
    recorder = [p for p in dict.fromkeys(parts) if p in FLIGHT_RECORDER_SOURCES]
    words = [f"Flight Recorder, {'+'.join(recorder)}"] if recorder else []
    return "; ".join(words + [SOURCE_NAMES.get(p, p) for p in parts if p not in FLIGHT_RECORDER_SOURCES])


# A RAS finding (probes/judge/ras.py) as a verdict kind (one meaning each: docs/how-trainwatch-decides.md):
# named ranks that hold the others up (behind, unreachable, dead, with an NCCL error or an aborted
# communicator) make a straggler verdict; a rank that left the communicator (NOCOMM, finalizing)
# took another path than the ranks still in it (mismatch); all ranks level and still: a hang below
# the ranks, no rank to blame.
RAS_VERDICTS: dict[str, VerdictKind] = {"behind": "straggler", "mismatch": "mismatch", "unreachable": "straggler",
                                        "dead": "straggler", "error": "straggler", "abort": "straggler",
                                        "left": "mismatch", "level": "hang"}
# Ops RAS does not count: a rank waiting in one makes "all ranks level" say nothing.
_UNCOUNTED_OPS = ("send", "recv", "isend", "irecv", "batch_isend_irecv")


def _from_ras(ranks: Sequence[Rank], state: CollectiveState | None,
              familiar: Mapping[int, frozenset[str]], now: float | None) -> Verdict | None:
    """NCCL RAS's finding, trusted after the Flight Recorder and before the stacks: it sees every
    rank on every node. Only while some local rank is stuck (RAS counts launches, and a healthy
    job is one collective apart all the time); when the stacks blame the same ranks, their
    wording (where the culprits are) is kept."""
    ras = state.ras if state is not None else None
    if ras is None or ras.kind not in RAS_VERDICTS or not ras.finding:
        return None
    stuck = [r for r in ranks if r.state == "stuck"]
    if not stuck:
        return None
    if ras.kind == "level" and any((r.op or "").split(".")[-1] in _UNCOUNTED_OPS for r in stuck):
        return None  # point-to-point waits: RAS's counts cannot see them
    live = [r for r in ranks if r.state in ("running", "stuck")]
    if ras.first_reply and not (live and all(r.state == "stuck" and r.phase in PEER_WAITS for r in live)):
        return None  # counts seen once differ all the time in a running job: only ranks all waiting make it telling
    stacks = _from_stacks(ranks, state, familiar, now)
    if stacks.kind == RAS_VERDICTS[ras.kind] and stacks.culprits and set(stacks.culprits) == set(ras.culprits):
        return stacks
    text = f"{ras.finding} (NCCL RAS)"
    waiting = [r for r in stuck if r.phase in PEER_WAITS and r.rank not in ras.culprits]
    for group in by_place(waiting):
        text += f"; local {who(_numbers(group))} {waits(group, state, now)}"
    return Verdict(RAS_VERDICTS[ras.kind], tuple(ras.culprits), text)


def _took_another_path(state: CollectiveState) -> bool:
    """True when the culprits enqueued another collective than the others under one sequence
    number (they took part in a disagreement), not merely stopped before it."""
    culprits = set(state.culprits)
    return bool(culprits) and any(culprits <= {r for side in found.sides for r in side}
                                  for found in disagreements(state))


def _trailing(state: CollectiveState) -> bool:
    """True when every culprit's last enqueued collective trails another rank's in some group."""
    culprits = set(state.culprits)
    ahead: dict[str, int] = {}  # per process group, the furthest non-culprit
    for row in state.ranks:
        if row.rank not in culprits:
            ahead[row.pg] = max(ahead.get(row.pg, 0), row.last_enqueued or 0)
    trailing = {row.rank for row in state.ranks
                if row.rank in culprits and row.pg in ahead and (row.last_enqueued or 0) < ahead[row.pg]}
    return bool(culprits) and culprits <= trailing


def behind(rank: int, collectives: CollectiveState | None, now: float) -> str | None:
    """What a rank waits behind, from the Flight Recorder: ``behind all_reduce #544 (pending 27 s)``;
    None when it has no pending collective. With several groups pending, the oldest is named."""
    if collectives is None:
        return None
    rows = [r for r in collectives.ranks if r.rank == rank and r.pending_seq is not None]
    if not rows:
        return None
    row = min(rows, key=lambda r: (r.pending_since is None, r.pending_since or 0.0, r.pg))
    text = f"behind {row.pending_op or 'collective'} #{row.pending_seq}"
    if len({r.pg for r in collectives.ranks}) > 1:
        text += f" in process group {row.pg}"
    if row.pending_since is not None and now >= row.pending_since:
        text += f" (pending {age_text(now - row.pending_since)})"
    return text


def _from_stacks(ranks: Sequence[Rank], collectives: CollectiveState | None,
                 familiar: Mapping[int, frozenset[str]], now: float | None) -> Verdict:
    live = [r for r in ranks if r.state in ("running", "stuck")]
    missing = [r for r in ranks if r.state == "missing"]
    stuck = [r for r in live if r.state == "stuck"]
    if not live:
        return Verdict("unknown", (), _none_live(ranks))
    if not stuck:
        text = f"{len(live)} rank{'s' if len(live) != 1 else ''} making progress"
        return Verdict("healthy", (), text + (f"; {who(_numbers(missing))} missing" if missing else ""))
    waiting = [r for r in stuck if r.phase in PEER_WAITS]
    # A rank still moving between collectives is not the one holding the others up, nor is one
    # seen moving in the very wait they are stuck in (it has reached it); any other rank (stuck
    # elsewhere, or running on, on the GPU too) is.
    waiting_ids = {id(r) for r in waiting}
    stuck_at = {group_key(r) for r in waiting}
    elsewhere = [r for r in live if id(r) not in waiting_ids and r.phase != "collective"
                 and group_key(r) not in stuck_at]
    passing = [r for r in live if r.state == "running" and group_key(r) in stuck_at]
    if waiting and passing and not (elsewhere or missing):
        text = (f"{who(_numbers(waiting))} {waits(by_place(waiting)[0], collectives, now)} with no sign of "
                f"progress, while {who(_numbers(passing))} at the same wait {verb(passing, 'shows', 'show')} some: "
                "not called a hang")
        return Verdict("unknown", (), text)
    if waiting and (elsewhere or missing):
        culprits = elsewhere + missing
        text = (f"{each_at(culprits)} while {who(_numbers(waiting))} "
                f"{waits(by_place(waiting)[0], collectives, now)}")
        if passing:  # shown in the table; named here too, or they would read as unaccounted for
            text += f" ({who(_numbers(passing))} at the same wait {verb(passing, 'shows', 'show')} progress)"
        return Verdict("straggler", tuple(_numbers(culprits)), text)
    # a rank not read (its process unreadable, or on a node or pod that could not be read) may be the one
    unread = [r for r in ranks if r.state == "unknown"]
    if waiting and len(waiting) == len(live) and unread:  # never "no local culprit" while a rank is unread
        text = (f"{who(_numbers(waiting))} {waits(by_place(waiting)[0], collectives, now)}; "
                f"{who(_numbers(unread))} could not be read, so {'it' if len(unread) == 1 else 'they'} may be "
                f"what {'it waits' if len(waiting) == 1 else 'they wait'} for (see the notes for why)")
        return Verdict("straggler", tuple(_numbers(unread)), text)  # as a missing rank: unaccounted for
    if waiting and len(waiting) == len(live):
        return _mismatch_or_hang(waiting, collectives, familiar, now)
    culprits = [r for r in stuck if r.phase not in PEER_WAITS]
    unnamed = [r for r in culprits if _wait_unnamed(r)]
    own = _without(culprits, unnamed)
    if len(culprits) == len(live) and unnamed and own:  # those may wait for these: the likely case, said so
        text = (f"{each_at(own, stuck=True)} while {who(_numbers(unnamed))} {verb(unnamed, 'is', 'are')} asleep in "
                f"{place(unnamed[0])} in a wait its Python stack does not name (no native sample was read: "
                "a collective may wait there, as DDP's all_reduce does inside backward)")
        return Verdict("straggler", tuple(_numbers(own)), text)
    text = each_at(culprits, stuck=True)
    if len(culprits) == len(live) and unread:  # never "none holds the others up" while a rank is unread
        they = "it" if len(unread) == 1 else "they"
        text += (f" while {who(_numbers(unread))} could not be read, so whether {they} "
                 f"{verb(unread, 'waits', 'wait')} for {'it' if len(culprits) == 1 else 'them'} is not known "
                 "(see the notes for why)")
        return Verdict("straggler", tuple(_numbers(culprits)), text)
    if len(culprits) == len(live):  # no rank waits for another: none holds the others up, so none is named
        alone = "" if len(live) == 1 else ": every rank is stuck in its own work, none waits for another"
        if unnamed and len(live) > 1:
            alone = (": every rank is asleep in a wait its Python stack does not name (a native sample names it: "
                     "`n` in the live view, or --native)")
        return Verdict("hang", (), text + alone)
    others = _without(live, culprits)
    text += f" while {who(_numbers(others))} {verb(others, 'runs', 'run')} on"
    return Verdict("straggler", tuple(_numbers(culprits)), text)


def _wait_unnamed(rank: Rank) -> bool:
    """Stuck asleep where its Python line cannot say in what (``UNNAMED_WAITS``), with neither a
    native sample nor the kernel's view naming what it waits for."""
    kernel = rank.kernel
    return (rank.phase in UNNAMED_WAITS and not rank.native and rank.waits_for is None
            and kernel is not None and kernel.letter == "S")


def _none_live(ranks: Sequence[Rank]) -> str:
    """Why no rank is judged: none alive (each exited or missing), or none could be read."""
    exited = [r for r in ranks if r.state == "exited"]
    missing = [r for r in ranks if r.state == "missing"]
    if not ranks:
        return "no rank of the job was found in what was read"
    if len(exited) + len(missing) < len(ranks):
        return "no rank could be sampled"
    parts = [f"{who(_numbers(exited))} exited normally"] if exited else []
    parts += [f"{who(_numbers(missing))} {verb(missing, 'is', 'are')} missing"] if missing else []
    return "no rank is running: " + "; ".join(parts)


def _mismatch_or_hang(waiting: list[Rank], collectives: CollectiveState | None,
                      familiar: Mapping[int, frozenset[str]], now: float | None) -> Verdict:
    groups = by_place(waiting)
    secs = min((r.stuck_for_s or 0.0) for r in waiting)
    subject = who(_numbers(waiting)) if len(waiting) == 1 else f"all {len(waiting)} ranks"
    evidence = None
    if all(r.phase == "gpu_wait" for r in waiting) and not any(_pending(r, collectives) for r in waiting):
        # A long GPU step looks the same as a hang: call it one only with evidence (judge/gpuwait.py).
        hang, evidence = judge_gpu_wait(waiting, secs)
        if not hang:
            where = waits(waiting, collectives, now) if len(groups) == 1 else \
                f"wait on their GPUs ({each_at(waiting)})"
            return Verdict("unknown", (), f"{subject} {where} for {span(secs)}; {evidence}")
    tail = f"; {evidence}" if evidence else ""
    if len(groups) == 1:
        text = f"{subject} {waits(waiting, collectives, now)}"
        text += f" for {secs:.0f}s+" if any(r.stuck_for_s is not None for r in waiting) else ""
        return Verdict("hang", (), f"{text}: no local culprit (a peer on another node, or the network){tail}")
    odd = _odd_group(groups, familiar)
    if odd is None:  # no majority and nothing else to go by: say so, blame nobody
        return Verdict("mismatch", (), f"ranks disagree: {each_at(waiting)}{tail}")
    rest = _without(waiting, odd)
    text = f"{each_at(odd)} while {who(_numbers(rest))} {waits(by_place(rest)[0], collectives, now)}"
    return Verdict("mismatch", tuple(_numbers(odd)), text + tail)


def _pending(rank: Rank, collectives: CollectiveState | None) -> bool:
    """A collective source shows this rank's pending collective."""
    return collectives is not None and any(r.rank == rank.rank and r.pending_seq is not None for r in collectives.ranks)


def _odd_group(groups: list[list[Rank]], familiar: Mapping[int, frozenset[str]]) -> list[Rank] | None:
    """The ranks out of step: everyone outside the one biggest group; on a tie for biggest, the one
    group whose place no rank of another group ever visited while making progress; else None."""
    if len(groups[0]) > len(groups[1]):
        return [r for group in groups[1:] for r in group]
    strange = []
    visitors: dict[str, set[int]] = {}  # place -> the ranks that were seen there making progress
    for group in groups:
        for r in group:
            for spot in familiar.get(r.rank, frozenset()) if r.rank is not None else ():
                visitors.setdefault(spot, set()).add(id(group))
    for group in groups:
        spot = group[0].where
        others = any(r.rank is not None for g in groups if g is not group for r in g)
        if spot and others and not visitors.get(spot, set()) - {id(group)}:
            strange.append(group)
    visited = [g for g in groups if not any(g is s for s in strange)]
    if len(strange) == 1 and visited:
        return strange[0]
    return None
