"""One verdict over all ranks: healthy, straggler, mismatch, hang, rendezvous or crashed."""

from __future__ import annotations

from collections import Counter
from typing import Sequence

from trainwatch.probes import exits
from trainwatch.probes.exits import TEARDOWN_SIGNALS, raised_while_alive
from trainwatch.probes.process import JobProcesses
from trainwatch.probes.snapshot import CollectiveState, Job, Rank, Verdict, compact_ranks


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
    """An exited rank whose exit was a crash (see ``exits.abnormal``)."""
    return rank.state == "exited" and exits.abnormal(rank.exit)


def judge(ranks: Sequence[Rank], job: Job | JobProcesses | None = None,
          collectives: CollectiveState | None = None) -> Verdict:
    """The verdict and its culprits; pure, so merged multi-node rank lists judge the same way."""
    return (_crashed(ranks) or _rendezvous(ranks, job) or _from_collectives(ranks, collectives)
            or _from_stacks(ranks))


def _crashed(ranks: Sequence[Rank]) -> Verdict | None:
    exited = [r for r in ranks if r.state == "exited"]
    if exited and len(exited) == len(ranks) and not any(abnormal(r) for r in exited):
        return Verdict("healthy", (), f"job finished: all {len(exited)} ranks exited normally")
    # A rank that raised and lingers (a non-daemon thread keeps its process) is as dead as one that exited.
    dead = [r for r in exited if abnormal(r)] + [r for r in ranks if raised_while_alive(r)]
    if not dead:
        return None
    first = [r for r in dead if r.exit and r.exit.first]
    cause = [r for r in dead if r.exit and r.exit.signal not in TEARDOWN_SIGNALS]
    culprits = first or cause or sorted(dead, key=lambda r: (r.exit.at or 0) if r.exit else 0)[:1]
    numbers = _numbers(culprits)
    lead = culprits[0]
    if raised_while_alive(lead):
        text = f"{who(numbers)} raised {_raised(lead)}"
    else:
        text = f"{who(numbers)} died: {exits.describe_exit(lead.exit) if lead.exit else 'exited'}"
        if lead.where:
            text += f" (last seen in {place(lead)})"
    others = [r for r in dead if r not in culprits]
    if others:
        text += f"; {who(_numbers(others))} then ended too"
    return Verdict("crashed", tuple(numbers), text)


def _raised(rank: Rank) -> str:
    """``RuntimeError: boom (main thread exited; kept alive by non-daemon thread 'worker' …)``."""
    info = rank.exit
    what = (exits.headline(info) if info else None) or "an exception"
    if info and info.reason and info.message and info.message not in what:
        what += f" ({info.message})"
    return what + (f" ({rank.detail})" if rank.detail else "")


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
    if state is None or not state.divergence:
        return None
    return Verdict("mismatch", tuple(state.culprits), f"{state.divergence} (Flight Recorder, {state.source})")


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
    # The majority place is where healthy ranks went; ties go to the place that holds the lowest rank.
    def lowest_rank(place_key: tuple) -> int:
        return min(_numbers([r for r in waiting if (r.op, r.where) == place_key]))

    majority_key = min(by_place, key=lambda key: (-by_place[key], lowest_rank(key)))
    majority = [r for r in waiting if (r.op, r.where) == majority_key]
    minority = [r for r in waiting if (r.op, r.where) != majority_key]
    lead = minority[0]
    text = (f"{who(_numbers(minority))} {verb(minority, 'is', 'are')} in {place(lead)} while "
            f"{who(_numbers(majority))} {verb(majority, 'is', 'are')} in {place(majority[0])}")
    return Verdict("mismatch", tuple(_numbers(minority)), text)
