"""Where the ranks' collectives disagree: the first sequence number of a process group at which
ranks enqueued different collectives, or that some ranks never reached, and the ranks at fault.

Pure. The evidence is each rank's own record of its recent collectives per process group
(:class:`~trainwatch.probes.snapshot.RankCollective` with its ``calls``), as any reader made it:
Flight Recorder traces from the hook, dump files, the pipe or the debug server
(``read/collectives/flightrec.py``), the NCCL watchdog's timeout lines, or another node's
snapshot. Rows without calls (snapshots written before calls were kept) stand for their last
enqueued and their pending collective. A merged view of many nodes puts every node's rows
together and is judged here like one node's.

Sizes or dtypes a source does not know (``"?"``) are never a disagreement.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from ..snapshot import CollectiveCall, CollectiveState, RankCollective, compact_ranks

UNKNOWN = "?"


def judge_collectives(state: CollectiveState | None) -> CollectiveState | None:
    """``state`` with its rows corrected across ranks and the first disagreement and its culprits
    (``divergence``, ``culprits``); None stays None."""
    if state is None or not state.ranks:
        return state
    by_pg: dict[str, dict[int, RankCollective]] = {}
    for row in state.ranks:
        by_pg.setdefault(row.pg, {}).setdefault(row.rank, row)
    pgs = sorted(by_pg, key=lambda p: (len(p), p))
    corrected: dict[tuple[int, str], RankCollective] = {}
    findings: list[tuple[str, list[int]]] = []
    for pg in pgs:
        rows = by_pg[pg]
        calls = {rank: _calls_of(row) for rank, row in rows.items()}
        unfinished = _never_finished(calls)
        enqueued: dict[int, int | None] = {}
        completed: dict[int, int | None] = {}
        for rank, row in rows.items():
            done = row.last_completed
            if unfinished is not None and done is not None and done >= unfinished:
                done = unfinished - 1
                calls[rank] = {s: replace(c, done=False) if s >= unfinished else c for s, c in calls[rank].items()}
                corrected[(rank, pg)] = _pending_again(row, calls[rank], done)
            enqueued[rank], completed[rank] = row.last_enqueued, done
        if len(calls) > 1:
            found = _divergence(pg, calls, enqueued, completed, multi_pg=len(pgs) > 1)
            if found:
                findings.append(found)
    culprits: list[int] = []
    for _, ranks in findings:
        culprits.extend(r for r in ranks if r not in culprits)
    ranks = tuple(corrected.get((row.rank, row.pg), row) for row in state.ranks)
    return replace(state, ranks=ranks, divergence=findings[0][0] if findings else None,
                   culprits=tuple(sorted(culprits)))


@dataclass(frozen=True, repr=False)
class Disagreement:
    """The first sequence number of one process group at which the ranks that hold it enqueued
    different collectives: the ranks grouped by what they enqueued there (biggest side first),
    and each rank's call."""

    pg: str
    seq: int
    sides: tuple[tuple[int, ...], ...]
    calls: dict[int, CollectiveCall]
    completed: dict[int, int | None]


def disagreements(state: CollectiveState | None) -> list[Disagreement]:
    """Per process group, the first sequence number where ranks enqueued different collectives
    (op, sizes, dtype); ranks that never reached one are not a disagreement here."""
    if state is None:
        return []
    by_pg: dict[str, dict[int, RankCollective]] = {}
    for row in state.ranks:
        by_pg.setdefault(row.pg, {}).setdefault(row.rank, row)
    found = []
    for pg in sorted(by_pg, key=lambda p: (len(p), p)):
        calls = {rank: _calls_of(row) for rank, row in by_pg[pg].items()}
        for seq in sorted({s for per in calls.values() for s in per}):
            seen = {rank: c for rank, per in calls.items() if (c := per.get(seq)) is not None}
            kinds = _kinds(seen)
            if len(kinds) > 1:
                sides = sorted((tuple(sorted(side)) for side in kinds.values()), key=lambda side: (-len(side), side))
                found.append(Disagreement(pg, seq, tuple(sides), seen,
                                          {rank: row.last_completed for rank, row in by_pg[pg].items()}))
                break
    return found


