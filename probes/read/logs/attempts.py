"""How each attempt of a restarted job ended, from its launcher's log (torchrun ``--max-restarts``).

When a rank fails, torchrun's agent tears the group down and logs the first failure of that
attempt, once per attempt (``torch/distributed/elastic/multiprocessing/api.py``)::

    E1127 14:53:26.369000 24853 torch/…/api.py:1002] failed (exitcode: 1) local_rank: 2 (pid: 24858) of binary: …

then, with restarts left, starts the group again (``TORCHELASTIC_RESTART_COUNT`` counts them in
the ranks' environment). So the log is a history: the lines up to each ``failed`` line are one
attempt's, and the failing rank's own words in them (its ``[rankN]:`` traceback in a shared log)
say how it ended. With ``--log-dir``, each attempt's ranks write ``attempt_<n>/<local rank>/``
(``stdout.log``, ``stderr.log``, ``error.json``) instead: read there.

Only reading; what a repeating end means is judged in ``judge/restarts.py``.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Mapping, Sequence
from pathlib import Path

from . import launcher_log, ranklog
from .logtail import read_tail
from ...snapshot import AttemptEnd, ExitInfo

TAIL_BYTES = 1024 * 1024  # a crash loop's attempts each leave a traceback: the last ones are enough
_FAILED = re.compile(r"failed \(exitcode: (-?\d+)\) local_rank: (\d+) \(pid: (\d+)\)")
_ATTEMPT_DIR = re.compile(r"^(?P<base>.*)/attempt_(?P<n>\d+)/(?P<local>\d+)/(?:stdout|stderr)\.log$")


def attempt_ends(lines: Sequence[str], ranks_of: Mapping[int, int] | None = None,
                 started_at: float | None = None, log_dir: str | None = None) -> tuple[AttemptEnd, ...]:
    """Each attempt's end in a launcher's log, oldest first, numbered in order (0 = the first in
    these lines). ``ranks_of``: local rank -> global rank on this node (the global rank is the
    local one when not given: one node). ``log_dir``: where ``--log-dir`` put each attempt's files."""
    ends: list[AttemptEnd] = []
    begin, since = 0, started_at
    for index, line in enumerate(lines):
        found = _FAILED.search(line)
        if found is None:
            continue
        code, local = int(found.group(1)), int(found.group(2))
        number = len(ends)
        rank = (ranks_of or {}).get(local, local)
        said = _said(lines[begin:index], rank, local) or _said_in_dir(log_dir, number, local)
        status, signal = launcher_log.code_or_signal(code)
        at = launcher_log.stamped(line)
        info = ExitInfo(code=status, signal=signal, at=at, reason=said[0] if said else None,
                        message=said[1] if said else None, frame=said[2] if said else None, source="launcher log")
        ends.append(AttemptEnd(attempt=number, rank=rank, exit=info, started_at=since))
        begin, since = index + 1, at
    return tuple(ends)


def _said(lines: Sequence[str], rank: int, local: int) -> tuple[str, str, str | None] | None:
    found = ranklog.reason_of(ranklog.rank_lines(lines, rank, local, own=False))
    return (found.reason, found.message, found.frame) if found else None


def _said_in_dir(log_dir: str | None, attempt: int, local: int) -> tuple[str, str, str | None] | None:
    """The rank's own files of that attempt (``--log-dir``): its error file, else its stderr."""
    if not log_dir:
        return None
    folder = Path(log_dir) / f"attempt_{attempt}" / str(local)
    try:
        data = json.loads((folder / "error.json").read_text(errors="replace"))
    except (OSError, ValueError):
        data = None
    message = data.get("message") if isinstance(data, dict) else None
    message = message.get("message") if isinstance(message, dict) else message
    for name in ("stderr.log", "stdout.log"):
        lines = read_tail(str(folder / name), 400, 64 * 1024)
        found = ranklog.reason_of(list(lines)) if lines else None
        if found is not None:
            return found.reason, found.message, found.frame
    if isinstance(message, str) and message.strip():
        first = message.strip().splitlines()[0]
        return first.split(":", 1)[0], first, None
    return None


def max_restarts(cmdline: Sequence[str]) -> int:
    """torchrun's ``--max-restarts`` (0, its default, when not given as a number)."""
    for i, arg in enumerate(cmdline):
        key, _, value = arg.partition("=")
        if key in ("--max-restarts", "--max_restarts"):
            value = value or (cmdline[i + 1] if i + 1 < len(cmdline) else "")
            return int(value) if value.isdigit() else 0
    return 0


def log_dir_of(rank_log: str | None) -> str | None:
    """The ``--log-dir`` run folder a rank's own log lies in (``<dir>/<run id>/attempt_N/<local>/stdout.log``)."""
    found = _ATTEMPT_DIR.match(rank_log or "")
    return found.group("base") if found else None


NEEDLE = b"failed (exitcode: "
OVERLAP = len(NEEDLE)


class AttemptLog:
    """A launcher's log read for its attempts. Each look reads only what the file gained (a job's
    output grows it all the time) and parses the tail again only when a failure line came."""

    def __init__(self) -> None:
        self._where: tuple[str, int] | None = None  # (path, inode) read so far
        self._size = 0
        self._ends: tuple[AttemptEnd, ...] = ()

    def ends(self, path: str | None, ranks_of: Mapping[int, int] | None = None, started_at: float | None = None,
             log_dir: str | None = None) -> tuple[AttemptEnd, ...]:
        if not path:
            return ()
        try:
            st = os.stat(path)
        except OSError:
            return self._ends
        where = (path, st.st_ino)
        fresh = where != self._where or st.st_size < self._size
        if not fresh and st.st_size == self._size:
            return self._ends
        start = 0 if fresh else max(0, self._size - OVERLAP, st.st_size - TAIL_BYTES)
        try:
            with open(path, "rb") as handle:
                handle.seek(start)
                gained = handle.read(min(st.st_size - start, TAIL_BYTES))
        except OSError:
            return self._ends
        self._where, self._size = where, st.st_size
        if fresh or NEEDLE in gained:
            lines = read_tail(path, 1_000_000, TAIL_BYTES) or ()
            self._ends = attempt_ends(list(lines), ranks_of, started_at, log_dir)
        return self._ends
