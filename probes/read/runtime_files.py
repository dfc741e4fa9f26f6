"""Files that the trainwatch processes on one node leave each other about a rank process, in the
node's runtime folder (``rundir.runtime_dir``): named by the process's PID and start time (a PID
used again is another process), removed once that process has ended."""

from __future__ import annotations

import time
from pathlib import Path

from ..rundir import runtime_dir
from .processes import procfs

SWEEP_EVERY_S = 60.0  # files of processes that ended are removed this often, by whoever writes
PREFIXES = ("still-", "dump-")
_folder: Path | None = None
_last_sweep = 0.0


def start_ticks(pid: int) -> str | None:
    """When ``pid`` started (clock ticks since boot, as /proc/PID/stat says); None when gone."""
    stat = procfs.read_text(f"/proc/{pid}/stat")
    if not stat:
        return None
    fields = stat.rsplit(")", 1)[1].split()
    return fields[19] if len(fields) > 19 else None


def folder() -> Path:
    """The runtime folder, made and checked once per process. Raises OSError when unusable."""
    global _folder
    if _folder is None or not _folder.is_dir():
        _folder = runtime_dir()
    return _folder


def rank_file(prefix: str, pid: int) -> Path | None:
    """The file ``<prefix><pid>-<start>.json`` for process ``pid``; None when it is gone or no
    runtime folder can be had (then nothing is shared)."""
    start = start_ticks(pid)
    if start is None:
        return None
    try:
        return folder() / f"{prefix}{pid}-{start}.json"
    except OSError:
        return None


def sweep() -> None:
    """Remove the files of processes that ended (at most every ``SWEEP_EVERY_S``)."""
    global _last_sweep
    now = time.monotonic()
    if now - _last_sweep < SWEEP_EVERY_S or _folder is None:
        return
    _last_sweep = now
    for prefix in PREFIXES:
        for path in _folder.glob(f"{prefix}*.json"):
            pid, _, start = path.stem[len(prefix):].partition("-")
            if not pid.isdigit() or start_ticks(int(pid)) != start:
                path.unlink(missing_ok=True)