def minority(sides: tuple[tuple[int, ...], ...]) -> list[int]:
    """The ranks outside the one biggest side; none when two sides tie for biggest."""
    if len(sides) < 2 or len(sides[0]) == len(sides[1]):
        return []
    return sorted(r for side in sides[1:] for r in side)


def disagreement_words(found: Disagreement, culprits: list[int]) -> str:
    """``rank 2 enqueued all_gather of [5] #7 while ranks 0-1 enqueued all_gather of [4] #7``."""
    sides = [list(side) for side in found.sides]
    bad = [side for side in sides if set(side) <= set(culprits)]
    where = f" in process group {found.pg}" if found.pg not in ("0", "c10d", "nccl") else ""
    if not bad:
        return _disagreement(found.seq, where, found.calls, sides, {})[0]
    good = [side for side in sides if side not in bad]
    ref = found.calls[good[0][0]] if good else found.calls[bad[0][0]]
    odd = "; ".join(f"{_plural(side)} enqueued {_describe(found.calls[side[0]], ref)} #{found.seq}" for side in bad)
    rest = "; ".join(f"{_plural(side)} enqueued {_describe(found.calls[side[0]], found.calls[bad[0][0]])} "
                     f"#{found.seq}" for side in good)
    return f"{odd}{where} while {rest}" if rest else f"{odd}{where}"


def numel(sizes: str) -> int | None:
    """The elements ``[4]``, ``[16x16],[2]`` or ``5`` (NCCL's NumelIn) stand for; None when unknown."""
    total = 0
    for part in sizes.replace("],[", "];[").split(";"):
        dims = part.strip("[]").split("x")
        if not all(d.strip().isdigit() for d in dims):
            return None
        count = 1
        for d in dims:
            count *= int(d)
        total += count
    return total


def _calls_of(row: RankCollective) -> dict[int, CollectiveCall]:
    """The row's calls by sequence number; a row without calls stands for its last enqueued and
    its pending collective (sizes and dtype unknown)."""
    if row.calls:
        return {c.seq: c for c in row.calls}
    out: dict[int, CollectiveCall] = {}
    for seq, op in ((row.last_enqueued, row.op), (row.pending_seq, row.pending_op)):
        if seq is not None and op is not None:
            done = row.last_completed is not None and seq <= row.last_completed
            out[seq] = CollectiveCall(seq, op, done=done)
    return out


def _pending_again(row: RankCollective, calls: dict[int, CollectiveCall], completed: int) -> RankCollective:
    """The row once a call it counted completed is known never to have finished."""
    waiting = [c for s, c in calls.items() if s > completed and not c.done]
    oldest = min(waiting, key=lambda c: c.seq) if waiting else calls.get(completed + 1)
    return replace(row, last_completed=completed, pending_seq=oldest.seq if oldest else completed + 1,
                   pending_op=oldest.op if oldest else None, pending_since=oldest.created if oldest else None)


def _kinds(seen: dict[int, CollectiveCall]) -> dict[tuple[str, str, str], list[int]]:
    """Ranks grouped by what they enqueued: op, and sizes and dtype where every rank's are known."""
    sizes = all(c.sizes != UNKNOWN for c in seen.values())
    dtypes = all(c.dtype != UNKNOWN for c in seen.values())
    kinds: dict[tuple[str, str, str], list[int]] = {}
    for rank, call in seen.items():
        key = (call.op, call.sizes if sizes else UNKNOWN, call.dtype if dtypes else UNKNOWN)
        kinds.setdefault(key, []).append(rank)
    return kinds


def _never_finished(calls: dict[int, dict[int, CollectiveCall]]) -> int | None:
    """The first sequence number the ranks hold as different collectives: it cannot have completed
    anywhere, whatever a rank's record says. Gloo retires a collective that failed (timed out) as
    if it had completed, and its pg_status counts it completed: a dump written after the timeout
    would otherwise show the waiting ranks done and the odd rank behind."""
    for seq in sorted({s for per in calls.values() for s in per}):
        seen = {rank: c for rank, per in calls.items() if (c := per.get(seq)) is not None}
        if len(_kinds(seen)) > 1:
            return seq
    return None


