"""A rank's own words in a log file: which lines are its, why it died, and what is worth showing.

Ranks often share one file (``torchrun … > log 2>&1``). torch prefixes a rank's uncaught
exception and its C++ warnings with ``[rankN]:``; torchrun's ``--tee`` prefixes every line with
``[<role><local rank>]:`` (``[default1]:``), or ``[N]:`` with a ``${rank}`` prefix template.
Prefixed lines belong to that rank. Unprefixed lines belong to a rank only when the file is its
own (``--log-dir``/``--redirect``, ``trainwatch run``, a single process's ``> log``), or when
mp.spawn's parent quotes the rank's traceback ("-- Process N terminated with the following error:").
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from . import crashlog, library_words
from ...redact import scrub
from ...snapshot import LibraryError
from .logtail import read_tail
from ..stacks.stack_text import TRACEBACK_FRAME
from ...record import Record

TAIL_LINES = 400
TAIL_BYTES = 64 * 1024
MESSAGE_CHARS = 400

_PREFIX = re.compile(r"^\[(?:rank(?P<rank>\d+)|(?P<role>[A-Za-z_][A-Za-z_-]*?)(?P<local>\d+)|(?P<glob>\d+))\]:[ ]?")
_TRACEBACK = "Traceback (most recent call last):"
_EXCEPTION = re.compile(r"^(?P<type>[A-Za-z_][\w.]*)(?::(?: (?P<msg>.*))?)?$")
# A line that starts something else: the end of an exception's message.
_NEXT = re.compile(r"^(Traceback |During handling|The above exception|\[?[WEIF]\d{4} |\[rank\d+\]|Exception in thread )")
# torchrun's and mp.spawn's own report of a failed child, never a rank's
_LAUNCHER_EXCEPTIONS = ("ChildFailedError", "ProcessRaisedException", "ProcessExitedException")
_NOISE = re.compile(
    r"Failed to initialize NumPy|_ARRAY_API not found|compiled using NumPy 1\.x|NumPy 2\.\d+ as it may crash"
    r"|^\S.*:\d+: \w*Warning: "  # a Python warning (its source line follows, indented)
    r"|^\s*warnings\.warn\("
    r"|^\[?[WI]\d{4} [\d:. ]+\d+ \S*torch/distributed/run\.py"  # torchrun's OMP_NUM_THREADS banner
    r"|^\[[WI]\d{4} [^\]]*\] Warning: "  # torch's C++ warnings
)
_PY_WARNING = re.compile(r"^\S.*:\d+: \w*Warning: ")


@dataclass(frozen=True, repr=False)
class LogReason(Record):
    """Why a rank's log says it died: the classified reason and the line that says so."""

    reason: str  # "CUDA device-side assert", or the exception type: "RuntimeError"
    message: str  # the fatal line, e.g. "RuntimeError: boom"
    raised: bool  # an uncaught Python exception (a traceback), not only a fatal line
    frame: str | None = None  # innermost frame of the traceback in the user's code
    lines: tuple[str, ...] = ()  # the traceback and message, or the fatal line


def split_prefix(line: str) -> tuple[int | None, int | None, str]:
    """(global rank, local rank, text) of a line; prefixes may stack (``[default1]:[rank1]: …``)."""
    rank = local = None
    while True:
        match = _PREFIX.match(line)
        if not match:
            return rank, local, line
        if match.group("rank") is not None:
            rank = int(match.group("rank"))
        elif match.group("glob") is not None:
            rank = int(match.group("glob"))
        else:
            local = int(match.group("local"))
        line = line[match.end():]


def rank_lines(lines: Iterable[str], rank: int | None, local_rank: int | None, own: bool,
               unprefixed: bool | None = None) -> list[str]:
    """The lines of ``rank`` (prefixes stripped). Unprefixed lines count when the file is the
    rank's ``own``, or when ``unprefixed`` asks for them (a shared file's context for display)."""
    keep_plain = own if unprefixed is None else unprefixed
    lines = list(lines)
    spawned = {n: index for index, start, end in crashlog.spawn_reports(lines) for n in range(start, end)}
    out = []
    for n, line in enumerate(lines):
        g, loc, text = split_prefix(line)
        if n in spawned and g is None and loc is None:  # mp.spawn's parent quoting a rank's traceback
            g = spawned[n]
        if g is None and loc is None:
            if keep_plain:
                out.append(text)
        elif (g is not None and g == rank) or (g is None and loc is not None and loc == local_rank):
            out.append(text)
    return out


