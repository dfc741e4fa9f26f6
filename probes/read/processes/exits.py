"""How ranks ended, read from everything they left: one place for the live view and the crash catcher.

Both the live view (:class:`ExitLedger`, through ``LocalSource``) and the headless crash catcher
(``watcher.CrashCatcher``) record exits with :func:`read_exit`. What a dead rank left: its
zombie's exit status, the kernel log (a fault naming its PID), an armed run's faulthandler file
and ``exit.json``, torchelastic's error file, and its log (``read/logs/ranklog.py``). A live rank whose
main thread is in interpreter shutdown while its log shows an uncaught exception carries that
exception (``judge/exits.py`` calls it crashed). Words and which rank died first: ``judge/exits.py``.
"""

from __future__ import annotations

import json
import re
import socket
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from ... import rundir
from ...observed import SIGNAL_REASONS, ObservedRank, abnormal
from ...redact import Redactor, scrub
from ...wording import how_ended
from ..logs import crashlog, launcher_log, library_words
from . import procfacts, procfs
from .discover import expected_local_ranks
from .exit_events import ExitEvents
from ..logs.kernlog import kernel_fault
from .process import JobProcesses, RankProcess
from ..logs.ranklog import LogReason, RankLogs
from ...snapshot import ExitInfo, LibraryError, ThreadStack
from ...record import Record

Clean = Callable[[str], str]
FORGOTTEN_KEPT = 4096  # restarted PIDs remembered as never to be shown again

_WORKERS = re.compile(r"DataLoader worker \(pids?\(?s?\)? ([\d, ]+)\)")


@dataclass(frozen=True, repr=False)
class CrashRecord(Record):
    """One rank's death with what it left behind (the crash catcher saves these as JSON)."""

    rank: int | None
    pid: int
    exit: ExitInfo
    exception: str | None = None  # the uncaught exception an armed rank recorded (exit.json)
    fault_trace: str | None = None  # its faulthandler dump
    log_tail: str = ""  # the telling tail of its log
    error_file: str | None = None  # our copy of the torchelastic error file
    saved_to: str | None = None
    log_path: str | None = None  # the log its reason was read from
    attempt: int | None = None  # a restarted job's attempt it belonged to (its TORCHELASTIC_RESTART_COUNT)


# -- recording an exit --------------------------------------------------------------------------
def infer_ranks(job: JobProcesses) -> list[RankProcess]:
    """The job's rank processes; one whose RANK could not be read (it died before anyone looked:
    a zombie's environment is gone) gets the one local rank nobody else has, when that is unique."""
    known = {p.rank for p in job.ranks if p.rank is not None}
    gaps = [(local, g) for local, g in sorted(expected_local_ranks(job).items()) if g not in known]
    unknown = [p for p in job.ranks if p.rank is None]
    if len(gaps) != 1 or len(unknown) != 1:
        return list(job.ranks)
    local, number = gaps[0]
    return [replace(p, rank=number, local_rank=local) if p.rank is None else p for p in job.ranks]


def log_path_of(proc: RankProcess, run_dir: Path | None, launcher_log: str | None = None) -> str | None:
    """The rank's log: the file behind its stdout/stderr, else an armed run's per-rank log, else
    (a rank already dead when first seen: a zombie has no open files) the launcher's log file,
    which its ranks share unless redirected; shared, only the rank's prefixed lines count there."""
    if proc.log_path:
        return proc.log_path
    if run_dir is not None and proc.rank is not None:
        path = rundir.rank_log_file(run_dir, proc.rank)
        if path.exists():
            return str(path)
    return launcher_log


