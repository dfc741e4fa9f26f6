"""What a dead job left on disk, found and read (I/O only; the judge weighs it).

Given files and folders (gathered from every node, or a ``trainwatch run`` directory), this finds:

* Flight Recorder dumps: NCCL's on-timeout and pipe dumps (pickles, ``${TORCH_FR_DUMP_TEMP_FILE}<rank>``,
  by default ``/tmp/nccl_trace_rank_<rank>``), JSON dumps, the generic recorder's; the rank is the
  file name's last number (dumps do not say whose they are);
* a ``trainwatch run`` directory: each rank's ``hook.json``, own ``output.log``, ``faulthandler.log``,
  ``exit.json`` and ``last-words.json`` (stacks and Flight Recorder written as the rank was killed);
* logs (launcher output, SLURM ``slurm-*.out``, ``--log-dir`` files): each rank's lines by their
  ``[rankN]:`` prefix, torchrun's failure summary, NCCL watchdog timeout lines;
* torchelastic error files (``…/attempt_N/<local rank>/error.json``).

Everything is bounded: at most :data:`MAX_ENTRIES` directory entries looked at, the tail of each log,
dumps up to :data:`MAX_DUMP_BYTES`. What could not be read is kept as a note, never dropped silently.
"""

from __future__ import annotations

import json
import os
import re
import time
from dataclasses import dataclass, field
from pathlib import Path

from . import crashlog, launcher_log, library_words, ranklog
from ..collectives import flightrec, last_words
from .logtail import read_tail
from ... import rundir
from ...errors import BadLeftovers
from ...snapshot import compact_ranks
from ...record import Record

MAX_ENTRIES = 50_000  # directory entries looked at, in all
MAX_DEPTH = 8
MAX_DUMP_BYTES = 256 * 1024 * 1024
LOG_TAIL_BYTES = 4 * 1024 * 1024
HEAD_BYTES = 4096
SAME_JOB_SLACK_S = 120.0  # one job's dumps cover overlapping stretches of time; two jobs' do not

_DUMP_NAME = re.compile(r"(?:rank|trace|dump|fr)[^/]*?[_\-.]?(\d{1,7})(?:\.(?:pkl|pickle|json|bin))?$", re.I)
_LOG_SUFFIXES = (".log", ".out", ".err", ".txt")
_LAUNCHER_PID = re.compile(r"^[WEIF]\d{4} [\d:.]+ (\d+) torch/distributed/(?:elastic|run)", re.M)
_LOG_MARKERS = re.compile(r"\[rank\d+\]:|Traceback \(most recent call last\)|Watchdog caught|Fatal Python error|"
                          r"torch\.distributed|Root Cause \(first observed failure\)|ProcessGroup|"
                          r"terminated with the following error")


@dataclass(frozen=True, repr=False)
class LeftDump(Record):
    """One rank's Flight Recorder trace, where it was found and when it was written."""

    rank: int
    path: str
    trace: dict
    at: float  # the file's modification time, or when the last words were written
    source: str = "flight-recorder-file"  # or "last-words"


@dataclass(frozen=True, repr=False)
class LastWords(Record):
    """What an armed rank wrote as it was killed (``last-words.json``)."""

    rank: int
    path: str
    trigger: str  # SIGTERM, SIGINT, exception
    at: float | None
    pid: int | None
    host: str | None
    stacks: str  # every thread, faulthandler's format


@dataclass(repr=False)
class RankLeft(Record):
    """Everything found about one rank."""

    rank: int
    pid: int | None = None
    host: str | None = None
    lines: list[str] = field(default_factory=list)  # its log lines, prefixes stripped, file by file
    log_files: list[str] = field(default_factory=list)
    own_log: str | None = None
    last_words: LastWords | None = None
    fault_text: str | None = None  # its faulthandler file (fatal signals, on-demand dumps)
    exit_record: dict | None = None  # the hook's exit.json: its uncaught exception
    error_file: str | None = None  # torchelastic's error file message
    dumps: list[LeftDump] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    shared_abort: list[str] = field(default_factory=list)  # a C++ abort's unprefixed lines in a log it shared
    armed: bool = False  # `trainwatch run` armed it (its hook.json): its hook would have said how it ended
    stop_trace: bool = False  # faulthandler's trace at a stop signal (last-words.log) is there: a stop came