@dataclass(frozen=True, repr=False)
class _Block(Record):
    """One traceback in a log: its lines, the exception it ends in and the frame that raised it."""

    start: int
    end: int  # exclusive: traceback, exception line, and its continuation
    exception: str
    kind: str
    frame: str | None
    in_thread: bool


def _tracebacks(lines: Sequence[str]) -> list[_Block]:
    blocks = []
    i = 0
    while i < len(lines):
        if not lines[i].startswith(_TRACEBACK):
            i += 1
            continue
        j, frame = i + 1, None
        while j < len(lines) and lines[j][:1] in (" ", "\t"):
            found = TRACEBACK_FRAME.match(lines[j])
            if found:
                frame = _user_frame(found) or frame
            j += 1
        match = _EXCEPTION.match(lines[j]) if j < len(lines) else None
        if match is None:
            i = j
            continue
        end = j + 1
        while end < len(lines) and end - j < 12 and lines[end].strip() and not _NEXT.match(lines[end]):
            end += 1
        in_thread = i > 0 and lines[i - 1].startswith("Exception in thread ")
        blocks.append(_Block(i, end, lines[j].strip(), match.group("type"), frame, in_thread))
        i = end
    return blocks


def _user_frame(found: re.Match) -> str | None:
    path = found.group("file")
    if any(part in path for part in ("/site-packages/", "/dist-packages/", "/lib/python")) or path.startswith("<"):
        return None
    parts = path.replace("\\", "/").split("/")
    return f"{'/'.join(parts[-2:]) if len(parts) > 2 else path}:{found.group('line')} {found.group('func')}"


def reason_of(lines: Sequence[str]) -> LogReason | None:
    """Why these lines (one rank's) say it died: the last uncaught exception of its main thread,
    classified by :data:`crashlog.FATAL_PATTERNS` or named by its type; else the last known fatal
    line (a watchdog timeout, a fatal signal); None when the log says nothing fatal."""
    blocks = [b for b in _tracebacks(lines)
              if not b.in_thread and not b.kind.endswith(_LAUNCHER_EXCEPTIONS)]
    if blocks:
        block = blocks[-1]
        text = [line for line in lines[block.start:block.end] if not line.startswith(("  ", "\t"))]
        fatal = crashlog.fatal_line(text)
        reason, message = fatal if fatal else (block.kind, block.exception)
        return LogReason(reason, _cap(message), True, block.frame, tuple(lines[block.start:block.end]))
    fatal = crashlog.fatal_line(list(lines))
    if fatal is None:
        return None
    frame = None
    if "Fatal Python error:" in fatal[1]:
        trace = crashlog.parse_faulthandler("\n".join(lines))
        frame = crashlog.user_frame(trace) if trace else None
    return LogReason(fatal[0], _cap(fatal[1]), False, frame, (fatal[1],))


def is_noise(line: str) -> bool:
    """Output nobody needs first: warnings, torchrun's banner, torch's NumPy complaint."""
    return bool(_NOISE.search(line)) or set(line.strip()) == {"*"}


def without_noise(lines: Iterable[str]) -> list[str]:
    """The lines that say something: no warnings (nor the source line a Python warning quotes),
    no torchrun banner, no torch NumPy complaint, no blank lines."""
    quiet: list[str] = []
    skip_source = False
    for line in lines:
        if skip_source and line[:1] in (" ", "\t"):
            skip_source = False
            continue
        skip_source = bool(_PY_WARNING.search(line))
        if not is_noise(line) and line.strip():
            quiet.append(line)
    return quiet


def telling_tail(lines: Sequence[str], reason: LogReason | None, count: int = 30) -> tuple[str, ...]:
    """What to show of a log: the error first (traceback or fatal line), then the last
    ``count`` lines of output without noise (and without repeating the error)."""
    quiet = without_noise(lines)
    if reason is None:
        return tuple(quiet[-count:])
    shown = set(reason.lines)
    rest = [line for line in quiet if line not in shown]
    return ("── error ──", *reason.lines, "── last output ──", *rest[-count:])


