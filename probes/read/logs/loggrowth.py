"""When each log file last grew, and how often it grew while we watched: one ``stat`` per file and look.

Cheap evidence that is there on first attach: a file's mtime says when its writer last wrote.
How often it *usually* writes is learnt by watching: every look that finds the file bigger (or
replaced) records one more interval between writes. Writes closer together than our looks
merge into one, so the intervals learnt are never shorter than the polling period: an
overestimate, which only makes a silence look less suspicious.

A tqdm-style progress bar that is the file's last line (HF Trainer, accelerate, Lightning) says
how often the job writes from the first look: its rate (``4.50it/s``, ``8.02s/it``). A finished
bar (``4/4``) is not a rhythm: "Loading checkpoint shards" ends long before training does.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field

from .logtail import read_tail
from ...median import median
from ...record import Record

INTERVALS_KEPT = 16
MIN_INTERVALS = 3  # intervals between writes seen before the file's rhythm is reported
BAR_TAIL_BYTES = 4096
# "| 45/100 [00:10<00:12,  4.50it/s, loss=0.1]", "| 7/? [01:03,  9.02s/it]", "45it [00:10, 4.50it/s]"
_BAR = re.compile(r"(?:\|\s*(?P<n>\d+)/(?P<total>\d+|\?)\s*|\d+\w*\s)\[(?:\d+:)?\d+:\d+(?:<[^,\]]*)?,\s*"
                  r"(?P<rate>\d+(?:\.\d+)?)(?P<unit>[A-Za-z]+/s|s/[A-Za-z]+)")


@dataclass(frozen=True, repr=False)
class LogGrowth(Record):
    """One file's growth as last seen."""

    path: str
    size: int
    last_write_at: float  # unix time of the last write (the file's mtime)
    intervals: tuple[float, ...] = ()  # seconds between the writes seen while watching, oldest first
    grew: bool = False  # bigger (or replaced) since the previous look
    bar_s: float | None = None  # seconds per update of the unfinished progress bar that is the last line

    @property
    def usual_every_s(self) -> float | None:
        """The median interval between writes seen while watching; None before ``MIN_INTERVALS``."""
        return median(self.intervals) if len(self.intervals) >= MIN_INTERVALS else None

    @property
    def longest_s(self) -> float | None:
        """The longest interval between writes seen while watching; None before ``MIN_INTERVALS``."""
        return max(self.intervals) if len(self.intervals) >= MIN_INTERVALS else None


@dataclass(repr=False)
class _History(Record):
    """One log file as last seen (its identity and size) and the gaps between its recent growths."""

    ino: int
    size: int
    mtime: float
    intervals: list[float] = field(default_factory=list)
    bar_s: float | None = None


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
            seen = self._files[path] = _History(st.st_ino, st.st_size, mtime, bar_s=bar_seconds(path))
        elif st.st_ino != seen.ino or st.st_size != seen.size:  # grew, or was truncated or replaced
            if mtime > seen.mtime:
                seen.intervals = (seen.intervals + [mtime - seen.mtime])[-INTERVALS_KEPT:]
            seen.ino, seen.size, seen.mtime = st.st_ino, st.st_size, max(mtime, seen.mtime)
            seen.bar_s = bar_seconds(path)
            grew = True
        return LogGrowth(path, seen.size, seen.mtime, tuple(seen.intervals), grew, seen.bar_s)

    def forget(self, path: str) -> None:
        self._files.pop(path, None)


def bar_rate(line: str) -> float | None:
    """Seconds per update of the unfinished progress bar on ``line``; None when it shows none."""
    found = None
    for found in _BAR.finditer(line):
        pass
    if found is None or (found["n"] and found["total"] != "?" and int(found["n"]) >= int(found["total"])):
        return None
    rate = float(found["rate"])
    if found["unit"].startswith("s/"):
        return rate
    return 1.0 / rate if rate > 0 else None


def bar_seconds(path: str) -> float | None:
    """The rate of the progress bar that is the file's last non-empty line (bounded read)."""
    lines = read_tail(path, 5, BAR_TAIL_BYTES) or ()
    last = next((line for line in reversed(lines) if line.strip()), "")
    return bar_rate(last)
