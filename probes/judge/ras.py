"""NCCL RAS across polls: progress, and the culprits of a stalled communicator. Pure, no I/O.

RAS counts, per rank and communicator, the collectives each rank has *launched* (per operation
type since NCCL 2.26). NCCL's own documentation (docs: troubleshooting/ras) says a MISMATCH on
its own is normal, collectives outpace the RAS query, and only counts that stop changing across
repeated queries mean a stuck communicator. So:

* counts that advanced since the previous poll are progress for the ranks that launched them
  (:func:`progress_pids`; the live view feeds it to the progress tracker as it does the
  Flight Recorder's completed collectives);
* a communicator whose counts differ between ranks and did not change since the previous poll
  is stalled: ranks whose counts trail the others' are *behind* (the culprits); ranks ahead in
  one operation type and behind in another launched different collectives: a *mismatch*, the
  minority being the culprits;
* ranks RAS declared ``dead`` (60 s unreachable) are culprits at once; ranks it could not reach
  (``unreachable``) once they stay so on a second poll (a slow rank can miss one RAS timeout);
* a rank whose communicator reports an NCCL error (initialization or asynchronous), was aborted,
  or is being finalized while the others run, or that answered RAS without the communicator
  (NOCOMM: destroyed, or never made), is a culprit at once: that is a state, not a count;
* every rank of a communicator at the same counts, unchanged since the previous poll (JSON, where
  every rank is listed): NCCL sees no rank behind, so the wait is below the ranks (*level*).

RAS counts Broadcast, Reduce, AllGather, ReduceScatter and AllReduce only: not send/recv (pipeline
stages) nor collectives captured in CUDA graphs. Equal counts are never read as health.

Every culprit is named with its rank, node and PID from RAS itself: no other node is asked.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from operator import itemgetter
from typing import Iterable, Mapping, NamedTuple, Sequence

from ..observed import ANY_OP, RasComm, RasReport
from ..snapshot import OpCount, Rank, RasRank, RasState, compact_ranks, who
from ..record import Record

_new = tuple.__new__  # a NamedTuple without its Python-level __new__ (thousands of rows a poll)
_STATE = itemgetter(8, 10, 11)  # a _Row's status, error, comm_status
MAX_ROWS = 256  # rows kept in a snapshot; beyond, only the notable ones (culprits, local, not ok)
NAMED = 4  # culprits spelled out one by one in the finding
HOST = "\x1f"  # marks a named rank's host in a finding's template (never in NCCL's words: removed there)
SCOPE = ("NCCL RAS counts Broadcast, Reduce, AllGather, ReduceScatter and AllReduce only: not send/recv "
         "(pipeline stages) nor collectives captured in CUDA graphs")


class _Row(NamedTuple):
    """A parsed rank with what the tracker adds: its global rank, node name and movement."""

    comm: str
    comm_rank: int
    rank: int | None  # global rank
    host: str
    pid: int | None
    gpu: int | None
    nvml_gpu: int | None
    counts: tuple[tuple[str, int], ...]
    status: str
    moving: bool | None
    error: str | None
    comm_status: str | None


@dataclass(frozen=True, repr=False)
class _Entry(Record):
    """Ranks of one communicator that share one count vector (text: the unnamed rest is one entry)."""

    vector: tuple[int, ...]
    rows: tuple[_Row, ...]
    size: int  # ranks it stands for (>= len(rows))


class RasTracker:
    """Remembers the previous poll; turns each new report into a :class:`RasState`."""

    def __init__(self) -> None:
        self._signature: dict[str, tuple] = {}  # communicator -> its counts at the last poll
        self._still_since: dict[str, float] = {}  # communicator -> first poll that saw them as now
        self._unreachable: set[tuple[str, int]] = set()  # (communicator, comm rank) unreachable at the last poll

    def observe(self, report: RasReport, at: float, origin: str, *, local_pids: Iterable[int] = (),
                names: Mapping[str, str] | None = None, caveat: str | None = None) -> RasState:
        """Judge ``report`` (taken at unix time ``at``) against the previous one. ``names`` maps
        RAS's host addresses to node names where known (this node's); ``caveat``: why the report
        could not be matched to the job for sure (said with the finding)."""
        names = names or {}
        comms = sorted(report.comms, key=lambda c: (-(c.size or len(c.ranks)), c.hash))
        global_of = _global_ranks(comms)
        rows: list[_Row] = []
        advancing, findings, still, first_look = False, [], [], []
        if report.format == "text":  # a text report details troubled communicators only: one gone quiet moved on
            gone = [h for h in self._signature if h not in {c.hash for c in comms}]
            advancing = any(_grew(self._signature.pop(h), ((), (), ())) for h in gone)
        for index, comm in enumerate(comms):
            signature = comm.ranks if comm.complete else (comm.groups, comm.problems, comm.ranks)
            previous = self._signature.get(comm.hash)
            if previous != signature:
                self._still_since[comm.hash] = at
            stalled = previous == signature
            comm_rows = self._rows(comm, previous if comm.complete else None, global_of, names, biggest=index == 0)
            moved = any(r.moving for r in comm_rows) or (previous is not None and not comm.complete
                                                          and previous != signature and _grew(previous, signature))
            advancing |= moved
            self._signature[comm.hash] = signature
            rows += comm_rows
            if stalled:
                still.append(at - self._still_since[comm.hash])
            found = (_lost(index, comm_rows, self._unreachable) or _troubled(index, comm, comm_rows)
                     or (_stalled(index, comm, comm_rows) or _level(index, comm, comm_rows, at - self._still_since[
                         comm.hash]) if stalled else None))
            if found:
                findings.append(found)
            elif previous is None and (early := _stalled(index, comm, comm_rows)) is not None and early[2]:
                first_look.append(early)  # counts that differ, seen once: a finding only while the ranks wait
        self._unreachable = {(r.comm, r.comm_rank) for r in rows if r.status == "unreachable"}
        first_reply = not findings and bool(first_look)
        if first_reply:
            kind, template, culprits = first_look[0]
            template += " (one NCCL RAS reply: counts not yet seen unchanged)"
        else:
            kind, template, culprits = findings[0] if findings else (None, None, ())
        if template and caveat:
            template += " [report not matched to this job for sure]"
        return RasState(origin=origin, format=report.format, nccl_version=report.nccl_version, taken_at=at,
                        comms=tuple(c.hash for c in comms), ranks=_kept(rows, culprits, set(local_pids)),
                        kind=kind, finding=_worded(template, {}),
                        finding_template=template if template and HOST in template else None,
                        culprits=tuple(culprits), advancing=advancing, first_reply=first_reply,
                        still_s=round(min(still), 1) if still and len(still) == len(comms) else None,
                        notes=(*report.notes, *((caveat,) if caveat else ()), *((SCOPE,) if kind else ())))

    def _rows(self, comm: RasComm, previous: tuple | None, global_of: Mapping[tuple[str, int | None], int],
              names: Mapping[str, str], biggest: bool) -> list[_Row]:
        """The communicator's ranks as rows; ``moving``: its counts grew since ``previous`` (the
        communicator's ranks at the last poll; None: no last poll, or a text report)."""
        still = comm.complete and previous is not None and previous == comm.ranks
        before = {r.rank: r.counts for r in previous} if comm.complete and previous is not None and not still else {}
        out = []
        for r in comm.ranks:
            moving = None
            if still:
                moving = False
            elif before and r.status == "ok" and r.counts:
                old = before.get(r.rank)
                if old is not None:
                    moving = old != r.counts and sum(n for _, n in r.counts) > sum(n for _, n in old)
            out.append(_new(_Row, (comm.hash, r.rank, global_of.get((r.host, r.pid), r.rank if biggest else None),
                                   names.get(r.host, r.host), r.pid, r.cuda_dev, r.nvml_dev, r.counts, r.status,
                                   moving, r.error.replace(HOST, "") if r.error else r.error, r.comm_status)))
        return out