def read_exit(proc: RankProcess, status: tuple[int | None, str | None] | None, *, now: float,
              run_dir: Path | None = None, logs: RankLogs | None = None, error_text: str = "",
              clean: Clean = scrub, launcher_log: str | None = None) -> CrashRecord:
    """How ``proc`` ended, from everything it left. ``status``: (code, signal) read from its
    zombie, or None when it was reaped before anyone looked. ``clean`` redacts the message."""
    code, sig = status if status else (None, None)
    fault, exit_rec = _armed_evidence(proc, run_dir)
    if sig is None and fault and fault.signal:
        sig = fault.signal
    if code is None and sig is None and exit_rec:
        code = int(_number(exit_rec.get("code")) or 1)
    kernel = kernel_fault(proc.pid) if code is None and sig is None else None
    if kernel:
        sig = kernel[0]
    at = min(_number((exit_rec or {}).get("at")) or _mtime_if(fault, run_dir, proc.rank) or now, now)
    if code == 0 and sig is None:
        return CrashRecord(proc.rank, proc.pid, ExitInfo(code=0, at=at))
    path = log_path_of(proc, run_dir, launcher_log)
    if run_dir is not None:
        time.sleep(0.05)  # let the armed run's tee helper write the rank's last words
    found = logs.reason(path, proc.rank, proc.local_rank) if logs else None
    exception = (exit_rec or {}).get("exception")
    exception = exception if isinstance(exception, str) else None
    candidates = [
        (crashlog.classify(fault.text), None, crashlog.user_frame(fault)) if fault else None,
        _from_exception(exception),
        (found.reason, found.message, found.frame) if found else None,
        _from_exception(_error_file_message(error_text)),
        (crashlog.classify(kernel[1]) or SIGNAL_REASONS.get(sig or ""), "kernel: " + kernel[1][:160], None)
        if kernel else None,
    ]
    library = _library_error(proc, path, logs, sig, exception, error_text)
    if library is not None:  # a library's words on a collective: named even where the log's own lines are not
        said = (crashlog.classify(library.words), library.words, None)
        # A mismatch the library saw says more than the abort it caused ("aborted", from the fault trace).
        if library.mismatch:
            candidates.insert(0, said)
        else:
            candidates.append(said)
    told = [c for c in candidates if c and c[0]]
    chosen = next((c for c in told if c[0] != crashlog.ABORTED), told[0] if told else (None, None, None))
    frame = job_frame((exit_rec or {}).get("frame")) or next((c[2] for c in candidates if c and c[2]), None)
    info = ExitInfo(code=code, signal=sig, at=at, reason=chosen[0], frame=frame,
                    message=clean(chosen[1]) if chosen[1] else None, library=_cleaned(library, clean))
    tail = logs.tail(path, proc.rank, proc.local_rank, 60) if logs and abnormal(info) else None
    restarts = proc.env.get("TORCHELASTIC_RESTART_COUNT", "")
    return CrashRecord(proc.rank, proc.pid, info, exception=exception, fault_trace=fault.text if fault else None,
                       log_tail="\n".join(tail or ()), log_path=path,
                       attempt=int(restarts) if restarts.isdigit() else None)


def _library_error(proc: RankProcess, path: str | None, logs: RankLogs | None, sig: str | None,
                   exception: str | None, error_text: str) -> LibraryError | None:
    """What a collective library said as the rank failed: in its log (a C++ abort's unprefixed
    lines count for a rank that died of SIGABRT), its recorded exception, its error file."""
    found = logs.library_error(path, proc.rank, proc.local_rank, aborted=sig == "SIGABRT") if logs else None
    for text in (exception, _error_file_message(error_text)):
        if found is None and text:
            found = library_words.library_error(text.splitlines())
    return found


def _cleaned(library: LibraryError | None, clean: Clean) -> LibraryError | None:
    return replace(library, words=clean(library.words)) if library is not None else None


def job_frame(recorded: object) -> str | None:
    """The frame an armed rank's hook recorded, when it is the job's own (an older hook recorded
    the innermost frame, often torch's), shortened as every frame shown is."""
    if not isinstance(recorded, str) or any(part in recorded for part in ("/site-packages/", "/dist-packages/",
                                                                           "/lib/python")):
        return None
    path, _, rest = recorded.partition(":")
    parts = path.replace("\\", "/").split("/")
    return f"{'/'.join(parts[-2:]) if len(parts) > 2 else path}:{rest}" if rest else recorded