def _cap(text: str) -> str:
    text = text.strip()
    return text if len(text) <= MESSAGE_CHARS else text[:MESSAGE_CHARS - 1] + "…"


class RankLogs:
    """The job's log files as its ranks see them: bounded tail reads, re-read only when a file's
    size or mtime changed, so asking every poll is cheap."""

    def __init__(self, lines: int = TAIL_LINES, max_bytes: int = TAIL_BYTES) -> None:
        self.lines, self.max_bytes = lines, max_bytes
        self._files: dict[str, tuple[tuple, tuple[str, ...] | None]] = {}
        self._reasons: dict[tuple, tuple[tuple, LogReason | None]] = {}
        self._writers: dict[str, set[int]] = {}
        self._shown: dict[tuple, tuple[tuple, tuple[str, ...] | None]] = {}

    def note_writer(self, pid: int, path: str | None) -> None:
        """``pid`` writes to ``path`` (a rank, or the launcher): a file with two writers is shared."""
        if path:
            self._writers.setdefault(path, set()).add(pid)

    def own(self, path: str) -> bool:
        return len(self._writers.get(path, ())) <= 1

    def read(self, path: str) -> tuple[str, ...] | None:
        """The file's last lines (bounded), from cache while it is unchanged; None if unreadable."""
        key = _stat_key(path)
        cached = self._files.get(path)
        if cached is not None and key is not None and cached[0] == key:
            return cached[1]
        lines = read_tail(path, self.lines, self.max_bytes) if key is not None else None
        self._files[path] = (key or (), lines)
        return lines

    def reason(self, path: str | None, rank: int | None, local_rank: int | None) -> LogReason | None:
        """Why ``rank``'s lines in ``path`` say it died (cached per file version)."""
        if not path:
            return None
        lines = self.read(path)
        key = (path, rank, local_rank, self.own(path))
        version = self._files.get(path, ((), None))[0]
        cached = self._reasons.get(key)
        if cached is not None and cached[0] == version:
            return cached[1]
        found = reason_of(rank_lines(lines or (), rank, local_rank, self.own(path)))
        self._reasons[key] = (version, found)
        return found

    def library_error(self, path: str | None, rank: int | None, local_rank: int | None,
                      aborted: bool = False) -> LibraryError | None:
        """What a collective library said in ``rank``'s lines of ``path`` (``library_words``).
        ``aborted``: the rank died of SIGABRT, so a C++ abort's unprefixed lines in a shared file
        (C++ writes no rank prefix) are taken as its own."""
        if not path:
            return None
        lines = self.read(path) or ()
        mine = rank_lines(lines, rank, local_rank, self.own(path))
        if aborted and not self.own(path):
            mine = [*mine, *library_words.abort_lines(lines)]
        return library_words.library_error(mine)

    def tail(self, path: str | None, rank: int | None, local_rank: int | None,
             count: int = 30) -> tuple[str, ...] | None:
        """The telling tail of ``rank``'s part of ``path``; None when unreadable."""
        if not path:
            return None
        lines = self.read(path)
        if lines is None:
            return None
        own = self.own(path)
        mine = rank_lines(lines, rank, local_rank, own)
        shown = mine if own else rank_lines(lines, rank, local_rank, own, unprefixed=True)
        return telling_tail(shown, reason_of(mine), count)

    def shown_tail(self, path: str | None, rank: int | None, local_rank: int | None) -> tuple[str, ...] | None:
        """:meth:`tail` with what looks secret masked (it travels in the snapshot: JSON, other nodes,
        bundles), cached per file version: asking for every rank every poll is cheap."""
        if not path:
            return None
        key = (path, rank, local_rank, self.own(path))
        version = _stat_key(path)
        cached = self._shown.get(key)
        if cached is not None and version is not None and cached[0] == version:
            return cached[1]
        tail = self.tail(path, rank, local_rank)
        shown = tuple(scrub(line) for line in tail) if tail is not None else None
        self._shown[key] = (version or (), shown)
        return shown


def _stat_key(path: str) -> tuple | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (st.st_ino, st.st_size, st.st_mtime_ns)