def progress_pids(state: RasState | None, local_pids: Iterable[int]) -> set[int]:
    """Local rank PIDs that RAS saw launch collectives since the previous poll. A text report
    names no rank of a healthy communicator: there, any advance counts for every local rank."""
    if state is None:
        return set()
    local = set(local_pids)
    if state.format == "text":
        return local if state.advancing else set()
    return {r.pid for r in state.ranks if r.moving and r.pid in local}


def describe(state: RasState) -> list[str]:
    """One line per communicator and rank worth reading, for the summary and bundles."""
    lines = [f"NCCL RAS at {state.origin} ({state.format}, NCCL {state.nccl_version or '?'}): "
             f"{len(state.comms)} communicator{'s' if len(state.comms) != 1 else ''}"
             + (", counts advancing" if state.advancing else "")
             + (f", counts unchanged for {state.still_s:g} s" if state.still_s else "")]
    if state.finding:
        lines.append(f"finding: {state.finding}")
    for row in state.ranks:
        counts = ", ".join(f"{c.op} {c.count}" for c in row.counts if c.count) or "none launched"
        who = f"rank {row.rank}" if row.rank is not None else f"comm rank {row.comm_rank}"
        lines.append(f"communicator {_number(state, row.comm)} {who} ({row.host or '?'}, pid {row.pid or '?'}, "
                     f"GPU {row.gpu if row.gpu is not None else '?'}): {row.status}; {counts}"
                     + (f"; communicator {row.comm_status}" if row.comm_status else "")
                     + (f"; {row.error}" if row.error else "") + (" (moving)" if row.moving else ""))
    lines += state.notes
    return lines


