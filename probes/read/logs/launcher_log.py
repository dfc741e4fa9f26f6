"""What torchrun's own log says of its ranks' deaths (torch.distributed.elastic, torch 2.x).

When a rank dies, the elastic agent tears the others down and logs the first failure:

    ... [ERROR] failed (exitcode: -9) local_rank: 2 (pid: 12345) of binary: /usr/bin/python3

and, as it exits, its failure summary, one block per failed rank, the root cause apart:

    Root Cause (first observed failure):
    [0]:
      time      : 2026-11-25_03:10:11
      host      : node1
      rank      : 2 (local_rank: 2)
      exitcode  : -9 (pid: 12345) (SIGKILL)
      error_file: <N/A>
      traceback : Signal 9 (SIGKILL) received by PID 12345

A negative exit code is a signal. Pure text parsing; the caller reads the file (bounded).
"""

from __future__ import annotations

import re
import signal
import time
from dataclasses import dataclass

from ...record import Record

# torch.distributed.elastic, as the agent is told to stop: "Received 15 death signal, shutting down
# workers" (torch 2.x; "Received Signals.SIGTERM death signal" before), then, as it exits,
# "SignalException: Process 9481 got signal: 15".
_DEATH_SIGNAL = re.compile(r"Received (?:Signals\.)?(SIG[A-Z]+|\d+) death signal|got signal: (\d+)")
_FAILED = re.compile(r"failed \(exitcode: (-?\d+)\) local_rank: (\d+) \(pid: (\d+)\)")
# torch's logging stamp at the start of the agent's lines: ``E1127 14:39:56.831000 6137 torch/…`` (local time, no year)
_STAMP = re.compile(r"^\[?[EWIFD](\d\d)(\d\d) (\d\d):(\d\d):(\d\d)(?:\.\d+)? ")
_BLOCK_START = re.compile(r"^\s*\[\d+\]:\s*$")
_TIME = re.compile(r"^\s*time\s*:\s*(\d{4}-\d\d-\d\d)_(\d\d:\d\d:\d\d)")
_RANK = re.compile(r"^\s*rank\s*:\s*(\d+) \(local_rank: (\d+)\)")
_EXITCODE = re.compile(r"^\s*exitcode\s*:\s*(-?\d+) \(pid: (\d+)\)")


@dataclass(frozen=True, repr=False)
class LauncherFailure(Record):
    """One rank's death as the launcher logged it."""

    pid: int
    local_rank: int | None
    rank: int | None = None
    code: int | None = None  # exit code of a normal exit
    signal: str | None = None  # a negative exit code, as a signal name
    at: float | None = None  # the launcher's time of the failure (its log line's stamp, or the summary's)
    root_cause: bool = False  # the summary's "first observed failure", or the agent's "failed" line


def failures(text: str) -> dict[int, LauncherFailure]:
    """Every failure the text reports, by PID; the summary's details win over the one-line report."""
    found: dict[int, LauncherFailure] = {}
    for match in _FAILED.finditer(text):
        code, local, pid = int(match.group(1)), int(match.group(2)), int(match.group(3))
        line = text[text.rfind("\n", 0, match.start()) + 1:match.start()]
        found[pid] = LauncherFailure(pid, local, None, *code_or_signal(code), at=stamped(line), root_cause=True)
    root = False
    block: dict[str, object] = {}
    for line in text.splitlines():
        if "Root Cause (first observed failure)" in line:
            root = True
        elif line.strip().startswith("Failures:"):
            root = False
        elif _BLOCK_START.match(line):
            block = {"root": root}
        elif m := _TIME.match(line):
            block["at"] = _epoch(f"{m.group(1)} {m.group(2)}")
        elif m := _RANK.match(line):
            block["rank"], block["local"] = int(m.group(1)), int(m.group(2))
        elif m := _EXITCODE.match(line):
            pid = int(m.group(2))
            code, sig = code_or_signal(int(m.group(1)))
            earlier = found.get(pid)
            found[pid] = LauncherFailure(pid, block.get("local"), block.get("rank"), code, sig,  # type: ignore[arg-type]
                                         (earlier.at if earlier else None) or block.get("at"),  # type: ignore[arg-type]
                                         bool(block.get("root")) or bool(earlier and earlier.root_cause))
    return found


def stop_signal(text: str) -> str | None:
    """The signal the launcher says it was stopped by (``SIGTERM``), the last it said; None when it
    says none (a launcher that tore its ranks down for a failure of theirs says no such thing)."""
    found = None
    for match in _DEATH_SIGNAL.finditer(text):
        name = match.group(1) or match.group(2)
        found = name if not name.isdigit() else code_or_signal(-int(name))[1]
    return found


def code_or_signal(code: int) -> tuple[int | None, str | None]:
    if code >= 0:
        return code, None
    try:
        return None, signal.Signals(-code).name
    except ValueError:
        return None, f"signal {-code}"


def stamped(line: str, now: float | None = None) -> float | None:
    """The unix time of a torch logging stamp at the start of ``line`` (local time, this year, or
    last year where this year's would lie more than a day ahead); None without one."""
    found = _STAMP.match(line)
    if found is None:
        return None
    now = time.time() if now is None else now
    month, day, hour, minute, second = (int(g) for g in found.groups())
    for year in (time.localtime(now).tm_year, time.localtime(now).tm_year - 1):
        try:
            at = time.mktime((year, month, day, hour, minute, second, 0, 0, -1))
        except (OverflowError, ValueError):
            continue
        if at <= now + 86400:
            return at
    return None


def _epoch(text: str) -> float | None:
    try:
        return time.mktime(time.strptime(text, "%Y-%m-%d %H:%M:%S"))
    except ValueError:
        return None