def _plural(ranks: list[int]) -> str:
    return f"rank {ranks[0]}" if len(ranks) == 1 else f"ranks {compact_ranks(ranks)}"


def _culprit_side(sides: list[list[int]], completed: dict[int, int | None]) -> tuple[list[list[int]], str]:
    """The sides at fault, and why; none without a reason (never a coin toss).

    The reason is a minority (one side holds more ranks than any other: the rest are at fault).
    Order is none: a collective that completed on one rank was joined by every rank of its group,
    so a rank whose record shows fewer completed was only read earlier, or its last one was still
    in flight (a CI run named rank 0 of two "lagging" by one so, mid-step).
    """
    biggest = max(len(side) for side in sides)
    majority = [side for side in sides if len(side) == biggest]
    if len(majority) == 1:
        return [side for side in sides if side is not majority[0]], "minority"
    return [], "tie"


def _divergence(pg: str, calls: dict[int, dict[int, CollectiveCall]], enqueued: dict[int, int | None],
                completed: dict[int, int | None], multi_pg: bool) -> tuple[str, list[int]] | None:
    """The first sequence number where the ranks of one group disagree, in words, and its culprits."""
    where = f" in process group {pg}" if multi_pg else ""
    ranks = sorted(calls)
    for seq in sorted({s for per in calls.values() for s in per}):
        seen = {r: calls[r][seq] for r in ranks if seq in calls[r]}
        # A rank whose record no longer holds seq but which went past it agreed (a ring buffer, a
        # record kept from a little before its last completed call).
        never = [r for r in ranks if seq not in calls[r] and (enqueued[r] or 0) < seq]
        kinds = _kinds(seen)
        if len(kinds) > 1:
            return _disagreement(seq, where, seen, sorted(kinds.values()), completed)
        if never and seen:
            call = next(iter(seen.values()))
            last = ", ".join(f"rank {r} at #{enqueued[r]}" if enqueued[r] else f"rank {r} at none"
                             for r in never)
            return (f"{_plural(sorted(seen))} enqueued {call.op} #{seq}{where}; "
                    f"{_plural(never)} never reached it ({last})", never)
    return None


def _disagreement(seq: int, where: str, seen: dict[int, CollectiveCall], sides: list[list[int]],
                  completed: dict[int, int | None]) -> tuple[str, list[int]]:
    """Ranks that enqueued different collectives under one sequence number, in words."""
    bad, why = _culprit_side(sides, completed)
    if not bad:
        first = seen[sides[0][0]]
        second = seen[sides[1][0]]
        parts = [f"{_plural(side)} enqueued {_describe(seen[side[0]], second if side is sides[0] else first)}"
                 for side in sides]
        return f"ranks disagree at #{seq}{where}: " + "; ".join(parts), []
    good = [side for side in sides if not any(side is b for b in bad)]
    ref = seen[good[0][0]]
    odd = "; ".join(f"{_plural(side)} enqueued {_describe(seen[side[0]], ref)} #{seq}" for side in bad)
    rest = "; ".join(f"{_plural(side)} enqueued {_describe(seen[side[0]], seen[bad[0][0]])} #{seq}"
                     for side in good)
    return f"{odd}{where} while {rest}", sorted(r for side in bad for r in side)


def _describe(call: CollectiveCall, other: CollectiveCall) -> str:
    """The op, plus sizes or dtype when that is what differs."""
    if call.op != other.op:
        return call.op
    if call.sizes != other.sizes and UNKNOWN not in (call.sizes, other.sizes):
        return f"{call.op} of {call.sizes}"
    if call.dtype != other.dtype and UNKNOWN not in (call.dtype, other.dtype):
        return f"{call.op} ({call.dtype})"
    return call.op