@dataclass(repr=False)
class Leftovers(Record):
    """What a dead job left, by rank, and what was looked at."""

    roots: tuple[str, ...]
    ranks: dict[int, RankLeft] = field(default_factory=dict)
    world_size: int | None = None
    failures: list[launcher_log.LauncherFailure] = field(default_factory=list)  # the launcher's report
    logs: dict[str, str] = field(default_factory=dict)  # path -> text tail (for the watchdog lines)
    run: dict | None = None  # run.json of a trainwatch run directory
    launcher_exit: dict | None = None
    host: str | None = None
    launcher_pid: int | None = None  # from the launcher's own log lines
    examined: int = 0  # directory entries looked at
    used: list[tuple[str, str]] = field(default_factory=list)  # (path, what it was read as)
    notes: list[str] = field(default_factory=list)
    newest: float = 0.0  # the newest modification time of anything used

    def rank(self, number: int) -> RankLeft:
        return self.ranks.setdefault(number, RankLeft(number))


def read_leftovers(paths: list[Path], max_entries: int = MAX_ENTRIES) -> Leftovers:
    """Find and read everything in ``paths``. Raises :class:`BadLeftovers` when nothing there is
    a job's evidence, or when the Flight Recorder dumps come from two different jobs."""
    found = Leftovers(roots=tuple(str(p) for p in paths))
    files: list[Path] = []
    for path in paths:
        if not path.exists():
            raise BadLeftovers(f"no such file or folder: {path}")
        files += _walk(path, found, max_entries)
    files.sort(key=_reading_order)  # attempt_2 after attempt_1 after attempt_0: a rank's latest words last
    run_dirs = sorted({f.parent for f in files if f.name == "run.json" and (f.parent / "ranks").is_dir()})
    inside_run = set()
    for run_dir in run_dirs:
        inside_run |= _read_run_dir(run_dir, found)
    for file in files:
        if file in inside_run or file.name in ("run.json", "launcher-exit.json", "bundle.json"):
            continue
        _read_file(file, found)
    if not found.used and len(paths) == 1 and paths[0].is_file():
        raise BadLeftovers(f"{paths[0]} is not a trainwatch bundle, nor anything a training job leaves "
                           "(a Flight Recorder dump, a log with a rank's lines, an error file)",
                           "open a bundle written by `trainwatch dump`, or the dead job's dumps, logs or "
                           "`trainwatch run` directory")
    if not found.used:
        looked = f"{found.examined:,} file{'s' if found.examined != 1 else ''}"
        stopped = [note for note in found.notes if note.startswith("stopped looking")]
        raise BadLeftovers(f"nothing a training job leaves was found among {looked} in {', '.join(found.roots)}"
                           + (f" ({stopped[0]})" if stopped else ""),
                           "give the folder of Flight Recorder dumps (nccl_trace_rank_*), the job's logs, "
                           "or its `trainwatch run` directory")
    _check_one_job(found)
    _world_size(found)
    return found


# -- finding files ------------------------------------------------------------------------------
def _walk(root: Path, found: Leftovers, max_entries: int) -> list[Path]:
    """Every regular file under ``root`` (or ``root`` itself), bounded; symlinks not followed."""
    if root.is_file():
        found.examined += 1
        return [root]
    out: list[Path] = []
    stack = [(root, 0)]
    while stack:
        folder, depth = stack.pop()
        try:
            entries = sorted(os.scandir(folder), key=lambda e: e.name)
        except OSError as exc:
            found.notes.append(f"{folder}: not readable ({exc.strerror or exc})")
            continue
        for entry in entries:
            found.examined += 1
            if found.examined > max_entries:
                found.notes.append(f"stopped looking after {max_entries:,} files: give the folders that hold "
                                   "the job's dumps and logs")
                return out
            try:
                if entry.is_dir(follow_symlinks=False):
                    if depth < MAX_DEPTH:
                        stack.append((Path(entry.path), depth + 1))
                elif entry.is_file(follow_symlinks=False):
                    out.append(Path(entry.path))
            except OSError as exc:
                found.notes.append(f"{entry.path}: not readable ({exc.strerror or exc})")
    return out


def _reading_order(path: Path) -> tuple:
    """The path with its numbers compared as numbers (``attempt_10`` after ``attempt_9``)."""
    return tuple(int(part) if part.isdigit() else part for part in re.split(r"(\d+)", str(path)))


def _head(path: Path) -> bytes | None:
    try:
        with open(path, "rb") as handle:
            return handle.read(HEAD_BYTES)
    except OSError:
        return None


