"""The node wire format: one compact JSON document per node and poll (agents' lines, version 1).

A node sends its distinct stacks once each (the main thread's frames, a short signature and the
ranks that share it) and a small record per rank (state, phase, op, where, step, counters, GPU,
exit); every thread's frames only for the ranks asked for (culprits, the selected rank). Decoding
costs one frame list per distinct stack, not ranks x frames. The public Snapshot JSON
(``snapshot --json``) is unchanged; this format is only spoken between trainwatch processes.
"""

from __future__ import annotations

import base64
import dataclasses
import hashlib
import json
import types
import typing
from typing import Any, Literal

from ..snapshot import (
    CollectiveState, Frame, HostInfo, Job, Rank, Snapshot, SnapshotError, ThreadStack, Verdict, _decoder, _encode,
)

from ..record import Record

WIRE_KIND = "trainwatch-node"
WIRE_VERSION = 1
# Rank fields sent per rank: everything but the stacks (sent per distinct stack) and the host (the node's).
_RANK_FIELDS = tuple(f for f in dataclasses.fields(Rank) if f.name not in ("threads", "host"))
_DEFAULTS = {f.name: f.default for f in _RANK_FIELDS}


def signature(frames: tuple[Frame, ...]) -> str:
    """A short stable name for a stack: the same frames give the same signature on every node."""
    text = "\n".join(f"{f.file}:{f.line}:{f.function}:{int(f.native)}" for f in frames)
    return hashlib.blake2s(text.encode(), digest_size=6).hexdigest()


def _main(rank: Rank) -> ThreadStack | None:
    return next((t for t in rank.threads if t.is_main), rank.threads[0] if rank.threads else None)


def encode_node(snap: Snapshot, node: str, full_for: frozenset[int] = frozenset(), seq: int = 0) -> dict[str, Any]:
    """The compact document for one node's snapshot. ``full_for``: ranks whose every thread and
    log tail are sent (the node's own culprits' always are)."""
    stacks: dict[tuple, dict[str, Any]] = {}
    ranks: list[dict[str, Any]] = []
    full: dict[str, Any] = {}
    wanted = set(full_for) | set(snap.verdict.culprits)
    for rank in snap.ranks:
        record = {name: _encode(getattr(rank, name)) for name in _DEFAULTS
                  if getattr(rank, name) != _DEFAULTS[name] and (name != "log_tail" or rank.rank in wanted)}
        if rank.host and rank.host != snap.job.host:
            record["host"] = rank.host
        main = _main(rank)
        if main is not None and main.frames:
            key = (main.name, main.frames)
            entry = stacks.get(key)
            if entry is None:
                entry = stacks[key] = {"sig": signature(main.frames), "thread": main.name, "ranks": [],
                                       "frames": [[f.function, f.file, f.line, f.native] for f in main.frames]}
            entry["ranks"].append(rank.rank if rank.rank is not None else f"pid{rank.pid}")
            record["stack"] = entry["sig"]
        if rank.rank is not None and rank.rank in wanted and rank.threads:
            full[str(rank.rank)] = _encode(rank.threads)
        ranks.append(record)
    return {
        "kind": WIRE_KIND, "v": WIRE_VERSION, "node": node, "seq": seq,
        "job": _encode(snap.job), "taken_at": snap.taken_at, "window_s": snap.window_s,
        "verdict": _encode(snap.verdict), "stacks": list(stacks.values()), "ranks": ranks, "full": full,
        "hosts": _encode(snap.hosts), "collectives": _encode(snap.collectives),
        "warnings": list(snap.warnings), "notes": list(snap.notes),
    }


def encode_line(snap: Snapshot, node: str, full_for: frozenset[int] = frozenset(), seq: int = 0) -> str:
    """One line of an agent's stream."""
    return json.dumps(encode_node(snap, node, full_for, seq), separators=(",", ":"))


BUNDLE_PART = 48 * 1024  # bytes of bundle per line (64 KiB of base64)
SRUN_PIECE = 1024  # srun forwards a task's output in pieces of this many bytes, each labelled


def whole(line: str) -> str:
    """``line``, never a whole number of srun's pieces long: the viewer joins a piece of exactly
    that length with the task's next one (srun cut it), and a relay's lines are read the same way."""
    return line + " " if len(line) % SRUN_PIECE == 0 else line


def bundle_lines(node: str, bundle: str, data: bytes, error: str | None = None) -> list[str]:
    """A node's bundle (a .tar.gz) for request ``bundle``: its parts, then an end line saying how many
    (or why there is none)."""
    parts = [data[i:i + BUNDLE_PART] for i in range(0, len(data), BUNDLE_PART)] if error is None else []
    head = {"kind": "trainwatch-node", "v": WIRE_VERSION, "node": node, "bundle": bundle}
    lines = [json.dumps({**head, "part": n, "data": base64.b64encode(part).decode()}) for n, part in enumerate(parts)]
    end: dict[str, Any] = {**head, "end": True, "parts": len(parts), "bytes": len(data)}
    if error is not None:
        end["error"] = error
    return [*lines, json.dumps(end)]


def error_line(node: str, message: str, code: int, seq: int = 0) -> str:
    """An agent's line when it has no snapshot: why, and the exit status a one-shot call would give."""
    return json.dumps({"kind": WIRE_KIND, "v": WIRE_VERSION, "node": node, "seq": seq, "error": message,
                       "code": code}, separators=(",", ":"))


@dataclasses.dataclass(frozen=True, repr=False)
class NodeAnswer(Record):
    """One decoded line: the node's snapshot, or its error."""

    node: str
    seq: int
    snapshot: Snapshot | None = None
    error: str | None = None
    code: int | None = None


