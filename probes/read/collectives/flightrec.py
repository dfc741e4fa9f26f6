"""Flight Recorder traces read into each rank's record of its collectives (where the ranks
disagree is judged in ``judge/collectives.py``).

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
from dataclasses import dataclass

from ...snapshot import CollectiveCall, CollectiveState, RankCollective, age_text
from ...record import Record


class TraceError(ValueError):
    """Bytes that are not a Flight Recorder trace."""


# Sources that fetch a trace on demand (hook socket, debug-info pipe, debug server), as opposed to
# a Flight Recorder dump file found on disk, which may be old.
ON_DEMAND = frozenset({"hook", "pipe", "debug-server"})


@dataclass(frozen=True, repr=False)
class FoundTrace(Record):
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
    import pickle  # here: most traces are JSON, and pickle is 2 ms of every command's start-up

    class PlainUnpickler(pickle.Unpickler):
        """Flight Recorder pickles hold only dicts, lists, tuples, strings and numbers: refuse the rest."""

        def find_class(self, module: str, name: str):  # noqa: D102
            raise pickle.UnpicklingError(f"refusing to load {module}.{name} from a trace")

    stripped = data.lstrip()
    try:
        if stripped.startswith(b"{"):
            trace = json.loads(data)
        else:
            trace = PlainUnpickler(io.BytesIO(data)).load()
    except (ValueError, pickle.UnpicklingError, EOFError, TypeError, IndexError, KeyError) as exc:
        raise TraceError(f"not a Flight Recorder trace: {exc}") from None
    if not isinstance(trace, dict) or not isinstance(trace.get("entries", []), list):
        raise TraceError("not a Flight Recorder trace (no 'entries' list)")
    return trace


HOOK_FORMAT = "trainwatch-fr/2"  # the hook's fr_trace reply: {"format", "nccl", "generic", "errors"}
_EPOCH_2001_S = 1e9  # a creation time before this is not wall-clock time: no age is derived from it
# The calls a row keeps: from this many before the last completed one (a disagreement sits at or just
# before it: gloo retires a collective that timed out as if it had completed), at most CALLS_KEPT.
CALLS_BEFORE = 4
CALLS_KEPT = 16


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


def _int(value: object) -> int | None:
    try:
        number = int(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return None
    return number if number >= 0 else None


# NCCL has no barrier: torch's barrier is an all_reduce of one element, recorded under this name.
_OP_NAMES = {"all_reduce_barrier": "barrier"}


def _op_name(profiling_name: object) -> str:
    """``"nccl:all_reduce"`` -> ``"all_reduce"``; ``"nccl:all_reduce_barrier"`` -> ``"barrier"``
    (the name the stacks give it)."""
    text = str(profiling_name or "?")
    name = text.split(":", 1)[1] if ":" in text else text
    return _OP_NAMES.get(name, name)


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


def _collectives(trace: dict) -> dict[str, dict[int, CollectiveCall]]:
    """Per process group: collective sequence number -> the call (p2p ops left out)."""
    groups: dict[str, dict[int, CollectiveCall]] = {}
    for entry in trace.get("entries") or []:
        if not isinstance(entry, dict) or entry.get("is_p2p"):
            continue
        seq = _int(entry.get("collective_seq_id"))
        if not seq:
            continue
        done = entry.get("state") == "completed" or bool(entry.get("retired"))
        groups.setdefault(_pg_key(entry), {})[seq] = CollectiveCall(
            seq, _op_name(entry.get("profiling_name")), _sizes(entry.get("input_sizes")),
            _dtypes(entry.get("input_dtypes")), done,
            _created(entry.get("time_created_ns")))
    return groups


def _created(value: object) -> float | None:
    """``time_created_ns`` as unix seconds; None when absent or not wall-clock time."""
    ns = _int(value)
    return ns / 1e9 if ns and ns / 1e9 > _EPOCH_2001_S else None


def _pending(calls: dict[int, CollectiveCall], enqueued: int | None,
             completed: int | None) -> tuple[int | None, CollectiveCall | None]:
    """The oldest collective enqueued but not completed: (its seq, its entry when still held)."""
    waiting = [c for s, c in calls.items() if s > (completed or 0) and not c.done]
    if waiting:
        oldest = min(waiting, key=lambda c: c.seq)
        return oldest.seq, oldest
    if enqueued is not None and enqueued > (completed or 0):
        return (completed or 0) + 1, calls.get((completed or 0) + 1)
    return None, None


def _status(trace: dict, pg: str, calls: dict[int, CollectiveCall]) -> tuple[int | None, int | None]:
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


def read_rows(traces: dict[int, dict], source: str = "flight-recorder") -> CollectiveState | None:
    """Each rank's collectives per process group, as its own trace records them: the last
    enqueued and completed, the pending one, and the recent calls (from ``CALLS_BEFORE`` before
    the last completed, at most ``CALLS_KEPT``). Where the ranks disagree is the judge's
    (``judge/collectives.py``). ``traces`` maps global rank -> parsed trace (see
    :func:`load_trace`). None when no trace holds a collective."""
    rows: list[RankCollective] = []
    for rank, trace in traces.items():
        if not isinstance(trace, dict):
            continue
        for pg, calls in _collectives(trace).items():
            last_enq, last_done = _status(trace, pg, calls)
            last = calls.get(last_enq) if last_enq else None
            pending_seq, pending = _pending(calls, last_enq, last_done)
            start = (last_done or 0) - CALLS_BEFORE
            kept = tuple(calls[s] for s in sorted(calls) if s >= start)[:CALLS_KEPT]
            rows.append(RankCollective(rank=rank, pg=pg, last_enqueued=last_enq, last_completed=last_done,
                                       op=last.op if last else None, sizes=last.sizes if last else None,
                                       dtype=last.dtype if last else None, pending_seq=pending_seq,
                                       pending_op=pending.op if pending else None,
                                       pending_since=pending.created if pending else None, calls=kept))
    if not rows:
        return None
    rows.sort(key=lambda r: (len(r.pg), r.pg, r.rank))
    return CollectiveState(source=source, ranks=tuple(rows))


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
