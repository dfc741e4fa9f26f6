"""Headless watching: catch rank deaths cheaply and often, and bundle evidence once per problem.

:class:`CrashCatcher` reads only /proc (every ~0.2 s) so it sees a rank die before the
launcher tears the others down; the TUI can call its ``tick()`` between its own polls.
:class:`Watcher` adds the heavier snapshots (``LocalSource.poll()``) and the bundles.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import shutil
import socket
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import psutil

from trainwatch.probes import crashlog, procfs, rundir
from trainwatch.probes.groups import group_ranks
from trainwatch.probes.kernlog import kernel_fault
from trainwatch.probes.snapshot import ExitInfo, Job, Rank, Snapshot, Verdict
from trainwatch.probes.verdict import judge

HANG_KINDS = frozenset({"hang", "straggler", "mismatch", "rendezvous"})

# `trainwatch watch` exit statuses (documented in its --help)
EXIT_CLEAN, EXIT_PROBLEM, EXIT_CRASH = 0, 10, 11


@dataclass(frozen=True)
class CrashRecord:
    """One rank's abnormal death, with what it left behind."""

    rank: int | None
    pid: int
    at: float
    code: int | None = None
    signal: str | None = None
    reason: str | None = None  # classified fatal message
    frame: str | None = None  # Python frame it died in
    exception: str | None = None
    first: bool = False
    fault_trace: str | None = None
    log_tail: str = ""
    error_file: str | None = None  # our copy of the torchelastic error file
    saved_to: str | None = None

    def how(self) -> str:
        if self.signal:
            return self.signal
        return f"exit code {self.code}" if self.code is not None else "exit status unknown"

    def describe(self) -> str:
        where = f" in {self.frame}" if self.frame else ""
        why = f" ({self.reason})" if self.reason and self.reason not in ("segmentation fault",) else ""
        return f"rank {self.rank} (pid {self.pid}) died: {self.how()}{why}{where}"

    def exit_info(self) -> ExitInfo:
        return ExitInfo(code=self.code, signal=self.signal, at=self.at, first=self.first,
                        reason=self.reason, frame=self.frame)


@dataclass
class _Tracked:
    rank: int | None
    env: dict[str, str]
    error_file: str | None
    status: tuple[int | None, str | None] | None = None  # caught while a zombie


