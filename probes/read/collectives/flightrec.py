"""Cross-rank analysis of Flight Recorder traces: where do the ranks' collectives disagree?

Pure and torch-free. A trace is the dict torch's Flight Recorder dumps (JSON from
``_dump_fr_trace_json``, or the pickle of ``_dump_fr_trace`` / the on-timeout files):
``entries`` (``collective_seq_id``, ``profiling_name`` like ``"nccl:all_reduce"``,
``input_sizes``, ``input_dtypes``, ``process_group``, ``retired``, ``state``, ...) and, since
2.x, ``pg_status`` with each group's last enqueued / completed sequence number. Gloo dumps
from torch 2.13 carry an empty ``pg_config`` and never mark entries ``completed``; their
``pg_status`` and ``retired`` flags are used instead. ``pg_status`` values are strings in
the JSON dumps (``"543"``) and ints in the pickles; both are read.

``time_created_ns`` is wall-clock time, nanoseconds since the Unix epoch (torch stamps it with
``c10::getTime()``, the system clock): in the H100 recordings (torch 2.11) the pending
``all_reduce`` #544 was created 25 s after its launcher started, matching the job's
``--hang-after``, and 57 s before the snapshot taken during the hang. A rank's oldest
collective that is enqueued but not completed is its *pending* one; its age is how long the
rank has waited on it.

On NCCL jobs the generic ``_dump_fr_trace_json`` is empty: NCCL keeps its own recorder
(``_dump_nccl_trace_json``). The armed hook returns both (:func:`hook_reply_traces`).
"""

from __future__ import annotations

import io
import json
import pickle
from dataclasses import dataclass, replace

from ...snapshot import CollectiveState, RankCollective, age_text, compact_ranks


class TraceError(ValueError):
    """Bytes that are not a Flight Recorder trace."""


class _PlainUnpickler(pickle.Unpickler):
    """Flight Recorder pickles hold only dicts, lists, tuples, strings and numbers: refuse the rest."""

    def find_class(self, module: str, name: str):  # noqa: D102
        raise pickle.UnpicklingError(f"refusing to load {module}.{name} from a trace")


# Sources that fetch a trace on demand (hook socket, debug-info pipe, debug server), as opposed to
# a Flight Recorder dump file found on disk, which may be old.
ON_DEMAND = frozenset({"hook", "pipe", "debug-server"})


@dataclass(frozen=True)
class FoundTrace:
    """One rank's trace from one source, and when it was current: the fetch time for the hook
    and the debug server, the file's modification time for a dump file or the pipe's file."""

    trace: dict
    source: str  # "hook", "flight-recorder-file", "pipe", "debug-server"
    at: float


def fresher(old: FoundTrace | None, new: FoundTrace) -> FoundTrace:
    """The one rule for which of a rank's traces counts (live view and bundles alike): the one
    current at the later time; on a tie, the one fetched on demand."""
    if old is None or new.at > old.at:
        return new
    if new.at < old.at:
        return old
    return new if new.source in ON_DEMAND or old.source not in ON_DEMAND else old


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


HOOK_FORMAT = "trainwatch-fr/2"  # the hook's fr_trace reply: {"format", "nccl", "generic", "errors"}
_EPOCH_2001_S = 1e9  # a creation time before this is not wall-clock time: no age is derived from it


def hook_reply_traces(text: str) -> tuple[list[tuple[str, dict]], list[str]]:
    """The traces in a hook's ``fr_trace`` reply, ``[("nccl", trace), ("generic", trace)]``, and
    notes for the parts that failed or were empty. Hooks before ``HOOK_FORMAT`` replied with the
    generic trace alone; that is read too. Raises :class:`TraceError` on an unreadable reply."""
    try:
        outer = json.loads(text)
    except ValueError as exc:
        raise TraceError(f"not a Flight Recorder reply: {exc}") from None
    if not isinstance(outer, dict):
        raise TraceError("not a Flight Recorder reply (not a JSON object)")
    if outer.get("format") != HOOK_FORMAT:
        return ([("generic", outer)] if has_entries(outer) else []), []  # a hook before HOOK_FORMAT
    found, notes = [], []
    for name in ("nccl", "generic"):
        part = outer.get(name)
        error = (outer.get("errors") or {}).get(name)
        if not isinstance(part, str):
            if error:
                notes.append(f"{name} Flight Recorder: {error}")
            continue
        try:
            trace = load_trace(part.encode())
        except TraceError as exc:
            notes.append(f"{name} Flight Recorder: {exc}")
            continue
        if has_entries(trace):
            found.append((name, trace))
    return found, notes


def is_trace(data: bytes) -> bool:
    """Whether the bytes are a whole trace (a dump file still being written is not)."""
    try:
        load_trace(data)
    except TraceError:
        return False
    return True


