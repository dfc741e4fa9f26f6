"""Files that the trainwatch processes on one node leave each other about a rank process, in the
node's runtime folder (``rundir.runtime_dir``): named by the process's PID and start time (a PID
used again is another process), removed once that process has ended. A process in a PID namespace
of its own (a container, a pod) is named by its PID there and that namespace, the same name from
inside the container and from its host: two containers' PID 7 are two processes."""

from __future__ import annotations

import time
from pathlib import Path

from ..rundir import runtime_dir
from .processes import namespaces, procfs

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
    """The file ``<prefix><pid>-<start>-<pid namespace>.json`` for process ``pid``; None when it is
    gone or no runtime folder can be had (then nothing is shared)."""
    name = _name(pid)
    if name is None:
        return None
    try:
        return folder() / f"{prefix}{name}.json"
    except OSError:
        return None


def _space(pid: int | str) -> str | None:
    """The inode number of ``pid``'s PID namespace."""
    space = (namespaces.namespace(pid, "pid") or "").removeprefix("pid:").strip("[]")
    return space if space.isdigit() else None


def _name(pid: int) -> str | None:
    """``7-9345-4026532301``: the process's PID in its own PID namespace, its start (clock ticks
    since boot), that namespace. The same from any namespace it is seen from; two containers' PID 7
    started at one tick are two names."""
    start, space = start_ticks(pid), _space(pid)
    if start is None or space is None:
        return None
    return f"{namespaces.inner_pid(pid) or pid}-{start}-{space}"


def sweep() -> None:
    """Remove the files of processes that ended (at most every ``SWEEP_EVERY_S``)."""
    global _last_sweep
    now = time.monotonic()
    if now - _last_sweep < SWEEP_EVERY_S or _folder is None:
        return
    _last_sweep = now
    ours = _space("self")
    foreign: tuple[set[str], set[str]] | None = None  # processes in other namespaces: read once a sweep, if needed
    for prefix in PREFIXES:
        for path in _folder.glob(f"{prefix}*.json"):
            name = path.stem[len(prefix):]
            parts = name.split("-")
            if len(parts) != 3 or not parts[0].isdigit():
                gone = True  # an older trainwatch's name, or none of ours
            elif parts[2] == ours:
                gone = start_ticks(int(parts[0])) != parts[1]
            else:
                if foreign is None:
                    foreign = _foreign_names(ours)
                if parts[2] in foreign[1]:
                    gone = name not in foreign[0]
                else:  # a namespace none of whose processes we see (a container beside ours): not ours to judge
                    gone = _age(path) > UNSEEN_KEPT_S
            if gone:
                path.unlink(missing_ok=True)


UNSEEN_KEPT_S = 86400.0  # a file about a process in a namespace no process here is in goes after a day


def _age(path: Path) -> float:
    try:
        return time.time() - path.stat().st_mtime
    except OSError:
        return 0.0


def _foreign_names(ours: str | None) -> tuple[set[str], set[str]]:
    """The names (``_name``) of the processes seen here that live in a PID namespace not ours, and
    those namespaces."""
    names, spaces = set(), set()
    for pid in procfs.pids():
        space = _space(pid)
        if space not in (ours, None):
            spaces.add(space)
            name = _name(pid)
            if name:
                names.add(name)
    return names, spaces