class CrashCatcher:
    """Watches the ranks below ``root_pid`` through /proc and records each abnormal death."""

    def __init__(self, root_pid: int, run_dir: Path | None = None, save_dir: Path | None = None) -> None:
        self.root_pid = root_pid
        self.run_dir = Path(run_dir) if run_dir else None
        self.save_dir = Path(save_dir) if save_dir else None
        self.records: list[CrashRecord] = []
        self.exited_ok: list[int] = []  # ranks that ended with status 0
        self._tracked: dict[int, _Tracked] = {}
        self._seen: set[int] = set()  # pids already looked at
        self._with_rank: set[int] = set()  # pids with RANK in their environment

    @property
    def rank_pids(self) -> dict[int, int | None]:
        return {pid: t.rank for pid, t in self._tracked.items()}

    def tick(self) -> list[CrashRecord]:
        """One cheap pass; returns the deaths found in it (also appended to ``records``)."""
        self._discover()
        new: list[CrashRecord] = []
        for pid, tracked in list(self._tracked.items()):
            status = procfs.zombie_exit(pid)
            if status is not None:
                tracked.status = status
            alive = status is None and psutil.pid_exists(pid) and procfs.state_letter(pid) not in (None, "Z")
            if alive:
                self._copy_error_file(tracked)
                continue
            del self._tracked[pid]
            record = self._judge(pid, tracked)
            if record is not None:
                new.append(record)
        if new:
            self._mark_first(new)
        return new

    def job_alive(self) -> bool:
        return psutil.pid_exists(self.root_pid) and procfs.state_letter(self.root_pid) not in (None, "Z")

    def _discover(self) -> None:
        family = procfs.descendant_pids(self.root_pid)  # a few small reads, not a /proc scan
        if family is None:
            try:
                family = frozenset(p.pid for p in psutil.Process(self.root_pid).children(recursive=True))
            except psutil.Error:
                return
        new = []
        for pid in {self.root_pid, *family} - self._seen:
            try:
                new.append(psutil.Process(pid))
            except psutil.Error:
                continue
        for proc in sorted(new, key=lambda p: _start_time(p)):  # parents before their children
            try:
                env = proc.environ()
                parent = proc.ppid()
            except psutil.Error:
                continue
            self._seen.add(proc.pid)
            if "RANK" not in env:
                continue
            self._with_rank.add(proc.pid)
            # A rank's children (DataLoader workers, the hook's tee) inherit RANK: skip them.
            if parent in self._with_rank:
                continue
            self._tracked[proc.pid] = _Tracked(_int(env.get("RANK")), env, env.get("TORCHELASTIC_ERROR_FILE"))
            if self.run_dir is None and env.get("TRAINWATCH_RUN_DIR"):
                self.run_dir = Path(env["TRAINWATCH_RUN_DIR"])

    def _copy_error_file(self, tracked: _Tracked) -> str | None:
        """Copy the torchelastic error file as soon as it exists: a restart deletes its folder."""
        src = tracked.error_file
        if not src or not self.save_dir or not os.path.exists(src):
            return None
        dest = self.save_dir / "crashes" / f"rank{tracked.rank}-torchelastic-error.json"
        try:
            dest.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(src, dest)
        except OSError:
            return None
        return str(dest)

    def _judge(self, pid: int, tracked: _Tracked) -> CrashRecord | None:
        now = time.time()
        code, sig = tracked.status if tracked.status else (None, None)
        rank = tracked.rank
        fault = exit_rec = None
        log_text = ""
        if self.run_dir is not None and rank is not None:
            text = _read(rundir.faulthandler_file(self.run_dir, rank))
            fault = crashlog.parse_faulthandler(_section(text, pid))
            exit_rec = rundir.read_json(rundir.exit_file(self.run_dir, rank))
            if exit_rec and exit_rec.get("pid") != pid:
                exit_rec = None
            time.sleep(0.05)  # let the tee helper write the rank's last words
            log_text = crashlog.tail(rundir.rank_log_file(self.run_dir, rank), 60)
        error_copy = self._copy_error_file(tracked)
        error_text = _read(Path(error_copy)) if error_copy else ""
        if sig is None and fault and fault.signal:
            sig = fault.signal
        if code is None and sig is None and exit_rec:
            code = int(exit_rec.get("code") or 1)
        if code is None and sig is None:
            fault_line = kernel_fault(pid)  # reaped before we saw it: the kernel may know
            if fault_line:
                sig, error_text = fault_line[0], error_text + "\n" + fault_line[1]
        if code == 0 and sig is None:
            self.exited_ok.append(pid)
            return None
        if code is None and sig is None and not (fault or exit_rec or error_text.strip()):
            return None  # vanished with no sign of trouble: most likely a normal exit
        exception = exit_rec.get("exception") if exit_rec else None
        evidence = "\n".join(filter(None, [exception, error_text, fault.text if fault else "", log_text]))
        frame = crashlog.user_frame(fault) if fault else (exit_rec or {}).get("frame")
        at = (exit_rec or {}).get("at") or _mtime_if(fault, self.run_dir, rank) or now
        record = CrashRecord(rank=rank, pid=pid, at=min(at, now), code=code, signal=sig,
                             reason=crashlog.classify(evidence), frame=frame, exception=exception,
                             fault_trace=fault.text if fault else None, log_tail=log_text, error_file=error_copy)
        return self._save(record)

    def _mark_first(self, new: list[CrashRecord]) -> None:
        if any(r.first for r in self.records):
            self.records.extend(new)
            return
        ordered = sorted(new, key=lambda r: (r.signal in ("SIGTERM", "SIGKILL"), r.at))
        first = dataclasses.replace(ordered[0], first=True)
        self.records.extend([first] + ordered[1:])
        new[:] = [first] + ordered[1:]
        if first.saved_to:
            self._save(first)

    def _save(self, record: CrashRecord) -> CrashRecord:
        if self.save_dir is None:
            return record
        folder = self.save_dir / "crashes"
        folder.mkdir(parents=True, exist_ok=True)
        path = folder / f"rank{record.rank}-pid{record.pid}.json"
        record = dataclasses.replace(record, saved_to=str(path))
        path.write_text(json.dumps(dataclasses.asdict(record), indent=2))
        return record