# -- findings ------------------------------------------------------------------------------------
def _lost(index: int, rows: list[_Row], before: set[tuple[str, int]]) -> tuple[str, str, list[int]] | None:
    """Ranks RAS declared dead (60 s unreachable: from one poll), or could not reach in two polls
    in a row (one slow answer within RAS's own timeout is not enough)."""
    lost = [r for r in rows if r.status == "dead" or (r.status == "unreachable" and (r.comm, r.comm_rank) in before)]
    if not lost:
        return None
    kind = "dead" if any(r.status == "dead" for r in lost) else "unreachable"
    why = {"dead": "considered dead by NCCL RAS (unreachable for 60 s)", "unreachable": "unreachable by NCCL RAS"}
    parts = [f"{_names(group)} {'is' if len(group) == 1 else 'are'} {why[state]}"
             for state in ("dead", "unreachable") if (group := [r for r in lost if r.status == state])]
    return kind, f"{'; '.join(parts)} (communicator {index})", _numbers(lost)


def _troubled(index: int, comm: RasComm, rows: list[_Row]) -> tuple[str, str, list[int]] | None:
    """Ranks whose own state says what is wrong, from one poll: an NCCL error, an aborted
    communicator, a communicator finalized while the others still run, or none at all (NOCOMM).
    Text names outliers only: the ranks it does not name are running."""
    if set(map(_STATE, rows)) <= {("ok", None, None), ("unreachable", None, None), ("dead", None, None)}:
        return None  # the common case, checked at C speed: thousands of rows a poll
    named_running = sum(r.status == "ok" and r.comm_status is None for r in rows)
    running = named_running + (0 if comm.complete else max(0, (comm.size or 0) - len(rows)))
    for kind, picked, what in (
            ("error", [r for r in rows if r.error], lambda r: f"reports an NCCL {r.error}"),
            ("abort", [r for r in rows if r.comm_status == "abort"], lambda r: "aborted its communicator"),
            ("left", [r for r in rows if r.status == "nocomm"] if running else [],
             lambda r: "answered NCCL RAS but no longer has the communicator (destroyed, or never made)"),
            ("left", [r for r in rows if r.comm_status == "finalize"] if running else [],
             lambda r: "is finalizing or destroying the communicator")):
        if picked:
            text = f"{_names(picked)} {what(picked[0])} (communicator {index}"
            if running and kind in ("left",):
                text += f"; {running} other{'s' if running != 1 else ''} still use it"
            return kind, text + ")", _numbers(picked)
    return None


