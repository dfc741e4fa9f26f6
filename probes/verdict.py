"""One verdict over all ranks: healthy, straggler, mismatch, hang, rendezvous or crashed."""

from __future__ import annotations

from collections import Counter
from typing import Sequence

from trainwatch.probes.flightrec import age_text
from trainwatch.probes.process import JobProcesses
from trainwatch.probes.snapshot import CollectiveState, Job, Rank, Verdict, compact_ranks

TEARDOWN_SIGNALS = frozenset({"SIGTERM", "SIGKILL", "SIGINT", "SIGHUP"})


def who(ranks: Sequence[int]) -> str:
    """``rank 3`` or ``ranks 0-2,5``."""
    return f"rank {ranks[0]}" if len(ranks) == 1 else f"ranks {compact_ranks(ranks)}"


def verb(ranks: Sequence, singular: str, plural: str) -> str:
    return singular if len(ranks) == 1 else plural


def place(rank: Rank) -> str:
    """Where a rank sits, in words: ``all_reduce at train.py:44 sync_gradients``."""
    what = rank.op if rank.phase == "collective" and rank.op else rank.phase
    if rank.phase == "dataloader":
        what = "the DataLoader"
    return f"{what} at {rank.where}" if rank.where else what


def _numbers(ranks: Sequence[Rank]) -> list[int]:
    return sorted(r.rank for r in ranks if r.rank is not None)


def abnormal(rank: Rank) -> bool:
    return rank.state == "exited" and rank.exit is not None and (rank.exit.signal is not None or rank.exit.code != 0)


def judge(ranks: Sequence[Rank], job: Job | JobProcesses | None = None,
          collectives: CollectiveState | None = None) -> Verdict:
    """The verdict and its culprits; pure, so merged multi-node rank lists judge the same way."""
    return (_crashed(ranks) or _rendezvous(ranks, job) or _from_collectives(ranks, collectives)
            or _from_stacks(ranks))


def _crashed(ranks: Sequence[Rank]) -> Verdict | None:
    exited = [r for r in ranks if r.state == "exited"]
    if exited and len(exited) == len(ranks) and not any(abnormal(r) for r in exited):
        return Verdict("healthy", (), f"job finished: all {len(exited)} ranks exited normally")
    dead = [r for r in exited if abnormal(r)]
    if not dead:
        return None
    first = [r for r in dead if r.exit and r.exit.first]
    cause = [r for r in dead if r.exit and r.exit.signal not in TEARDOWN_SIGNALS]
    culprits = first or cause or sorted(dead, key=lambda r: (r.exit.at or 0) if r.exit else 0)[:1]
    numbers = _numbers(culprits)
    lead = culprits[0]
    how = _how_died(lead)
    text = f"{who(numbers)} died: {how}"
    if lead.where:
        text += f" (last seen in {place(lead)})"
    others = [r for r in dead if r not in culprits]
    if others:
        text += f"; {who(_numbers(others))} then ended too"
    return Verdict("crashed", tuple(numbers), text)


def _how_died(rank: Rank) -> str:
    info = rank.exit
    if info is None:
        return "exited"
    parts = [f"killed by {info.signal}" if info.signal else
             (f"exit code {info.code}" if info.code is not None else "exit status not seen")]
    if info.reason:
        parts.append(info.reason)
    if info.frame:
        parts.append(f"in {info.frame}")
    return ", ".join(parts)


def _rendezvous(ranks: Sequence[Rank], job: Job | JobProcesses | None) -> Verdict | None:
    if job is not None and job.waiting_rendezvous:
        return Verdict("rendezvous", (), f"{job.launcher} (PID {job.pid if isinstance(job, Job) else job.root_pid}) "
                       "is waiting in rendezvous: no rank has started on this node yet; other nodes have not joined")
    live = [r for r in ranks if r.state in ("running", "stuck")]
    missing = [r for r in ranks if r.state == "missing"]
    if live and all(r.phase == "init" and r.state == "stuck" for r in live):
        text = f"{who(_numbers(live))} {verb(live, 'waits', 'wait')} in {place(live[0])}"
        text += f"; {who(_numbers(missing))} never joined" if missing else "; waiting for ranks that have not joined"
        return Verdict("rendezvous", tuple(_numbers(missing)), text)
    return None


