"""What the trainwatch processes on one node tell each other of a rank's stillness.

A rank's main thread asleep in one wait since before anyone looked is the job's own evidence of how
long it has waited (``kernel_view.asleep_since``), but every ptrace attach wakes it: a second
trainwatch started on a hung job finds the thread asleep only since the first one's last dump.
So each live trainwatch process leaves what it established of each stuck rank in the node's
runtime folder (``rundir.runtime_dir``): one small file per rank process, named by its PID and
start time (a PID used again is another process), holding since when it saw no progress, until
when, and what said so. A newer process joins that to its own first look (``judge/judgement.py``).
Best effort: a folder that cannot be used leaves each process to its own watch.
"""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path

from ...observed import SharedStill, ThreadCounters
from .. import runtime_files

PREFIX = "still-"


def _path(pid: int) -> Path | None:
    return runtime_files.rank_file(PREFIX, pid)


def read_shared(pid: int) -> SharedStill | None:
    """What another trainwatch process left of ``pid``; None when nothing (or nothing readable)."""
    path = _path(pid)
    if path is None:
        return None
    try:
        data = json.loads(path.read_bytes())
        kinds = tuple((str(k), float(s), str(w)) for k, s, w in data.get("kinds", ()))
        counters = data.get("counters")
        if counters is not None:
            counters = ThreadCounters(**{**counters, "others": tuple(tuple(o) for o in counters.get("others", ()))})
        io = data.get("io")
        return SharedStill(float(data["since"]), float(data["until"]), kinds, data.get("by"), counters,
                           data.get("signature"), io=int(io) if io is not None else None)
    except (OSError, ValueError, KeyError, TypeError):  # none yet, or half-written by a process that died
        return None


def write_shared(pid: int, still: SharedStill) -> None:
    """Leave what this process established of ``pid`` (atomically: a reader never sees half)."""
    path = _path(pid)
    if path is None:
        return
    data = {"since": still.since, "until": still.until, "kinds": [list(k) for k in still.kinds], "by": os.getpid(),
            "counters": dataclasses.asdict(still.counters) if still.counters is not None else None,
            "signature": still.signature, "io": still.io}
    tmp = path.with_name(f".{path.name}.{os.getpid()}")
    try:
        tmp.write_text(json.dumps(data))
        os.replace(tmp, path)
    except OSError:  # a full disk or a removed folder: the next process relies on its own look
        tmp.unlink(missing_ok=True)
    runtime_files.sweep()


def forget_shared(pid: int) -> None:
    """``pid`` was seen progressing: what was left of its stillness no longer holds."""
    path = _path(pid)
    if path is not None:
        path.unlink(missing_ok=True)