def _level(index: int, comm: RasComm, rows: list[_Row], still_s: float) -> tuple[str, str, list[int]] | None:
    """Every rank at the same counts, none moving: NCCL sees no rank behind (JSON lists every rank)."""
    present = [r for r in rows if r.status == "ok"]
    if not comm.complete or len(present) < 2 or len(present) != len(rows) or len({r.counts for r in present}) != 1:
        return None
    counts = dict(present[0].counts)
    if not any(counts.values()):
        return None
    op, top = max(counts.items(), key=lambda kv: kv[1])
    text = (f"NCCL RAS sees all {len(present)} ranks of communicator {index} at the same collective ({op} #{top}), "
            f"counts unchanged for {still_s:g} s: no rank is behind; the wait is below the ranks (the network or a "
            f"GPU kernel), or in operations RAS does not count (send/recv, CUDA graphs)")
    return "level", text, []


def _stalled(index: int, comm: RasComm, rows: list[_Row]) -> tuple[str, str, list[int]] | None:
    """A communicator whose counts did not move since the previous poll and differ between ranks."""
    entries, ops = _entries(comm, rows)
    if len(entries) < 2:
        return None
    lead = tuple(max(e.vector[i] for e in entries) for i in range(len(ops)))
    if _incomparable(entries):
        return _mismatch(index, entries, ops)
    behind = [e for e in entries if e.vector != lead]
    ahead = [e for e in entries if e.vector == lead]
    culprits = [r for e in behind for r in e.rows]
    if not culprits:  # the ranks behind are the unnamed majority of a text report
        n = sum(e.size for e in behind)
        return "behind", f"{n} ranks are behind in communicator {index} (RAS names only outliers)", []
    gap = max(sum(lead) - sum(e.vector) for e in behind)
    op = _op_word(ops, lead, behind[0].vector)
    others = sum(e.size for e in ahead)
    lag = f"{gap} collective{'s' if gap != 1 else ''}"
    if all(not any(e.vector) for e in behind):  # launched nothing on this communicator yet
        lag = "has not launched any collective" if len(culprits) == 1 else "have not launched any collective"
        text = f"{_names(culprits)} {lag} in communicator {index}"
    else:
        text = f"{_names(culprits)} {'is' if len(culprits) == 1 else 'are'} {lag} behind in communicator {index}"
    text += (f" ({'all ' if others > 1 else ''}{others} other{'s' if others != 1 else ''} "
             f"launched {op}#{_top(ops, lead)})")
    return "behind", text, _numbers(culprits)


def _mismatch(index: int, entries: list[_Entry], ops: tuple[str, ...]) -> tuple[str, str, list[int]]:
    """Ranks ahead in one operation type and behind in another: they launched different collectives."""
    biggest = max(e.size for e in entries)
    majority = [e for e in entries if e.size == biggest]
    if len(majority) > 1:
        return "mismatch", f"ranks launched different collectives in communicator {index} (no majority)", []
    main = majority[0]
    odd = [e for e in entries if e is not main]
    culprits = [r for e in odd for r in e.rows]
    theirs = _extra_op(ops, odd[0].vector, main.vector)
    ours = _extra_op(ops, main.vector, odd[0].vector)
    text = (f"{_names(culprits)} launched {theirs} where the {main.size} others launched {ours} "
            f"in communicator {index}")
    return "mismatch", text, _numbers(culprits)


def _incomparable(entries: list[_Entry]) -> bool:
    """Some two entries each lead the other in some operation type."""
    for a in entries:
        for b in entries:
            if any(x > y for x, y in zip(a.vector, b.vector)) and any(x < y for x, y in zip(a.vector, b.vector)):
                return True
    return False