def _tail(path: Path) -> list[str] | None:
    """The last :data:`LOG_TAIL_BYTES` of a text file, as lines."""
    lines = read_tail(str(path), lines=1_000_000, max_bytes=LOG_TAIL_BYTES)
    return list(lines) if lines is not None else None


def _mtime(path: Path) -> float:
    try:
        return path.stat().st_mtime
    except OSError:
        return 0.0


# -- one file -----------------------------------------------------------------------------------
def _read_file(path: Path, found: Leftovers) -> None:
    head = _head(path)
    if head is None:
        found.notes.append(f"{path}: not readable")
        return
    name_rank = _dump_rank(path.name)
    if name_rank is not None and (head[:1] == b"\x80" or head.lstrip()[:1] == b"{"):
        if _read_dump(path, name_rank, head, found):
            return
    if path.name == "error.json" and head.lstrip()[:1] == b"{":
        _read_error_file(path, found)
        return
    if b"\0" in head:
        return  # binary: not a log
    if path.suffix in _LOG_SUFFIXES or path.name.startswith("slurm-") or not path.suffix:
        _read_log(path, found)


def _dump_rank(name: str) -> int | None:
    match = _DUMP_NAME.search(name)
    return int(match.group(1)) if match else None


def _read_dump(path: Path, rank: int, head: bytes, found: Leftovers) -> bool:
    """Read a Flight Recorder dump; a damaged one is named (the rank did dump) and kept as a note."""
    try:
        size = path.stat().st_size
        if size > MAX_DUMP_BYTES:
            found.rank(rank).notes.append(f"{path}: {size >> 20} MiB, larger than a Flight Recorder dump: not read")
            return True
        trace = flightrec.load_trace(path.read_bytes())
    except OSError as exc:
        found.rank(rank).notes.append(f"{path}: not readable ({exc.strerror or exc})")
        return True
    except flightrec.TraceError as exc:
        if head[:1] != b"\x80" and b'"entries"' not in head:
            return False  # some other JSON file with a number in its name
        found.rank(rank).notes.append(f"rank {rank}'s Flight Recorder dump {path} is damaged ({exc}): not used")
        found.used.append((str(path), f"rank {rank} Flight Recorder dump (damaged)"))
        return True
    at = _mtime(path)
    found.rank(rank).dumps.append(LeftDump(rank, str(path), trace, at))
    found.used.append((str(path), f"rank {rank} Flight Recorder dump"))
    found.newest = max(found.newest, at)
    return True


def _read_error_file(path: Path, found: Leftovers) -> None:
    """torchelastic's error file; its folder is the local rank (``attempt_0/3/error.json``)."""
    try:
        data = json.loads(path.read_text(errors="replace"))
    except (OSError, ValueError) as exc:
        found.notes.append(f"{path}: not readable as an error file ({exc})")
        return
    message = data.get("message") if isinstance(data, dict) else None
    if isinstance(message, dict):
        message = message.get("message")
    if not isinstance(message, str) or not path.parent.name.isdigit():
        return
    local = int(path.parent.name)
    left = found.rank(local)
    left.error_file = message.strip()
    left.notes.append(f"rank {local}: rank number from its error file's folder (a local rank; "
                      "the global rank on a single node)")
    found.used.append((str(path), f"rank {local} torchelastic error file"))


_SRUN_LABEL = re.compile(r"^\s*(\d{1,6}): ")


def _srun_labels(lines: list[str]) -> list[str]:
    """``srun --label`` output (``  3: text``, the task number: the global rank, one task per rank)
    as ``[rank3]: text``; other files unchanged."""
    text = [line for line in lines if line.strip()]
    if not text or sum(bool(_SRUN_LABEL.match(line)) for line in text) * 2 < len(text):
        return lines
    return [_SRUN_LABEL.sub(lambda m: f"[rank{m.group(1)}]: ", line, count=1) for line in lines]