def _from_collectives(ranks: Sequence[Rank], state: CollectiveState | None) -> Verdict | None:
    """Flight Recorder order beats stacks: the first sequence number where the ranks disagree.

    Different collectives under one sequence number are a ``mismatch``. Ranks that never
    reached a collective the others enqueued are elsewhere: a ``straggler``, and only while
    some rank is stuck (in a running job ranks are a step apart all the time); when the stacks
    blame the same ranks, their wording (where the culprits are) is kept.
    """
    if state is None or not state.divergence:
        return None
    text = f"{state.divergence} (Flight Recorder, {state.source})"
    if not _trailing(state):
        return Verdict("mismatch", tuple(state.culprits), text)
    if not any(r.state == "stuck" for r in ranks):
        return None
    stacks = _from_stacks(ranks)
    if stacks.kind == "straggler" and set(stacks.culprits) == set(state.culprits):
        return stacks
    return Verdict("straggler", tuple(state.culprits), text)


def _trailing(state: CollectiveState) -> bool:
    """True when every culprit's last enqueued collective trails another rank's in some group."""
    culprits = set(state.culprits)

    def trails(rank: int) -> bool:
        for row in state.ranks:
            if row.rank == rank:
                ahead = [o.last_enqueued or 0 for o in state.ranks if o.pg == row.pg and o.rank not in culprits]
                if ahead and (row.last_enqueued or 0) < max(ahead):
                    return True
        return False

    return bool(culprits) and all(trails(r) for r in culprits)


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


def _from_stacks(ranks: Sequence[Rank]) -> Verdict:
    live = [r for r in ranks if r.state in ("running", "stuck")]
    missing = [r for r in ranks if r.state == "missing"]
    stuck = [r for r in live if r.state == "stuck"]
    if not live:
        return Verdict("unknown", (), "no rank could be sampled")
    if not stuck:
        text = f"{len(live)} rank{'s' if len(live) != 1 else ''} making progress"
        return Verdict("healthy", (), text + (f"; {who(_numbers(missing))} missing" if missing else ""))
    waiting = [r for r in stuck if r.phase == "collective"]
    elsewhere = [r for r in live if r.phase != "collective"]
    if waiting and (elsewhere or missing):
        culprits = elsewhere or missing
        lead = culprits[0]
        text = (f"{who(_numbers(culprits))} {verb(culprits, 'is', 'are')} "
                f"{'missing' if lead.state == 'missing' else 'in ' + place(lead)}"
                f" while {who(_numbers(waiting))} {verb(waiting, 'waits', 'wait')} in {place(waiting[0])}")
        return Verdict("straggler", tuple(_numbers(culprits)), text)
    if waiting and len(waiting) == len(live):
        return _mismatch_or_hang(waiting)
    culprits = [r for r in stuck if r.phase != "collective"]
    text = f"{who(_numbers(culprits))} {verb(culprits, 'is', 'are')} stuck in {place(culprits[0])}"
    if len(culprits) == len(live):
        return Verdict("hang", tuple(_numbers(culprits)), text)
    others = [r for r in live if r not in culprits]
    text += f" while {who(_numbers(others))} {verb(others, 'runs', 'run')} on"
    return Verdict("straggler", tuple(_numbers(culprits)), text)


def _mismatch_or_hang(waiting: list[Rank]) -> Verdict:
    by_place = Counter((r.op, r.where) for r in waiting)
    if len(by_place) == 1:
        secs = min((r.stuck_for_s or 0.0) for r in waiting)
        return Verdict("hang", (), f"all {len(waiting)} ranks stuck in {place(waiting[0])} for {secs:.0f}s+: "
                       "no local culprit (a peer on another node, or the network)")
    # The majority place is where healthy ranks went. With no single biggest place there is no
    # reason to blame either side: say that the ranks disagree, and where each one is.
    places = sorted(by_place, key=lambda key: (-by_place[key], _lowest(waiting, key)))
    if len(places) > 1 and by_place[places[0]] == by_place[places[1]]:
        sides = [[r for r in waiting if (r.op, r.where) == key] for key in places]
        text = "ranks disagree: " + "; ".join(
            f"{who(_numbers(side))} {verb(side, 'is', 'are')} in {place(side[0])}" for side in sides)
        return Verdict("mismatch", (), text)
    majority = [r for r in waiting if (r.op, r.where) == places[0]]
    minority = [r for r in waiting if (r.op, r.where) != places[0]]
    lead = minority[0]
    text = (f"{who(_numbers(minority))} {verb(minority, 'is', 'are')} in {place(lead)} while "
            f"{who(_numbers(majority))} {verb(majority, 'is', 'are')} in {place(majority[0])}")
    return Verdict("mismatch", tuple(_numbers(minority)), text)


def _lowest(waiting: list[Rank], key: tuple) -> int:
    """The lowest rank at a place: only to list places in a stable order, never to blame one."""
    return min(_numbers([r for r in waiting if (r.op, r.where) == key]) or [0])