def _entries(comm: RasComm, rows: list[_Row]) -> tuple[list[_Entry], tuple[str, ...]]:
    """Reachable ranks grouped by their count vector over the operation types RAS reported."""
    present = [r for r in rows if r.status == "ok"]
    if comm.complete:
        groups: dict[tuple, list[_Row]] = {}
        for row in present:
            groups.setdefault(row.counts, []).append(row)
        ops = tuple(dict.fromkeys(op for key in groups for op, _ in key))
        vectors = {key: tuple(dict(key).get(op, 0) for op in ops) for key in groups}
        return [_Entry(vectors[k], tuple(g), len(g)) for k, g in groups.items()], ops
    # Text: per operation type, the biggest group's count stands for every rank RAS did not name.
    ops = tuple(dict.fromkeys(g.op for g in comm.groups))
    usual = {op: max((g for g in comm.groups if g.op == op), key=lambda g: (g.ranks, g.count)).count for op in ops}
    named: dict[tuple[int, ...], list[_Row]] = {}
    for row in present:
        counts = dict(row.counts)
        named.setdefault(tuple(counts.get(op, usual[op]) for op in ops), []).append(row)
    entries = [_Entry(v, tuple(g), len(g)) for v, g in named.items()]
    rest = (comm.size or 0) - sum(len(g) for g in named.values()) - sum(r.status != "ok" for r in rows)
    majority = tuple(usual[op] for op in ops)
    if rest > 0:
        same = next((e for e in entries if e.vector == majority), None)
        merged = _Entry(majority, same.rows if same else (), rest + (same.size if same else 0))
        entries = [e for e in entries if e is not same] + [merged]
    return entries, ops


def _global_ranks(comms: list[RasComm]) -> dict[tuple[str, int], int]:
    """(host, pid) -> global rank: the rank in the biggest communicator (torch's default group)."""
    for comm in comms:
        known = {(r.host, r.pid): r.rank for r in comm.ranks if r.pid is not None}
        if comm.complete or known:
            return known
    return {}


def _grew(previous: tuple, signature: tuple) -> bool:
    """Text: some operation's top count went up (the communicator moved on)."""
    def tops(sig: tuple) -> dict[str, int]:
        out: dict[str, int] = {}
        for group in sig[0]:
            out[group.op] = max(out.get(group.op, 0), group.count)
        return out
    before, now = tops(previous), tops(signature)
    return any(now[op] > before.get(op, now[op]) for op in now) or (bool(before) and not now)


def _op_word(ops: tuple[str, ...], lead: tuple[int, ...], behind: tuple[int, ...]) -> str:
    """``AllReduce `` when the gap is in one known operation type; else nothing."""
    gaps = [op for op, a, b in zip(ops, lead, behind) if a > b]
    return f"{gaps[0]} " if len(gaps) == 1 and gaps[0] != ANY_OP else ""


def _top(ops: tuple[str, ...], lead: tuple[int, ...]) -> int:
    return max(lead) if len(ops) != 1 else lead[0]


def _extra_op(ops: tuple[str, ...], mine: tuple[int, ...], theirs: tuple[int, ...]) -> str:
    """``AllGather #4``: the operation type where ``mine`` leads ``theirs``."""
    for op, a, b in zip(ops, mine, theirs):
        if a > b:
            return f"{op} #{a}"
    return "a different collective"


def _names(rows: list[_Row]) -> str:
    """``rank 37 (node12, pid 4411)``, several joined, the rest counted."""
    def one(row: _Row) -> str:
        who = f"rank {row.rank}" if row.rank is not None else f"comm rank {row.comm_rank}"
        host = f"{HOST}{row.host}{HOST}" if row.host else "unknown node"
        return f"{who} ({host}, pid {row.pid if row.pid is not None else '?'})"
    shown = [one(r) for r in rows[:NAMED]]
    if len(rows) > NAMED:
        rest = _numbers(rows[NAMED:])
        shown.append(f"{len(rows) - NAMED} more" + (f" (ranks {compact_ranks(rest)})" if rest else ""))
    return shown[0] if len(shown) == 1 else ", ".join(shown[:-1]) + " and " + shown[-1]


