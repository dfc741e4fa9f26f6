"""When each log file last grew, and how often it grew while we watched: one ``stat`` per file and look.

Cheap evidence that is there on first attach: a file's mtime says when its writer last wrote.
How often it *usually* writes is learnt by watching: every look that finds the file bigger (or
replaced) records one more interval between writes. Writes closer together than our looks
merge into one, so the intervals learnt are never shorter than the polling period: an
overestimate, which only makes a silence look less suspicious.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from statistics import median

INTERVALS_KEPT = 16


@dataclass(frozen=True)
class LogGrowth:
    """One file's growth as last seen."""

    path: str
    size: int
    last_write_at: float  # unix time of the last write (the file's mtime)
    intervals: tuple[float, ...] = ()  # seconds between the writes seen while watching, oldest first
    grew: bool = False  # bigger (or replaced) since the previous look

    @property
    def usual_every_s(self) -> float | None:
        """The median interval between writes seen while watching; None before any was seen."""
        return median(self.intervals) if self.intervals else None

    @property
    def longest_s(self) -> float | None:
        return max(self.intervals) if self.intervals else None


@dataclass
class _History:
    ino: int
    size: int
    mtime: float
    intervals: list[float] = field(default_factory=list)


class LogGrowthWatch:
    """Per path, the growth history across looks; lives as long as a live view or a snapshot window."""

    def __init__(self) -> None:
        self._files: dict[str, _History] = {}

    def look(self, path: str | None) -> LogGrowth | None:
        """Stat ``path`` now and update its history; None when there is no file to read."""
        if not path:
            return None
        try:
            st = os.stat(path)
        except OSError:
            return None
        mtime = st.st_mtime_ns / 1e9
        seen = self._files.get(path)
        grew = False
        if seen is None:
            seen = self._files[path] = _History(st.st_ino, st.st_size, mtime)
        elif st.st_ino != seen.ino or st.st_size != seen.size:  # grew, or was truncated or replaced
            if mtime > seen.mtime:
                seen.intervals = (seen.intervals + [mtime - seen.mtime])[-INTERVALS_KEPT:]
            seen.ino, seen.size, seen.mtime = st.st_ino, st.st_size, max(mtime, seen.mtime)
            grew = True
        return LogGrowth(path, seen.size, seen.mtime, tuple(seen.intervals), grew)

    def forget(self, path: str) -> None:
        self._files.pop(path, None)