def has_entries(trace: object) -> bool:
    return isinstance(trace, dict) and isinstance(trace.get("entries"), list) and bool(trace["entries"])


def merge_traces(traces: list[dict]) -> dict | None:
    """One trace from several recorders of one rank (NCCL and generic): each process group is
    taken from the first trace that holds it. None when none has entries."""
    merged: dict = {"entries": [], "pg_status": {}, "pg_config": {}}
    for trace in traces:
        if not has_entries(trace):
            continue
        groups = {_pg_key(e) for e in trace["entries"] if isinstance(e, dict)}
        new = groups - {_pg_key(e) for e in merged["entries"]}
        merged["entries"] += [e for e in trace["entries"] if isinstance(e, dict) and _pg_key(e) in new]
        status, config = trace.get("pg_status"), trace.get("pg_config")
        if isinstance(status, dict):
            merged["pg_status"].update({k: v for k, v in status.items() if k in new and k not in merged["pg_status"]})
        if isinstance(config, dict):  # keyed by group name, which gloo leaves empty: keep every one
            merged["pg_config"].update({k: v for k, v in config.items() if k not in merged["pg_config"]})
        merged.setdefault("version", trace.get("version"))
    return merged if merged["entries"] else None


@dataclass(frozen=True)
class _Call:
    seq: int
    op: str
    sizes: str
    dtype: str
    done: bool
    created: float | None = None  # unix seconds (time_created_ns)


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


def _dtypes(value: object) -> str:
    if not isinstance(value, (list, tuple)) or not value:
        return "?"
    return ",".join(str(d) for d in value)


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
            _dtypes(entry.get("input_dtypes")), done,
            _created(entry.get("time_created_ns")))
    return groups


def _created(value: object) -> float | None:
    """``time_created_ns`` as unix seconds; None when absent or not wall-clock time."""
    ns = _int(value)
    return ns / 1e9 if ns and ns / 1e9 > _EPOCH_2001_S else None


def _pending(calls: dict[int, _Call], enqueued: int | None, completed: int | None) -> tuple[int | None, _Call | None]:
    """The oldest collective enqueued but not completed: (its seq, its entry when still held)."""
    waiting = [c for s, c in calls.items() if s > (completed or 0) and not c.done]
    if waiting:
        oldest = min(waiting, key=lambda c: c.seq)
        return oldest.seq, oldest
    if enqueued is not None and enqueued > (completed or 0):
        return (completed or 0) + 1, calls.get((completed or 0) + 1)
    return None, None


def _status(trace: dict, pg: str, calls: dict[int, _Call]) -> tuple[int | None, int | None]:
    """(last enqueued, last completed) for one group: pg_status when present, else the entries."""
    statuses = trace.get("pg_status")
    status = statuses.get(pg) if isinstance(statuses, dict) else None
    if isinstance(status, dict):
        enqueued = _int(status.get("last_enqueued_collective"))
        completed = _int(status.get("last_completed_collective"))
        if enqueued is not None:
            return enqueued, completed
    enqueued = max(calls, default=None)
    completed = max((s for s, c in calls.items() if c.done), default=None)
    return enqueued, completed


def _never_finished(calls: dict[int, dict[int, _Call]]) -> int | None:
    """The first sequence number the ranks hold as different collectives: it cannot have completed
    anywhere, whatever a trace says. Gloo retires a collective that failed (timed out) as if it had
    completed, and its pg_status counts it completed: a dump written after the timeout would
    otherwise show the waiting ranks done and the odd rank behind."""
    for seq in sorted({s for per in calls.values() for s in per}):
        kinds = {(c.op, c.sizes, c.dtype) for per in calls.values() if (c := per.get(seq)) is not None}
        if len(kinds) > 1:
            return seq
    return None


def _plural(ranks: list[int]) -> str:
    return f"rank {ranks[0]}" if len(ranks) == 1 else f"ranks {compact_ranks(ranks)}"


def _culprit_side(sides: list[list[int]], completed: dict[int, int | None]) -> tuple[list[list[int]], str]:
    """The sides at fault, and why; none without a reason (never a coin toss).

    A reason is a minority (one side holds more ranks than any other: the rest are at fault),
    or Flight Recorder order (one side's last completed collective lags every other rank's).
    """
    biggest = max(len(side) for side in sides)
    majority = [side for side in sides if len(side) == biggest]
    if len(majority) == 1:
        return [side for side in sides if side is not majority[0]], "minority"
    done = {r: completed.get(r) if completed.get(r) is not None else -1 for side in sides for r in side}
    for side in sides:
        others = [done[r] for other in sides if other is not side for r in other]
        if max(done[r] for r in side) < min(others):
            return [side], "lags"
    return [], "tie"


