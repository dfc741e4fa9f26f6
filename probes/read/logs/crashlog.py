"""Read what a dying rank left behind: faulthandler traces and known fatal messages in logs."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from .logtail import read_tail
from ..stacks.stack_text import FAULTHANDLER_FRAME, THREAD_HEADER
from ...record import Record

# (reason shown to people, pattern) in priority order: the first match names the death.
# A reason may appear twice: its most telling line is tried first.
FATAL_PATTERNS: tuple[tuple[str, re.Pattern[str]], ...] = tuple(
    (reason, re.compile(pattern, re.IGNORECASE)) for reason, pattern in (
        ("CUDA device-side assert", r"device-side assert triggered"),
        ("CUDA out of memory", r"CUDA out of memory|OutOfMemoryError|CUDA error: out of memory"),
        ("NCCL: duplicate GPU (two ranks on one device)", r"Duplicate GPU detected"),
        # A library that saw the ranks' calls disagree, in its own words (read/logs/library_words.py)
        ("collective mismatch (gloo)", r"Received data size doesn't match expected size"),
        ("collective mismatch (c10d)", r"Detected mismatch between collectives on ranks"),
        ("NCCL watchdog timeout", r"Watchdog caught collective operation timeout"),
        ("NCCL watchdog timeout", r"ProcessGroupNCCL.*(?:timeout|timed out)|collective operation timeout"),
        ("NCCL error", r"NCCL error|ncclInternalError|ncclSystemError|ncclUnhandledCudaError|ncclRemoteError|"
                       r"ncclInvalidUsage|ncclInvalidArgument"),
        ("collective timeout", r"(?:gloo|c10d).*(?:Timed out|timeout)|DistBackendError.*timed out"),
        ("segmentation fault", r"Fatal Python error: Segmentation fault|Segmentation fault|SIGSEGV"),
        ("bus error", r"Fatal Python error: Bus error|SIGBUS"),
        ("aborted", r"Fatal Python error: Aborted|SIGABRT|terminate called after throwing"),
        ("floating point exception", r"Fatal Python error: Floating[- ]point exception|SIGFPE"),
        ("illegal instruction", r"Fatal Python error: Illegal instruction|SIGILL"),
        ("killed by the kernel OOM killer", r"Out of memory: Killed process|oom-kill:"),
        ("CUDA error", r"CUDA error: [^\n]+|AcceleratorError"),
        ("a peer rank closed its connection", r"Connection closed by peer|Connection reset by peer"),
    )
)

# SIGABRT is how a library ends a process it gave up on (NCCL's watchdog through std::terminate,
# an assert): where the rank's own words say why, they name the death, not the signal.
ABORTED = "aborted"

# mp.spawn's parent re-raises a child's exception with the child's traceback in its message,
# under this header and without any rank prefix (torch/multiprocessing/spawn.py).
SPAWN_REPORT = re.compile(r"^-- Process (?P<index>\d+) terminated with the following error:\s*$")
_REPORT_END = re.compile(r"^(Traceback |During handling|The above exception|\[?[WEIF]\d{4} |\[rank\d+\]|-- Process )")

_FATAL_SIGNALS = {
    "Segmentation fault": "SIGSEGV", "Bus error": "SIGBUS", "Aborted": "SIGABRT",
    "Floating-point exception": "SIGFPE", "Floating point exception": "SIGFPE",
    "Illegal instruction": "SIGILL",
}
_SECTION = "=== trainwatch:"


@dataclass(frozen=True, repr=False)
class FaultTrace(Record):
    """The last fatal-signal dump in a faulthandler file."""

    signal: str | None  # e.g. "SIGSEGV"
    frame: str | None  # "file:line function" where the crashing thread was
    function: str | None
    text: str  # the dump itself


def classify(text: str) -> str | None:
    """The first known fatal message in ``text``, as a short reason; None if none matches."""
    for reason, pattern in FATAL_PATTERNS:
        if pattern.search(text):
            return reason
    return None


def fatal_line(lines: list[str] | tuple[str, ...]) -> tuple[str, str] | None:
    """(reason, line) for the most telling fatal line: the first pattern that matches any line,
    and of its matches the last one (the latest word on the death)."""
    for reason, pattern in FATAL_PATTERNS:
        for line in reversed(lines):
            if pattern.search(line):
                return reason, line.strip()
    return None


def spawn_reports(lines: list[str] | tuple[str, ...]) -> list[tuple[int, int, int]]:
    """(process index, first line, end line) of each child traceback an mp.spawn parent printed:
    the header, the traceback, and its exception with its message (up to a blank line). The
    process index is the rank mp.spawn gave the child (its first argument)."""
    reports = []
    i = 0
    while i < len(lines):
        header = SPAWN_REPORT.match(lines[i])
        if header is None:
            i += 1
            continue
        end = i + 1
        if end < len(lines) and lines[end].startswith("Traceback "):
            end += 1
            while end < len(lines) and lines[end][:1] in (" ", "\t"):
                end += 1
        while end < len(lines) and lines[end].strip() and not _REPORT_END.match(lines[end]):
            end += 1  # the exception line and the rest of its message
        reports.append((int(header.group("index")), i, end))
        i = max(end, i + 1)
    return reports


def parse_faulthandler(text: str) -> FaultTrace | None:
    """The last "Fatal Python error" dump in a faulthandler file (or None: no fatal signal)."""
    start = text.rfind("Fatal Python error:")
    if start < 0:
        return None
    if text.find(_SECTION, start) >= 0:  # the rank was restarted after this dump: stale
        return None
    dump = text[start:]
    first = dump.splitlines()[0]
    signal = next((sig for name, sig in _FATAL_SIGNALS.items() if name in first), None)
    frame = function = None
    for path, lineno, function in _crashing_frames(dump.splitlines())[:1]:
        frame = f"{_short(path)}:{lineno} {function}"
    return FaultTrace(signal=signal, frame=frame, function=function if frame else None, text=dump.strip())


def _crashing_frames(lines: list[str]) -> list[tuple[str, str, str]]:
    """(file, line, function) of the crashing thread, innermost first. A signal raised on a thread
    that runs no Python (gloo's, NCCL's: ``std::terminate``, SIGABRT) has no "Current thread"
    section; the main thread, which faulthandler lists last, is then where the job was."""
    blocks: list[tuple[bool, list[tuple[str, str, str]]]] = []
    for line in lines:
        if THREAD_HEADER.match(line):
            blocks.append((line.startswith("Current thread"), []))
            continue
        found = FAULTHANDLER_FRAME.match(line)
        if found and blocks:
            blocks[-1][1].append(found.groups())  # type: ignore[arg-type]
    current = [frames for is_current, frames in blocks if is_current]
    if current:
        return current[0]
    return blocks[-1][1] if blocks else []


def user_frame(trace: FaultTrace, skip: tuple[str, ...] = ("/site-packages/", "/lib/python")) -> str | None:
    """The innermost crashing-thread frame outside the standard library and site-packages."""
    for path, lineno, function in _crashing_frames(trace.text.splitlines()):
        if not any(part in path for part in skip):
            return f"{_short(path)}:{lineno} {function}"
    return trace.frame


def tail(path: Path, lines: int = 40, max_bytes: int = 256 * 1024) -> str:
    """The last ``lines`` lines of a (possibly large, possibly missing) text file, as one string."""
    return "\n".join(read_tail(str(path), lines, max_bytes) or ())


def _short(path: str) -> str:
    parts = path.replace("\\", "/").split("/")
    return "/".join(parts[-2:]) if len(parts) > 2 else path