def _numbers(rows: Iterable[_Row]) -> list[int]:
    return sorted({r.rank for r in rows if r.rank is not None})


def _number(state: RasState, comm: str) -> int | str:
    return state.comms.index(comm) if comm in state.comms else comm


def _kept(rows: list[_Row], culprits: Iterable[int], local: set[int]) -> tuple[RasRank, ...]:
    """Snapshot rows: every rank of a small job; of a big one, the culprits, this node's and the troubled."""
    if len(rows) > MAX_ROWS:
        wanted = set(culprits)
        rows = [r for r in rows if r.rank in wanted or r.pid in local or r.status != "ok" or r.error
                or r.comm_status][:MAX_ROWS]
    return tuple(RasRank(comm=r.comm, comm_rank=r.comm_rank, rank=r.rank, host=r.host, pid=r.pid, gpu=r.gpu,
                         nvml_gpu=r.nvml_gpu, counts=tuple(OpCount(op, n) for op, n in r.counts), status=r.status,
                         moving=r.moving, error=r.error, comm_status=r.comm_status) for r in rows)


def _worded(template: str | None, names: Mapping[str, str]) -> str | None:
    """A finding's template in words, each marked host by its name in ``names`` where known."""
    if template is None or HOST not in template:
        return template
    parts = template.split(HOST)
    return "".join(names.get(p, p) if i % 2 else p for i, p in enumerate(parts))


def with_names(state: RasState, names: Mapping[str, str]) -> RasState:
    """The same state with RAS's host addresses replaced by node names (a merged view knows more),
    in its ranks and in its finding's words."""
    if not names:
        return state
    ranks = tuple(replace(r, host=names.get(r.host, r.host)) for r in state.ranks)
    if state.finding_template is None:
        return replace(state, ranks=ranks)
    template = HOST.join(names.get(p, p) if i % 2 else p for i, p in enumerate(state.finding_template.split(HOST)))
    return replace(state, ranks=ranks, finding=_worded(template, {}), finding_template=template)


# A lost rank is the plainest fact, then a rank's own broken state, then counts.
_GRAVITY = {"dead": 4, "unreachable": 3, "error": 3, "abort": 3, "left": 2, "mismatch": 1, "behind": 1, "level": 0}


def across_nodes(states: Sequence[tuple[str, RasState]], ranks: Sequence[Rank]) -> tuple[RasState | None, list[str]]:
    """One NCCL RAS view for a job seen through several nodes (each node judged its own RAS
    replies), checked against the ranks: the state with the gravest finding (a lost rank first;
    then the freshest), RAS's addresses worded as the nodes' names where a rank's PID matches, and
    notes where the nodes' RAS views or their own ranks disagree."""
    if not states:
        return None, []
    notes = []
    named = {(r.rank, r.pid): r.host for r in ranks if r.rank is not None and r.pid is not None and r.host}
    findings = {node: s.culprits for node, s in states if s.kind}
    if len(set(findings.values())) > 1:
        notes.append("NCCL RAS views differ between nodes: " + "; ".join(
            f"{node} names {who(c) if c else 'no rank'}" for node, c in findings.items()))
    chosen = max(states, key=lambda item: (_GRAVITY.get(item[1].kind or "", 0), item[1].taken_at or 0.0))[1]
    names = {row.host: named[(row.rank, row.pid)] for row in chosen.ranks if (row.rank, row.pid) in named}
    by_rank = {r.rank: r for r in ranks if r.rank is not None}
    for rank in chosen.culprits:
        seen = by_rank.get(rank)
        if chosen.kind in ("dead", "unreachable") and seen is not None and seen.state == "running":
            notes.append(f"NCCL RAS says rank {rank} is {chosen.kind}, but node {seen.host} sees it running "
                         "(the RAS network may be cut, not the rank)")
    return with_names(chosen, names), notes