_JOB = _decoder(Job)
_HOSTS = _decoder(tuple[HostInfo, ...])
_COLLECTIVES = _decoder(CollectiveState | None)
_VERDICT = _decoder(Verdict)
_THREADS = _decoder(tuple[ThreadStack, ...])


def _scalar_kinds(tp: Any) -> tuple[type, ...] | None:
    """The JSON types a plain (optional) int, float, str, bool or vocabulary field may hold; None
    for any other field (a record, a tuple), which the generic decoder rebuilds."""
    args = [a for a in typing.get_args(tp) if a is not type(None)] if typing.get_origin(tp) in (
        typing.Union, types.UnionType) else [tp]
    if len(args) != 1:
        return None
    kind = args[0]
    if kind is float:
        return (int, float)
    if kind in (int, str, bool):
        return (kind,)
    return (str,) if typing.get_origin(kind) is Literal else None


# Every rank field, from Rank itself (no hand list): plain ones are checked, not rebuilt, so decoding
# stays cheap; the others (gpu, exit, log, kernel, children) go through the generic decoder.
_RANK_HINTS = typing.get_type_hints(Rank)
_SCALARS: dict[str, tuple[type, ...]] = {name: kinds for name, tp in _RANK_HINTS.items()
                                         if (kinds := _scalar_kinds(tp)) is not None}
_NESTED = {name: _decoder(tp) for name, tp in _RANK_HINTS.items() if name not in _SCALARS and name != "threads"}


_JOB_TUPLES = ("cmdline", "attempts", "pods")  # records (attempts, pods): empty here, else the generic decoder
_JOB_FIELDS = {f.name for f in dataclasses.fields(Job)}


def _job(data: dict[str, Any]) -> Job:
    """The node's job record: plain values, checked by the generic decoder only when unusual."""
    if not isinstance(data, dict) or data.get("attempts") or data.get("pods") or not all(
            isinstance(v, (str, int, float, bool, type(None), list)) for v in data.values()):
        return _JOB(data)  # unusual, or a restarted job's attempts (records): the generic decoder
    kwargs = {k: v for k, v in data.items() if k in _JOB_FIELDS}
    for key in _JOB_TUPLES:
        if key in kwargs:
            kwargs[key] = tuple(str(v) for v in kwargs[key])
    return Job(**kwargs)


def _rank(record: dict[str, Any], host: str, threads: tuple[ThreadStack, ...]) -> Rank:
    kwargs: dict[str, Any] = {"host": host, "threads": threads}
    for key, value in record.items():
        kinds = _SCALARS.get(key)
        if kinds is not None:
            if value is not None and not isinstance(value, kinds):
                raise TypeError(f"rank field {key}: {type(value).__name__}")
            kwargs[key] = value
        elif key in _NESTED:
            kwargs[key] = _NESTED[key](value)
    return Rank(**kwargs)


_STACKS: dict[tuple[str, str, int], tuple[ThreadStack, ...]] = {}  # the same stack on many nodes: built once
_STACKS_MAX = 8192


def _stack(entry: dict[str, Any]) -> tuple[ThreadStack, ...]:
    key = (entry["sig"], entry.get("thread") or "MainThread", len(entry["frames"]))
    found = _STACKS.get(key)
    if found is None:
        frames = tuple(Frame(fn, file, line, bool(native)) for fn, file, line, native in entry["frames"])
        if signature(frames) != entry["sig"]:
            raise ValueError(f"stack {entry['sig']} does not match its frames")
        found = (ThreadStack(key[1], frames=frames, is_main=True),)
        if len(_STACKS) >= _STACKS_MAX:
            _STACKS.clear()
        _STACKS[key] = found
    return found


def decode_node(data: Any) -> NodeAnswer:
    """A node's answer from its decoded JSON; raises SnapshotError when it is not one."""
    if not isinstance(data, dict) or data.get("kind") != WIRE_KIND:
        raise SnapshotError("not a trainwatch node answer")
    if data.get("v") != WIRE_VERSION:
        raise SnapshotError(f"node answer version {data.get('v')!r}; this trainwatch reads version {WIRE_VERSION} "
                            "(install the same trainwatch on every node)")
    node, seq = str(data.get("node") or "?"), int(data.get("seq") or 0)
    if "error" in data:
        return NodeAnswer(node, seq, error=str(data["error"]), code=data.get("code"))
    try:
        job = _job(data["job"])
        threads = {entry["sig"]: _stack(entry) for entry in data["stacks"]}
        full = {int(k): _THREADS(v) for k, v in (data.get("full") or {}).items()}
        ranks = []
        for record in data["ranks"]:
            number = record.get("rank")
            stacks = full.get(number) if number is not None and full else None
            ranks.append(_rank(record, record.get("host") or job.host, stacks or threads.get(record.get("stack"), ())))
        snap = Snapshot(job=job, ranks=tuple(ranks), verdict=_VERDICT(data["verdict"]),
                        hosts=_HOSTS(data.get("hosts") or []), collectives=_COLLECTIVES(data.get("collectives")),
                        warnings=tuple(data.get("warnings") or ()), notes=tuple(data.get("notes") or ()),
                        taken_at=float(data["taken_at"]), window_s=float(data["window_s"]), source="remote")
    except (TypeError, ValueError, KeyError, AttributeError) as exc:
        raise SnapshotError(f"damaged node answer: {exc}") from exc
    return NodeAnswer(node, seq, snapshot=snap)


def decode_line(line: str | bytes) -> NodeAnswer:
    try:
        data = json.loads(line)
    except json.JSONDecodeError as exc:
        raise SnapshotError(f"not JSON: {exc}") from exc
    return decode_node(data)