def _divergence(pg: str, calls: dict[int, dict[int, _Call]], enqueued: dict[int, int | None],
                completed: dict[int, int | None], multi_pg: bool) -> tuple[str, list[int]] | None:
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
            return _disagreement(seq, where, seen, sorted(kinds.values()), completed)
        if never and seen:
            call = next(iter(seen.values()))
            last = ", ".join(f"rank {r} at #{enqueued[r]}" if enqueued[r] else f"rank {r} at none"
                             for r in never)
            return (f"{_plural(sorted(seen))} enqueued {call.op} #{seq}{where}; "
                    f"{_plural(never)} never reached it ({last})", never)
    return None


def _disagreement(seq: int, where: str, seen: dict[int, _Call], sides: list[list[int]],
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
    text = f"{odd}{where} while {rest}"
    if why == "lags":
        lag = max(completed.get(r) or 0 for r in bad[0])
        ahead = min(completed.get(r) or 0 for side in good for r in side)
        text += f" ({_plural(bad[0])} {'lags' if len(bad[0]) == 1 else 'lag'}: last completed #{lag} vs #{ahead})"
    return text, sorted(r for side in bad for r in side)


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
        unfinished = _never_finished(calls)
        enqueued: dict[int, int | None] = {}
        completed: dict[int, int | None] = {}
        for rank in sorted(calls):
            last_enq, last_done = _status(traces[rank], pg, calls[rank])
            if unfinished is not None and last_done is not None and last_done >= unfinished:
                last_done = unfinished - 1
                calls[rank] = {s: replace(c, done=False) if s >= unfinished else c for s, c in calls[rank].items()}
            enqueued[rank], completed[rank] = last_enq, last_done
            last = calls[rank].get(last_enq) if last_enq else None
            pending_seq, pending = _pending(calls[rank], last_enq, last_done)
            rows.append(RankCollective(rank=rank, pg=pg, last_enqueued=last_enq, last_completed=last_done,
                                       op=last.op if last else None, sizes=last.sizes if last else None,
                                       dtype=last.dtype if last else None, pending_seq=pending_seq,
                                       pending_op=pending.op if pending else None,
                                       pending_since=pending.created if pending else None))
        if len(calls) > 1:
            found = _divergence(pg, calls, enqueued, completed, multi_pg=len(pgs) > 1)
            if found:
                findings.append(found)
    culprits: list[int] = []
    for _, ranks in findings:
        culprits.extend(r for r in ranks if r not in culprits)
    return CollectiveState(source=source, ranks=tuple(rows),
                           divergence=findings[0][0] if findings else None,
                           culprits=tuple(sorted(culprits)))


def describe(state: CollectiveState, now: float | None = None) -> list[str]:
    """One line per rank and group, for the summary:
    ``rank 2 pg 0: last enqueued #42 all_gather, last completed #41, pending #42 all_gather for 27 s``."""
    lines = []
    for row in state.ranks:
        enq = f"#{row.last_enqueued}" if row.last_enqueued is not None else "none"
        done = f"#{row.last_completed}" if row.last_completed is not None else "none"
        what = "".join(f" {part}" for part in (row.op, row.sizes, row.dtype) if part and part != "?")
        line = f"rank {row.rank} pg {row.pg}: last enqueued {enq}{what}, last completed {done}"
        if row.pending_seq is not None:
            line += f", pending #{row.pending_seq}{' ' + row.pending_op if row.pending_op else ''}"
            if row.pending_since is not None and now is not None and now >= row.pending_since:
                line += f" for {age_text(now - row.pending_since)}"
        lines.append(line)
    return lines


def analyze_rows(rows: list[RankCollective], source: str) -> CollectiveState | None:
    """The same analysis over per-rank summaries (what nodes send in their snapshots), so a merged
    multi-node view finds disagreements between ranks of different nodes: each row becomes a
    minimal trace of its last enqueued and its pending collective, with its group's status."""
    traces: dict[int, dict] = {}
    for row in rows:
        trace = traces.setdefault(row.rank, {"entries": [], "pg_status": {}})
        trace["pg_status"][row.pg] = {"last_enqueued_collective": row.last_enqueued,
                                      "last_completed_collective": row.last_completed}
        calls = {row.last_enqueued: row.op, row.pending_seq: row.pending_op}
        for seq, op in calls.items():
            if seq is None or op is None:
                continue
            done = row.last_completed is not None and seq <= row.last_completed
            trace["entries"].append({"collective_seq_id": seq, "profiling_name": op, "process_group": [row.pg],
                                     "state": "completed" if done else "scheduled"})
    state = analyze(traces, source=source)
    return replace(state, ranks=tuple(rows)) if state is not None else None