def with_worker_ends(info: ExitInfo, events: ExitEvents | None) -> ExitInfo:
    """``DataLoader worker (pid(s) 812) exited unexpectedly``: how each worker itself ended, from
    the kernel's exit events (the rank's own message does not say; the worker is gone)."""
    message = info.message or ""
    found = _WORKERS.search(message)
    if not found or events is None or "signal" in message or "(worker " in message:
        return info
    ends = []
    for pid in (int(p) for p in re.findall(r"\d+", found.group(1))[:4]):
        heard = events.status(pid, wait=0.1)
        if heard is not None:
            ends.append(f"worker {pid} {how_ended(ExitInfo(*procfs.decode_wait_status(heard[0])))}")
    return replace(info, message=f"{message} ({'; '.join(ends)})") if ends else info


def _armed_evidence(proc: RankProcess, run_dir: Path | None) -> tuple[crashlog.FaultTrace | None, dict | None]:
    if run_dir is None or proc.rank is None:
        return None, None
    text = read_bounded(rundir.faulthandler_file(run_dir, proc.rank))
    own = proc.container_pid or proc.pid  # the hook writes getpid(): a container's rank, its own PID there
    fault = crashlog.parse_faulthandler(_section(text, own))
    exit_rec = rundir.read_json(rundir.exit_file(run_dir, proc.rank))
    if exit_rec and exit_rec.get("pid") != own:
        exit_rec = None
    return fault, exit_rec


def _from_exception(text: str | None) -> tuple[str | None, str | None, None] | None:
    """(reason, message) of an exception's text: a known fatal message, else its type."""
    if not text or not text.strip():
        return None
    lines = text.strip().splitlines()
    fatal = crashlog.fatal_line(lines)
    if fatal:
        return fatal[0], fatal[1], None
    kind = lines[0].split(":", 1)[0].strip()
    return (kind if kind.replace(".", "").replace("_", "").isalnum() else None), lines[0].strip(), None


def _error_file_message(text: str) -> str | None:
    """The message of torchelastic's error file (``{"message": {"message": "RuntimeError: …"}}``)."""
    if not text.strip():
        return None
    try:
        data = json.loads(text)
    except ValueError:
        return text
    message = data.get("message") if isinstance(data, dict) else None
    if isinstance(message, dict):
        message = message.get("message")
    return message if isinstance(message, str) else None


def redactor_for(pids: Iterable[int | None]) -> Clean:
    """Free-text scrubbing plus every secret value in these processes' environments (read now,
    not kept): for text about to leave trainwatch."""
    envs = [procfacts.read_environ(pid) or {} for pid in pids if pid]
    redactor = Redactor.from_envs(envs)
    return lambda text: redactor.text(scrub(text))


def redacted(record: CrashRecord, clean: Clean) -> CrashRecord:
    """The record with every free text passed through ``clean``."""
    info = replace(record.exit, message=clean(record.exit.message) if record.exit.message else None)
    return replace(record, exit=info, exception=clean(record.exception) if record.exception else None,
                   fault_trace=clean(record.fault_trace) if record.fault_trace else None,
                   log_tail=clean(record.log_tail))


def exited_rank(pid: int, number: int | None, info: ExitInfo, *, proc: RankProcess | None = None,
                cls: Any | None = None, threads: tuple[ThreadStack, ...] = (),
                host: str | None = None, log_path: str | None = None) -> ObservedRank:
    """A rank that exited, keeping where it was last seen (its last stacks and phase)."""
    return ObservedRank(
        rank=number, pid=pid, host=host or socket.gethostname(), local_rank=proc.local_rank if proc else None,
        container_pid=proc.container_pid if proc else None, seen="exited", phase=cls.phase if cls else "unknown", op=cls.op if cls else None,
        where=cls.where if cls else None, user_frame=cls.user_frame if cls else None,
        threads=threads, exit=info, log_path=log_path or (proc.log_path if proc else None),
    )