def _read_log(path: Path, found: Leftovers) -> None:
    lines = _tail(path)
    if lines is None:
        found.notes.append(f"{path}: not readable")
        return
    lines = _srun_labels(lines)
    text = "\n".join(lines)
    if not _LOG_MARKERS.search(text):
        return
    found.logs[str(path)] = text
    found.newest = max(found.newest, _mtime(path))
    failures = launcher_log.failures(text)
    found.failures += list(failures.values())
    launcher = _LAUNCHER_PID.search(text)
    if launcher and found.launcher_pid is None:
        found.launcher_pid = int(launcher.group(1))
    own = _own_rank(path)
    if own is not None:  # its own file: every line is its, torch's [rankN]: prefix or not
        _add_lines(found.rank(own), path, [ranklog.split_prefix(line)[2] for line in lines], own=True)
        found.used.append((str(path), f"rank {own}'s own log"))
        return
    ranks = sorted({r for r in (ranklog.split_prefix(line)[0] for line in lines) if r is not None})
    ranks += sorted({index for index, _, _ in crashlog.spawn_reports(lines)} - set(ranks))
    abort = library_words.abort_lines(lines)
    for number in ranks:
        _add_lines(found.rank(number), path, ranklog.rank_lines(lines, number, None, own=False), own=False)
        found.rank(number).shared_abort = abort or found.rank(number).shared_abort
    what = f"log of ranks {compact_ranks(ranks)}" if ranks else "log"
    found.used.append((str(path), what + (" with the launcher's failure report" if failures else "")))


def _own_rank(path: Path) -> int | None:
    """torchrun ``--log-dir``: ``<dir>/<run id>/attempt_N/<local rank>/stdout.log|stderr.log``."""
    if path.parent.name.isdigit() and path.parent.parent.name.startswith("attempt_"):
        return int(path.parent.name)
    return None


def _add_lines(left: RankLeft, path: Path, lines: list[str], own: bool) -> None:
    if not lines:
        return
    left.lines += lines
    left.log_files.append(str(path))
    if own:
        left.own_log = str(path)


# -- a trainwatch run directory ------------------------------------------------------------------
def _read_run_dir(run_dir: Path, found: Leftovers) -> set[Path]:
    """Read ``trainwatch run``'s directory; returns the files it accounted for."""
    found.run = rundir.read_json(rundir.run_json(run_dir))
    found.launcher_exit = rundir.read_json(rundir.launcher_exit_file(run_dir))
    found.host = (found.run or {}).get("host")
    found.used.append((str(run_dir), "trainwatch run directory"))
    taken: set[Path] = set()
    for folder in sorted((run_dir / "ranks").iterdir()) if (run_dir / "ranks").is_dir() else []:
        if not folder.name.isdigit():
            continue
        number = int(folder.name)
        left = found.rank(number)
        hook = rundir.read_json(rundir.hook_json(run_dir, number)) or {}
        left.pid, left.host = hook.get("pid"), hook.get("host")
        left.armed = bool(hook)
        left.stop_trace = rundir.last_words_log(run_dir, number).is_file() and \
            rundir.last_words_log(run_dir, number).stat().st_size > 0
        log = rundir.rank_log_file(run_dir, number)
        if log.is_file():
            lines = _tail(log) or []
            _add_lines(left, log, lines, own=True)
            found.logs[str(log)] = "\n".join(lines)
            found.newest = max(found.newest, _mtime(log))
        fault = rundir.faulthandler_file(run_dir, number)
        if fault.is_file():
            left.fault_text = "\n".join(_tail(fault) or [])
        left.exit_record = rundir.read_json(rundir.exit_file(run_dir, number))
        _read_last_words(rundir.last_words_file(run_dir, number), number, found)
        if left.last_words is None:
            _read_last_words_log(rundir.last_words_log(run_dir, number), number, found)
        taken |= {p for p in folder.iterdir() if p.is_file()}
    return taken


def _read_last_words(path: Path, rank: int, found: Leftovers) -> None:
    record = rundir.read_json(path) if path.is_file() else None
    if record is None:
        if path.is_file():
            found.rank(rank).notes.append(f"rank {rank}'s last words {path} are damaged: not used")
        return
    at = record.get("at") if isinstance(record.get("at"), (int, float)) else None
    words = LastWords(rank, str(path), str(record.get("trigger") or "?"), at, record.get("pid"),
                      record.get("host"), str(record.get("stacks") or ""))
    left = found.rank(rank)
    left.last_words = words
    found.used.append((str(path), f"rank {rank}'s last words ({words.trigger})"))
    found.newest = max(found.newest, at or 0.0)
    merged, notes = last_words.trace_of(record)
    left.notes += [f"rank {rank}'s last words: {note}" for note in notes]
    if merged is not None:
        left.dumps.append(LeftDump(rank, str(path), merged, at or _mtime(path), source="last-words"))


def _read_last_words_log(path: Path, rank: int, found: Leftovers) -> None:
    """faulthandler's trace at the stop signal, when the hook's thread could not write the rest."""
    text = "\n".join(_tail(path) or []) if path.is_file() else ""
    if not text.strip():
        return
    found.rank(rank).last_words = LastWords(rank, str(path), "a stop signal", _mtime(path), None, None, text)
    found.used.append((str(path), f"rank {rank}'s last stacks (faulthandler, at a stop signal)"))


