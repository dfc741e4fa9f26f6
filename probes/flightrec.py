"""Cross-rank analysis of Flight Recorder traces: where do the ranks' collectives disagree?

Pure and torch-free. A trace is the dict torch's Flight Recorder dumps (JSON from
``_dump_fr_trace_json``, or the pickle of ``_dump_fr_trace`` / the on-timeout files):
``entries`` (``collective_seq_id``, ``profiling_name`` like ``"nccl:all_reduce"``,
``input_sizes``, ``input_dtypes``, ``process_group``, ``retired``, ``state``, ...) and, since
2.x, ``pg_status`` with each group's last enqueued / completed sequence number. Gloo dumps
from torch 2.13 carry an empty ``pg_config`` and never mark entries ``completed``; their
``pg_status`` and ``retired`` flags are used instead.
"""

from __future__ import annotations

import io
import json
import pickle
from dataclasses import dataclass

from trainwatch.probes.snapshot import CollectiveState, RankCollective, compact_ranks


class TraceError(ValueError):
    """Bytes that are not a Flight Recorder trace."""


class _PlainUnpickler(pickle.Unpickler):
    """Flight Recorder pickles hold only dicts, lists, tuples, strings and numbers: refuse the rest."""

    def find_class(self, module: str, name: str):  # noqa: D102
        raise pickle.UnpicklingError(f"refusing to load {module}.{name} from a trace")


def load_trace(data: bytes) -> dict:
    """Parse a trace from its JSON or pickle bytes. Raises :class:`TraceError`."""
    stripped = data.lstrip()
    try:
        if stripped.startswith(b"{"):
            trace = json.loads(data)
        else:
            trace = _PlainUnpickler(io.BytesIO(data)).load()
    except (ValueError, pickle.UnpicklingError, EOFError, TypeError, IndexError, KeyError) as exc:
        raise TraceError(f"not a Flight Recorder trace: {exc}") from None
    if not isinstance(trace, dict) or not isinstance(trace.get("entries", []), list):
        raise TraceError("not a Flight Recorder trace (no 'entries' list)")
    return trace


@dataclass(frozen=True)
class _Call:
    seq: int
    op: str
    sizes: str
    dtype: str
    done: bool


