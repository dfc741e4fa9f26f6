"""One py-spy dump of a rank, shared by every trainwatch process on the node that wants it at once.

Each dump pauses the rank. Several trainwatch processes on one job (a `watch` guarding it, an
`attach` a person opened, a `snapshot` from a script) would multiply those pauses; so each leaves
its last dump of a rank in the node's runtime folder (``rundir.runtime_dir``), and one that wants
the same rank within ``FRESH_S`` takes that instead of pausing the rank again. Only what a dump of
its own would keep is written: the threads and the step-like integer locals (never other locals).
Best effort: without a usable folder each process dumps for itself. ``TRAINWATCH_SHARED_DUMPS=0``
turns it off (the benchmarks, which time each process's own dumps side by side).
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

from ...snapshot import ThreadStack, _decoder, _encode
from .. import runtime_files

FRESH_S = 1.0  # a dump this recent stands for one of our own
PREFIX = "dump-"
_THREADS = _decoder(tuple[ThreadStack, ...])


class SharedDump:
    """Another trainwatch process's dump of a rank: its threads, step-like locals, when, and how."""

    __slots__ = ("threads", "ints", "at", "native", "locals", "by")

    def __init__(self, threads: tuple[ThreadStack, ...], ints: dict | None, at: float, native: bool, locals: bool,
                 by: int | None) -> None:
        self.threads, self.ints, self.at, self.native, self.locals, self.by = threads, ints, at, native, locals, by


def _path(pid: int) -> Path | None:
    if os.environ.get("TRAINWATCH_SHARED_DUMPS") == "0":
        return None
    return runtime_files.rank_file(PREFIX, pid)


def fresh(pid: int, native: bool, locals: bool) -> SharedDump | None:
    """A dump of ``pid`` another trainwatch process took within ``FRESH_S``, that reads at least what
    this one wants (native frames, step-like locals); None otherwise."""
    path = _path(pid)
    if path is None:
        return None
    try:
        data = json.loads(path.read_bytes())
        at = float(data["at"])
        if data.get("by") == os.getpid() or not 0 <= time.time() - at <= FRESH_S:
            return None
        if (native and not data.get("native")) or (locals and not data.get("locals")):
            return None
        ints = {int(k): {str(n): int(v) for n, v in names.items()} for k, names in (data.get("ints") or {}).items()}
        return SharedDump(_THREADS(data["threads"]), ints if data.get("locals") else None, at,
                          bool(data.get("native")), bool(data.get("locals")), data.get("by"))
    except (OSError, ValueError, KeyError, TypeError, AttributeError):  # none, stale, or half-written by one that died
        return None


def leave(pid: int, threads: tuple[ThreadStack, ...], ints: dict | None, at: float, native: bool,
          locals: bool) -> None:
    """Leave this process's dump of ``pid`` for the others (atomically)."""
    path = _path(pid)
    if path is None:
        return
    data = {"at": at, "by": os.getpid(), "native": native, "locals": locals and ints is not None,
            "threads": _encode(threads), "ints": {str(k): v for k, v in (ints or {}).items()}}
    tmp = path.with_name(f".{path.name}.{os.getpid()}")
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as out:
            json.dump(data, out)
        os.replace(tmp, path)
    except OSError:  # a full disk, a removed folder: the others dump for themselves
        tmp.unlink(missing_ok=True)
    runtime_files.sweep()