# -- one job, and its size ----------------------------------------------------------------------
def _span(trace: dict) -> tuple[float, float] | None:
    """The first and last creation time (unix s) of a trace's entries."""
    times = [e.get("time_created_ns") for e in trace.get("entries") or [] if isinstance(e, dict)]
    stamps = [t / 1e9 for t in times if isinstance(t, int) and t > 1e18]
    return (min(stamps), max(stamps)) if stamps else None


def _check_one_job(found: Leftovers) -> None:
    """Refuse files from two runs, naming each run's files. One run's ranks were busy at the same
    time (their dumps' spans overlap), started their first collective together, and were a few
    collectives apart at any moment; two runs' dumps fall into spans apart from each other, or
    began their collectives apart, or were far apart in their numbering at the same moment, or
    have different world sizes; two torchrun ``--log-dir`` run folders are two runs."""
    _check_run_folders(found)
    _check_launcher_pids(found)
    dumps = [d for left in found.ranks.values() for d in left.dumps]
    spans = sorted(((s, d) for d in dumps if (s := _span(d.trace))), key=lambda item: item[0][0])
    clusters: list[list[LeftDump]] = []
    end = None
    for (start, stop), dump in spans:
        if end is None or start > end + SAME_JOB_SLACK_S:
            clusters.append([])
            end = stop
        clusters[-1].append(dump)
        end = max(end, stop)
    why = ""
    if len(clusters) == 1:
        clusters, why = _runs(clusters[0])
    if len(clusters) > 1:
        parts = "; ".join(f"{_when(c)}: {', '.join(sorted({Path(d.path).name for d in c})[:6])}" for c in clusters)
        raise BadLeftovers(f"these Flight Recorder dumps come from {len(clusters)} different runs ({parts})"
                           + (f": {why}" if why else ""), "give the dumps of one run only (one folder per run)")
    sizes = {}
    for dump in dumps:
        size = _default_group_size(dump.trace)
        if size:
            sizes.setdefault(size, []).append(Path(dump.path).name)
    if len(sizes) > 1:
        parts = "; ".join(f"world size {size}: {', '.join(sorted(set(names))[:6])}" for size, names in sorted(sizes.items()))
        raise BadLeftovers(f"these Flight Recorder dumps come from jobs of different sizes ({parts})",
                           "give the dumps of one job only")


RUN_START_SKEW_S = 30.0  # one run's ranks begin their first collective together (init_process_group waits for all)
RUN_AHEAD = 64  # collectives one rank can be ahead of another at one moment (async work in flight, DDP's buckets)
# An NCCL rank's host only enqueues its collectives: it runs on until something waits for the GPU
# or the launch queue (about a thousand kernels) is full. Recorded on an H200: ranks that never
# synchronised were 62 collectives ahead of one that waited at `.item()` every 10 steps, and 108
# ahead when the job hung (tests/fixtures/h200/nccl-paths).
NCCL_RUN_AHEAD = 4096


def _runs(dumps: list[LeftDump]) -> tuple[list[list[LeftDump]], str]:
    """Dumps whose spans overlap, split into runs by what identifies a run: when each began its
    first collective (#1 of the default group, where the dump still holds it), and where each was
    in its numbering at the same moment. Returns the runs and why they were told apart."""
    runs: list[list[LeftDump]] = []
    why = ""
    for dump in sorted(dumps, key=lambda d: _first_collective(d.trace) or 0.0):
        for run in runs:
            reason = _apart(run[0], dump)
            if reason is None:
                run.append(dump)
                break
            why = why or reason
        else:
            runs.append([dump])
    return runs, why if len(runs) > 1 else ""


def _apart(a: LeftDump, b: LeftDump) -> str | None:
    """Why two dumps cannot be one run's, or None."""
    first_a, first_b = _first_collective(a.trace), _first_collective(b.trace)
    if first_a is not None and first_b is not None and abs(first_a - first_b) > RUN_START_SKEW_S:
        return (f"{Path(a.path).name} began its first collective at {_clock(first_a)}, {Path(b.path).name} at "
                f"{_clock(first_b)} (one run's ranks begin together)")
    seq_a, seq_b = _numbering(a.trace), _numbering(b.trace)
    ahead = NCCL_RUN_AHEAD if _nccl(a.trace) or _nccl(b.trace) else RUN_AHEAD
    for at, seq in seq_a:
        other = [s for t, s in seq_b if t <= at]
        if not other or at > seq_b[-1][0]:
            continue
        if abs(seq - other[-1]) > ahead:
            return (f"at {_clock(at)} {Path(a.path).name} had enqueued collective #{seq} and {Path(b.path).name} "
                    f"#{other[-1]} (one run's ranks are a few collectives apart)")
    return None