class Episodes:
    """Exactly one bundle per problem episode: a problem verdict that persists ``hang_after``.

    An episode ends only when the job has looked healthy for ``hang_after`` too: one healthy
    sample in the middle of a hang (a flapping verdict) must not start a second episode.
    """

    def __init__(self, hang_after: float) -> None:
        self.hang_after = hang_after
        self.started: float | None = None
        self.healthy_since: float | None = None
        self.bundled = False

    def observe(self, verdict: Verdict, now: float) -> bool:
        """True once per episode, when the problem has lasted long enough to bundle."""
        if verdict.kind in HANG_KINDS:
            self.healthy_since = None
            if self.started is None:
                self.started = min(verdict.since or now, now)
            if not self.bundled and now - self.started >= self.hang_after:
                self.bundled = True
                return True
        elif verdict.kind == "healthy" and self.started is not None:
            self.healthy_since = self.healthy_since or now
            if now - self.healthy_since >= self.hang_after:
                self.started, self.healthy_since, self.bundled = None, None, False
        return False


def with_crashes(snapshot: Snapshot, records: list[CrashRecord]) -> Snapshot:
    """The snapshot with each dead rank's exit filled in and a ``crashed`` verdict."""
    by_rank = {r.rank: r for r in records}
    ranks = []
    for rank in snapshot.ranks:
        record = by_rank.pop(rank.rank, None)
        ranks.append(dataclasses.replace(rank, state="exited", exit=record.exit_info()) if record else rank)
    for record in by_rank.values():  # died before any snapshot saw it
        ranks.append(Rank(rank=record.rank, pid=record.pid, host=snapshot.job.host, state="exited",
                          exit=record.exit_info()))
    ranks = sorted(ranks, key=lambda r: (r.rank is None, r.rank or 0))
    verdict = judge(ranks, snapshot.job, snapshot.collectives)
    first = next((r for r in records if r.first), records[0])
    verdict = dataclasses.replace(verdict, since=first.at)
    return dataclasses.replace(snapshot, ranks=tuple(ranks), verdict=verdict,
                               groups=group_ranks(ranks, verdict.culprits))