class ExitLedger:
    """Every exit of one job the live view has seen, across polls: what it records, the exited
    ranks, and live ranks whose log shows an uncaught exception while they linger."""

    def __init__(self, root_pid: int, run_dir: str | None = None) -> None:
        self.root_pid = root_pid
        self.run_dir = Path(run_dir) if run_dir else None
        self.logs = RankLogs()
        self._exits: dict[int, ExitInfo] = {}
        self._numbers: dict[int, int] = {}  # pid -> rank, for deaths the crash catcher saw
        self._procs: dict[int, RankProcess] = {}  # pid -> rank process, numbers inferred when unreadable
        self._raised: dict[int, ExitInfo] = {}  # live ranks whose log shows an uncaught exception
        self._logs_of: dict[int, str] = {}  # pid -> the log an exited rank's reason came from
        self._launcher_log: str | None = None
        self._stopped_by: str | None = None  # who stopped the job, once something said so
        self.exit_events: ExitEvents | None = None  # set by whoever listens (the crash catcher's)
        # PIDs of ranks restarted since: never shown again. Only the latest FORGOTTEN_KEPT: a record
        # for an older one no longer arrives, and the kernel reuses PIDs.
        self._forgotten: dict[int, None] = {}

    def note_job(self, job: JobProcesses) -> None:
        """Remember who writes which log (a file with several writers is shared)."""
        if job.run_dir and self.run_dir is None:
            self.run_dir = Path(job.run_dir)
        for proc in infer_ranks(job):
            self.logs.note_writer(proc.pid, proc.log_path)
            if proc.rank is not None:
                self._procs.setdefault(proc.pid, proc)
        if job.launcher_pid:
            self._launcher_log = procfs.log_file_of(job.launcher_pid) or self._launcher_log
            self.logs.note_writer(job.launcher_pid, self._launcher_log)

    def record(self, proc: RankProcess, status: tuple[int | None, str | None] | None, now: float) -> None:
        """``proc`` is gone or a zombie: record how it ended (once; again when a status turns up,
        or when its log gains the reason)."""
        if proc.rank is None:
            proc = self._procs.get(proc.pid, proc)
        if proc.pid in self._forgotten:
            return
        known = self._exits.get(proc.pid)
        if known is not None and (known.code is not None or known.signal is not None or status is None):
            if known.reason is None and known.code != 0:
                self._exits[proc.pid] = self._with_log_reason(proc, known)
            return
        record = read_exit(proc, status, now=now, run_dir=self.run_dir, logs=self.logs, clean=self._clean,
                           launcher_log=self._launcher_log)
        info = record.exit
        if record.log_path:
            self._logs_of[proc.pid] = record.log_path
        earlier = known or self._raised.pop(proc.pid, None)
        if earlier is not None:
            info = replace(info, at=min(earlier.at or now, info.at or now), reason=info.reason or earlier.reason,
                           message=info.message or earlier.message, frame=info.frame or earlier.frame)
        self._exits[proc.pid] = with_worker_ends(info, self.exit_events)

    def launcher_stop(self, launcher_pid: int | None) -> str | None:
        """``SIGTERM to the launcher``: the job was stopped from outside, as the launcher's own log
        (torchrun: "Received 15 death signal") or its exit status by a signal says; asked once ranks
        have ended (the log is read bounded), and kept once found."""
        if self._stopped_by is None:
            said = launcher_log.stop_signal(read_bounded(self._launcher_log, 512 * 1024)) if self._launcher_log else None
            heard = self.exit_events.status(launcher_pid) if self.exit_events is not None and launcher_pid else None
            signal = said or (procfs.decode_wait_status(heard[0])[1] if heard is not None else None)
            self._stopped_by = f"{signal} to the launcher" if signal else None
        return self._stopped_by

    def forget(self, pid: int) -> None:
        """A rank restarted under a new PID: its old process is not shown again, nor remembered."""
        self._forgotten[pid] = None
        while len(self._forgotten) > FORGOTTEN_KEPT:
            del self._forgotten[next(iter(self._forgotten))]
        for known in (self._exits, self._numbers, self._procs, self._raised, self._logs_of):
            known.pop(pid, None)

    def adopt(self, records: Iterable[CrashRecord]) -> None:
        """The crash catcher's findings (its zombie status, faulthandler frame) win over ours."""
        for record in records:
            if record.pid in self._forgotten:
                continue
            known = self._exits.get(record.pid)
            at = min(known.at or record.exit.at or 0.0, record.exit.at or 0.0) if known else record.exit.at
            self._exits[record.pid] = replace(record.exit, at=at)
            if record.rank is not None:
                self._numbers[record.pid] = record.rank

    def ranks(self, live: list[ObservedRank], job: JobProcesses, seen: Mapping[int, RankProcess],
              classes: Mapping[int, Any], stacks: Mapping[int, tuple[ThreadStack, ...]],
              now: float) -> list[ObservedRank]:
        """The live ranks (lingering ones with their exception) and the exited ones (the judge
        marks which died first)."""
        live = [self._lingering(rank, seen.get(rank.pid or -1), now) for rank in live]
        ranks = [replace(r, exit=self._raised[r.pid]) if r.pid in self._raised and r.exit else r for r in live]
        numbers = {r.rank for r in ranks}
        expected = expected_local_ranks(job)
        for pid, info in self._exits.items():
            proc = seen.get(pid)
            if proc is None or proc.rank is None:
                proc = self._procs.get(pid, proc)
            number = proc.rank if proc and proc.rank is not None else self._numbers.get(pid)
            if number is None:  # died before we read its RANK: the one missing local rank, if unique
                gaps = [g for g in expected.values() if g not in numbers]
                number = gaps[0] if len(gaps) == 1 else None
            if number is not None and number in numbers:
                continue  # restarted under a new PID
            ranks.append(exited_rank(pid, number, info, proc=proc, cls=classes.get(pid),
                                     threads=stacks.get(pid, ()), log_path=self._logs_of.get(pid)))
            numbers.add(number)
        return sorted(ranks, key=lambda r: (r.rank is None, r.rank if r.rank is not None else 0, r.pid or 0))

    def _lingering(self, rank: ObservedRank, proc: RankProcess | None, now: float) -> ObservedRank:
        if rank.phase != "exiting" or rank.pid is None:
            self._raised.pop(rank.pid or -1, None)
            return rank
        info = self._raised.get(rank.pid)
        if info is None:
            path = log_path_of(proc, self.run_dir, self._launcher_log) if proc else rank.log_path
            found = self.logs.reason(path, rank.rank, rank.local_rank)
            if found is None or not found.raised:
                return rank
            info = self._raised[rank.pid] = with_worker_ends(
                ExitInfo(at=now, reason=found.reason, frame=found.frame, message=self._clean(found.message)),
                self.exit_events)
        return replace(rank, exit=info)

    def _with_log_reason(self, proc: RankProcess, info: ExitInfo) -> ExitInfo:
        path = log_path_of(proc, self.run_dir, self._launcher_log)
        found: LogReason | None = self.logs.reason(path, proc.rank, proc.local_rank)
        if found is None:
            return info
        return replace(info, reason=found.reason, message=self._clean(found.message), frame=info.frame or found.frame)

    def _clean(self, text: str) -> str:
        return redactor_for([self.root_pid])(text)


def _section(text: str, pid: int) -> str:
    """The part of a faulthandler file written by process ``pid`` (each start adds a header)."""
    marker = f" pid {pid} started "
    start = text.rfind(marker)
    if start < 0:
        return text
    end = text.find("=== trainwatch:", start)
    return text[text.rfind("\n", 0, start) + 1:end if end >= 0 else None]


def _mtime_if(fault: crashlog.FaultTrace | None, run_dir: Path | None, rank: int | None) -> float | None:
    if not fault or run_dir is None or rank is None:
        return None
    try:
        return rundir.faulthandler_file(run_dir, rank).stat().st_mtime
    except OSError:
        return None


def read_bounded(path: Path | str, max_bytes: int = 1024 * 1024) -> str:
    """The last ``max_bytes`` of a file as text; empty when unreadable."""
    try:
        with open(path, "rb") as handle:
            handle.seek(0, 2)
            handle.seek(max(0, handle.tell() - max_bytes))
            return handle.read(max_bytes).decode("utf-8", errors="replace")
    except OSError:
        return ""


def _number(value: object) -> float | None:
    """A number from a JSON file someone else wrote; None for anything else."""
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