def _nccl(trace: dict) -> bool:
    """True when the trace's collectives ran on NCCL (``profiling_name`` ``nccl:all_reduce``)."""
    return any(isinstance(e, dict) and str(e.get("profiling_name") or "").startswith("nccl:")
               for e in trace.get("entries") or [])


def _first_collective(trace: dict) -> float | None:
    """When the default group's collective #1 was enqueued (unix s), where the dump holds it."""
    for entry in trace.get("entries") or []:
        if isinstance(entry, dict) and entry.get("collective_seq_id") == 1 and str(entry.get("pg_id", 0)) == "0":
            stamp = entry.get("time_created_ns")
            if isinstance(stamp, int) and stamp > 1e18:
                return stamp / 1e9
    return None


def _numbering(trace: dict) -> list[tuple[float, int]]:
    """(when enqueued, collective #) of the default group's collectives, in time order."""
    found = []
    for entry in trace.get("entries") or []:
        if not isinstance(entry, dict) or entry.get("is_p2p") or str(entry.get("pg_id", 0)) != "0":
            continue
        stamp, seq = entry.get("time_created_ns"), entry.get("collective_seq_id")
        if isinstance(stamp, int) and stamp > 1e18 and isinstance(seq, int) and seq > 0:
            found.append((stamp / 1e9, seq))
    return sorted(found)


def _check_run_folders(found: Leftovers) -> None:
    """torchrun ``--log-dir`` keeps each run in a folder named for its run id: two are two runs."""
    runs: dict[str, list[str]] = {}
    for path, what in found.used:
        folder = _run_folder(Path(path))
        if folder is not None:
            runs.setdefault(str(folder), []).append(Path(path).name)
    if len(runs) > 1:
        parts = "; ".join(f"{folder}: {', '.join(sorted(set(names))[:4])}" for folder, names in sorted(runs.items()))
        raise BadLeftovers(f"these logs come from {len(runs)} different torchrun runs ({parts})",
                           "give the files of one run only (one run id's folder)")


def _check_launcher_pids(found: Leftovers) -> None:
    """Two launchers' failure summaries that give one rank two PIDs are two runs (a SLURM requeue,
    a job run again into the same folder): one launcher's log, restarts and all, is one job."""
    pids: dict[int, dict[int, str]] = {}  # rank -> PID -> the log that says so
    for path, text in found.logs.items():
        for failure in launcher_log.failures(text).values():
            if failure.rank is not None:
                pids.setdefault(failure.rank, {}).setdefault(failure.pid, path)
    for rank, by_pid in sorted(pids.items()):
        files = sorted(set(by_pid.values()))
        if len(by_pid) > 1 and len(files) > 1:
            named = "; ".join(f"{Path(path).name}: pid {pid}" for pid, path in sorted(by_pid.items()))
            raise BadLeftovers(f"these logs come from {len(files)} different runs: their launchers' summaries give "
                               f"rank {rank} different processes ({named})",
                               "give the files of one run only")


def _run_folder(path: Path) -> Path | None:
    """``<dir>/<run id>`` of a file in ``<dir>/<run id>/attempt_N/<local rank>/``."""
    for parent in path.parents:
        if parent.name.startswith("attempt_") and parent.name[8:].isdigit():
            return parent.parent
    return None


def _clock(at: float) -> str:
    return time.strftime("%H:%M:%S", time.localtime(at))


def _when(dumps: list[LeftDump]) -> str:
    start = min(s[0] for d in dumps if (s := _span(d.trace)))
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(start))


def _default_group_size(trace: dict) -> int | None:
    """The number of ranks of the default process group, from ``pg_config``."""
    config = trace.get("pg_config")
    if not isinstance(config, dict):
        return None
    for key in ("0", ""):
        group = config.get(key)
        if isinstance(group, dict) and isinstance(group.get("ranks"), str):
            try:
                return len(json.loads(group["ranks"]))
            except ValueError:
                return None
    return None


def _world_size(found: Leftovers) -> None:
    sizes = [size for left in found.ranks.values() for d in left.dumps if (size := _default_group_size(d.trace))]
    found.world_size = max(sizes, default=None)