class Watcher:
    """The loop behind ``trainwatch watch``: events on ``emit``, bundles into ``out_dir``."""

    def __init__(self, pid: int, out_dir: Path, *, dump_on: frozenset[str] = frozenset({"hang", "crash"}),
                 hang_after: float = 300.0, interval: float = 5.0, crash_interval: float = 0.2,
                 window: float = 1.0, emit: Callable[[str], None] = print, source=None,
                 run_dir: Path | None = None) -> None:
        self.pid, self.out_dir, self.dump_on = pid, Path(out_dir), dump_on
        self.interval, self.crash_interval, self.emit = interval, crash_interval, emit
        self.catcher = CrashCatcher(pid, run_dir, self.out_dir)
        self.episodes = Episodes(hang_after)
        self.source = source
        self.window = window
        self.last: Snapshot | None = None
        self.bundles: list[Path] = []
        self.saw_problem = self.saw_crash = False
        self._crash_bundled = False
        self._last_kind: str | None = None

    def run(self) -> int:
        next_poll = 0.0
        while True:
            for record in self.catcher.tick():
                self._on_crash(record)
            if not self.catcher.job_alive():
                self._on_job_end()
                break
            now = time.monotonic()
            if now >= next_poll:
                self._poll()
                next_poll = time.monotonic() + self.interval
            time.sleep(self.crash_interval)
        return EXIT_CRASH if self.saw_crash else EXIT_PROBLEM if self.saw_problem else EXIT_CLEAN

    def _poll(self) -> None:
        if self.source is None:
            return
        try:
            snapshot = self.source.poll()
        except Exception as exc:  # the job may be ending under us; the crash path still works
            self.emit(f"{_stamp()} note: snapshot failed: {exc}")
            return
        self.last = snapshot
        if snapshot.job.run_dir and self.catcher.run_dir is None:
            self.catcher.run_dir = Path(snapshot.job.run_dir)
        verdict = snapshot.verdict
        if verdict.kind != self._last_kind and verdict.kind != "crashed":
            self.emit(f"{_stamp()} verdict {verdict.kind}: {verdict.summary}".rstrip(": "))
            self._last_kind = verdict.kind
        if verdict.kind in HANG_KINDS:
            self.saw_problem = True
        if self.episodes.observe(verdict, time.time()) and "hang" in self.dump_on:
            self._bundle(snapshot, f"{verdict.kind}: {verdict.summary}")

    def _on_crash(self, record: CrashRecord) -> None:
        self.saw_crash = True
        first = " (first to die)" if record.first else ""
        self.emit(f"{_stamp()} crash {record.describe()}{first}")
        if record.saved_to:
            self.emit(f"{_stamp()} crash record {record.saved_to}")
        if "crash" in self.dump_on and not self._crash_bundled:
            self._crash_bundled = True
            base = self.last or _bare_snapshot(self.pid)
            snapshot = with_crashes(base, self.catcher.records)
            self._bundle(snapshot, snapshot.verdict.summary)

    def _on_job_end(self) -> None:
        self.emit(f"{_stamp()} job ended (pid {self.pid})")

    def _bundle(self, snapshot: Snapshot, reason: str) -> None:
        try:
            from trainwatch.probes.bundle import write_bundle
        except ImportError:
            self.emit(f"{_stamp()} note: evidence bundles are not available in this install "
                      "(trainwatch.probes.bundle missing); crash records are still saved")
            return
        paused = getattr(self.source, "paused_judgement", None)  # the dump's py-spy is not progress
        try:
            with paused() if paused else contextlib.nullcontext():
                path = write_bundle(self.pid, snapshot, self.out_dir, reason=reason)
        except Exception as exc:
            self.emit(f"{_stamp()} note: bundle failed: {type(exc).__name__}: {exc}")
            return
        self.bundles.append(Path(path))
        self.emit(f"{_stamp()} bundle {path}")


def _start_time(proc: psutil.Process) -> float:
    try:
        return proc.create_time()
    except psutil.Error:
        return 0.0


def _bare_snapshot(pid: int) -> Snapshot:
    return Snapshot(job=Job(launcher="unknown", pid=pid, host=socket.gethostname()), taken_at=time.time())


def _section(text: str, pid: int) -> str:
    """The part of a faulthandler file written by process ``pid`` (each start adds a header)."""
    marker = f" pid {pid} started "
    start = text.rfind(marker)
    if start < 0:
        return text
    end = text.find("=== trainwatch:", start)
    return text[text.rfind("\n", 0, start) + 1:end if end >= 0 else None]


def _mtime_if(fault, run_dir: Path | None, rank: int | None) -> float | None:
    if not fault or run_dir is None or rank is None:
        return None
    try:
        return rundir.faulthandler_file(run_dir, rank).stat().st_mtime
    except OSError:
        return None


def _read(path: Path) -> str:
    try:
        return Path(path).read_text(errors="replace")
    except OSError:
        return ""


def _int(value: str | None) -> int | None:
    try:
        return int(value) if value else None
    except ValueError:
        return None


def _stamp() -> str:
    return time.strftime("%H:%M:%S")