def _int(value: object) -> int | None:
    try:
        number = int(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return None
    return number if number >= 0 else None


def _op_name(profiling_name: object) -> str:
    """``"nccl:all_reduce"`` -> ``"all_reduce"``."""
    text = str(profiling_name or "?")
    return text.split(":", 1)[1] if ":" in text else text


def _sizes(value: object) -> str:
    if not isinstance(value, (list, tuple)):
        return "?"
    return ",".join("[" + "x".join(str(d) for d in s) + "]" if isinstance(s, (list, tuple)) else str(s)
                    for s in value)


def _pg_key(entry: dict) -> str:
    group = entry.get("process_group")
    if isinstance(group, (list, tuple)) and group:
        return str(group[0])
    return str(entry.get("pg_id", "0"))


def _collectives(trace: dict) -> dict[str, dict[int, _Call]]:
    """Per process group: collective sequence number -> the call (p2p ops left out)."""
    groups: dict[str, dict[int, _Call]] = {}
    for entry in trace.get("entries") or []:
        if not isinstance(entry, dict) or entry.get("is_p2p"):
            continue
        seq = _int(entry.get("collective_seq_id"))
        if not seq:
            continue
        done = entry.get("state") == "completed" or bool(entry.get("retired"))
        groups.setdefault(_pg_key(entry), {})[seq] = _Call(
            seq, _op_name(entry.get("profiling_name")), _sizes(entry.get("input_sizes")),
            ",".join(str(d) for d in entry.get("input_dtypes") or []) or "?", done)
    return groups


def _status(trace: dict, pg: str, calls: dict[int, _Call]) -> tuple[int | None, int | None]:
    """(last enqueued, last completed) for one group: pg_status when present, else the entries."""
    status = (trace.get("pg_status") or {}).get(pg)
    if isinstance(status, dict):
        enqueued = _int(status.get("last_enqueued_collective"))
        completed = _int(status.get("last_completed_collective"))
        if enqueued is not None:
            return enqueued, completed
    enqueued = max(calls, default=None)
    completed = max((s for s, c in calls.items() if c.done), default=None)
    return enqueued, completed


def _plural(ranks: list[int]) -> str:
    return f"rank {ranks[0]}" if len(ranks) == 1 else f"ranks {compact_ranks(ranks)}"


def _culprit_side(sides: list[list[int]]) -> list[int]:
    """The minority; on a tie, the side without the lowest rank (rank 0 is the usual reference)."""
    lowest = min(r for side in sides for r in side)
    ordered = sorted(sides, key=lambda side: (len(side), lowest in side))
    return ordered[0]


def _divergence(pg: str, calls: dict[int, dict[int, _Call]], enqueued: dict[int, int | None],
                multi_pg: bool) -> tuple[str, list[int]] | None:
    """The first sequence number where the ranks of one group disagree, in words, and its culprits."""
    where = f" in process group {pg}" if multi_pg else ""
    ranks = sorted(calls)
    seqs = sorted({s for per in calls.values() for s in per})
    for seq in seqs:
        seen = {r: calls[r][seq] for r in ranks if seq in calls[r]}
        # A rank whose buffer no longer holds seq but which went past it agreed (ring buffer).
        never = [r for r in ranks if seq not in calls[r] and (enqueued[r] or 0) < seq]
        kinds: dict[tuple[str, str, str], list[int]] = {}
        for rank, call in seen.items():
            kinds.setdefault((call.op, call.sizes, call.dtype), []).append(rank)
        if len(kinds) > 1:
            sides = sorted(kinds.values())
            culprits = _culprit_side(sides)
            odd = seen[culprits[0]]
            others = [side for side in sides if side is not culprits]
            rest = "; ".join(f"{_plural(side)} enqueued {_describe(seen[side[0]], odd)} #{seq}" for side in others)
            return (f"{_plural(culprits)} enqueued {_describe(odd, seen[others[0][0]])} #{seq}{where} "
                    f"while {rest}", culprits)
        if never and seen:
            call = next(iter(seen.values()))
            last = ", ".join(f"rank {r} at #{enqueued[r]}" if enqueued[r] else f"rank {r} at none"
                             for r in never)
            return (f"{_plural(sorted(seen))} enqueued {call.op} #{seq}{where}; "
                    f"{_plural(never)} never reached it ({last})", never)
    return None


def _describe(call: _Call, other: _Call) -> str:
    """The op, plus sizes or dtype when that is what differs."""
    if call.op != other.op:
        return call.op
    if call.sizes != other.sizes:
        return f"{call.op} of {call.sizes}"
    return f"{call.op} ({call.dtype})"


def analyze(traces: dict[int, dict], source: str = "flight-recorder") -> CollectiveState | None:
    """Per-rank collective progress and the first disagreement, from each rank's trace.

    ``traces`` maps global rank -> parsed trace (see :func:`load_trace`). None when no
    trace holds a collective.
    """
    per_rank = {rank: _collectives(trace) for rank, trace in traces.items() if isinstance(trace, dict)}
    pgs = sorted({pg for groups in per_rank.values() for pg in groups}, key=lambda p: (len(p), p))
    if not pgs:
        return None
    rows: list[RankCollective] = []
    findings: list[tuple[str, list[int]]] = []
    for pg in pgs:
        calls = {rank: groups[pg] for rank, groups in per_rank.items() if pg in groups}
        enqueued: dict[int, int | None] = {}
        for rank in sorted(calls):
            last_enq, last_done = _status(traces[rank], pg, calls[rank])
            enqueued[rank] = last_enq
            last = calls[rank].get(last_enq) if last_enq else None
            rows.append(RankCollective(rank=rank, pg=pg, last_enqueued=last_enq, last_completed=last_done,
                                       op=last.op if last else None, sizes=last.sizes if last else None,
                                       dtype=last.dtype if last else None))
        if len(calls) > 1:
            found = _divergence(pg, calls, enqueued, multi_pg=len(pgs) > 1)
            if found:
                findings.append(found)
    culprits: list[int] = []
    for _, ranks in findings:
        culprits.extend(r for r in ranks if r not in culprits)
    return CollectiveState(source=source, ranks=tuple(rows),
                           divergence=findings[0][0] if findings else None,
                           culprits=tuple(sorted(culprits)))


def describe(state: CollectiveState) -> list[str]:
    """One line per rank and group, for the summary: ``rank 2 pg 0: enqueued #42 all_gather, completed #41``."""
    lines = []
    for row in state.ranks:
        enq = f"#{row.last_enqueued}" if row.last_enqueued is not None else "none"
        done = f"#{row.last_completed}" if row.last_completed is not None else "none"
        what = "".join(f" {part}" for part in (row.op, row.sizes, row.dtype) if part and part != "?")
        lines.append(f"rank {row.rank} pg {row.pg}: last enqueued {enq}{what}, last completed {done}")
    return lines
