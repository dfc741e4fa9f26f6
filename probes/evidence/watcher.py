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
import threading
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Callable

import psutil

from ..errors import TrainwatchError
from .bundle import remembered_places, write_bundle
from ..judge import exits
from ..read import exits as ended
from ..read.exits import CrashRecord
from ..judge.judgement import JudgeMemory, judge_job
from ..read import procfs
from ..read.discover import LAUNCHERS, find_job
from ..read.process import RankProcess
from ..read.ranklog import RankLogs
from ..observed import observed_rank, observed_snapshot
from ..snapshot import CRASH_VERDICTS, HANG_VERDICTS, HEALTHY_VERDICTS, PROBLEM_VERDICTS, Job, Snapshot, Verdict
from ..source import Source


LATE_S = 10.0  # how long a rank reaped without a word may still be explained by its log

# `trainwatch watch` exit statuses (documented in its --help)
EXIT_CLEAN, EXIT_PROBLEM, EXIT_CRASH = 0, 10, 11


@dataclass(frozen=True)
class WatchEvent:
    """One thing ``watch`` saw. ``alert`` events (``problem``, ``crashed``) are the ones a person
    should hear about: once per problem episode, once per crash, with the bundle if one was written."""

    kind: str  # verdict, crash, crash_reason, bundle, note, job_ended; alerts: problem, crashed
    text: str = ""  # the line `watch` prints; empty for alerts (their bundle line says it)
    verdict: str | None = None
    culprits: tuple[int, ...] = ()
    summary: str = ""
    bundle: str | None = None
    at: float = field(default_factory=time.time)

    @property
    def alert(self) -> bool:
        return self.kind in ("problem", "crashed")


class CrashCatcher:
    """Watches the ranks of the job of ``root_pid`` through /proc and records each abnormal death.

    Ranks are found by ``discover.find_job`` (launchers, mp.spawn, srun-style ranks) whenever the
    job's process family changes; between changes a tick costs a few small /proc reads."""

    def __init__(self, root_pid: int, run_dir: Path | None = None, save_dir: Path | None = None) -> None:
        self.root_pid = root_pid
        self.run_dir = Path(run_dir) if run_dir else None
        self.save_dir = Path(save_dir) if save_dir else None
        self.records: list[CrashRecord] = []
        self.exited_ok: list[int] = []  # ranks that ended with status 0
        self.logs = RankLogs()
        self._tracked: dict[int, RankProcess] = {}
        self._done: set[int] = set()  # pids already judged
        # Dead with no reason said yet: mp.spawn's parent prints a rank's traceback only after
        # tearing the others down, so the reason may still come (pid -> (rank, status, died at)).
        self._unexplained: dict[int, tuple[RankProcess, tuple | None, float]] = {}
        self._family: frozenset[int] | None = None
        self._job_root: int | None = None
        self._launcher_log: str | None = None

    @property
    def rank_pids(self) -> dict[int, int | None]:
        return {pid: proc.rank for pid, proc in self._tracked.items()}

    def tick(self) -> list[CrashRecord]:
        """One cheap pass; returns the deaths found in it (also appended to ``records``)."""
        self._discover()
        new: list[CrashRecord] = []
        for pid, proc in list(self._tracked.items()):
            status = procfs.zombie_exit(pid)
            alive = status is None and psutil.pid_exists(pid) and procfs.state_letter(pid) not in (None, "Z")
            if alive:
                self._copy_error_file(proc)
                continue
            del self._tracked[pid]
            self._done.add(pid)
            record = self._judge(proc, status)
            if record is not None:
                new.append(record)
        late = self._explained_late()
        new.extend(r for r in late if r.pid not in {known.pid for known in self.records})
        if new:
            self._mark_first(new)
        return new + [r for r in late if r not in new]

    def job_alive(self) -> bool:
        return psutil.pid_exists(self.root_pid) and procfs.state_letter(self.root_pid) not in (None, "Z")

    def _discover(self) -> None:
        family = procfs.descendant_pids(self.root_pid)  # a few small reads, not a /proc scan
        if family is None:
            try:
                family = frozenset(p.pid for p in psutil.Process(self.root_pid).children(recursive=True))
            except psutil.Error:
                return
        if family == self._family:
            return
        self._family = family
        try:
            job = find_job(self.root_pid)
        except (TrainwatchError, psutil.Error):
            return  # not started yet, or gone: try again when the family changes
        self._job_root = job.root_pid
        if self.run_dir is None and job.run_dir:
            self.run_dir = Path(job.run_dir)
        ranks = ended.infer_ranks(job)
        for proc in ranks:
            self.logs.note_writer(proc.pid, proc.log_path)
        if job.launcher_pid:
            self._launcher_log = procfs.log_file_of(job.launcher_pid) or self._launcher_log
            self.logs.note_writer(job.launcher_pid, self._launcher_log)
        for proc in ranks:
            if proc.pid in self._tracked or proc.pid in self._done:
                continue
            # a rank already dead when first seen has no environment left: tracked when its
            # number could be inferred (the one missing local rank of a launcher's job)
            inferred = not proc.env and proc.rank is not None and job.launcher in LAUNCHERS
            if "RANK" in proc.env or inferred or (job.launcher == "mp.spawn" and proc.rank is not None):
                self._tracked[proc.pid] = proc

    def _copy_error_file(self, proc: RankProcess) -> str | None:
        """Copy the torchelastic error file as soon as it exists: a restart deletes its folder."""
        src = proc.env.get("TORCHELASTIC_ERROR_FILE")
        if not src or not self.save_dir or not os.path.exists(src):
            return None
        dest = self.save_dir / "crashes" / f"rank{proc.rank}-torchelastic-error.json"
        try:
            dest.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(src, dest)
        except OSError:
            return None
        return str(dest)

    def _judge(self, proc: RankProcess, status: tuple[int | None, str | None] | None) -> CrashRecord | None:
        error_copy = self._copy_error_file(proc)
        error_text = ended.read_bounded(error_copy, 256 * 1024) if error_copy else ""
        record = ended.read_exit(proc, status, now=time.time(), run_dir=self.run_dir, logs=self.logs,
                                 error_text=error_text, clean=self._clean, launcher_log=self._launcher_log)
        if record.exit.code == 0 and record.exit.signal is None:
            self.exited_ok.append(proc.pid)
            return None
        if record.exit.reason is None:
            self._unexplained[proc.pid] = (proc, status, record.exit.at or time.time())
        if not exits.abnormal(record.exit):
            return None  # vanished with no sign of trouble: most likely a normal exit
        return self._save(replace(record, error_file=error_copy))

    def _explained_late(self) -> list[CrashRecord]:
        """Deaths whose reason the log gave after the fact (within ``LATE_S``): new crash records
        for ranks reaped unseen, and recorded crashes now with their reason (``first`` kept)."""
        found = []
        for pid, (proc, status, died_at) in list(self._unexplained.items()):
            record = ended.read_exit(proc, status, now=died_at, run_dir=self.run_dir, logs=self.logs,
                                     clean=self._clean, launcher_log=self._launcher_log)
            if record.exit.reason is not None and exits.abnormal(record.exit):
                known = next((i for i, r in enumerate(self.records) if r.pid == pid), None)
                if known is not None:
                    earlier = self.records[known]
                    record = replace(record, exit=replace(record.exit, first=earlier.exit.first),
                                     error_file=earlier.error_file)
                    self.records[known] = record = self._save(record)
                else:
                    record = self._save(record)
                found.append(record)
            if record.exit.reason is not None or time.time() - died_at > LATE_S:
                del self._unexplained[pid]
        return found

    def _clean(self, text: str) -> str:
        return ended.redactor_for([self.root_pid, self._job_root])(text)

    def _mark_first(self, new: list[CrashRecord]) -> None:
        if any(r.exit.first for r in self.records):
            self.records.extend(new)
            return
        first_pid = exits.first_to_die((r.pid, r.exit) for r in new)
        ordered = sorted(new, key=lambda r: r.pid != first_pid)
        first = replace(ordered[0], exit=replace(ordered[0].exit, first=True))
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
        record = replace(record, saved_to=str(path))
        clean = ended.redacted(record, self._clean)  # what is written leaves trainwatch: no secrets
        path.write_text(json.dumps(dataclasses.asdict(clean), indent=2))
        return record


class CrashThread:
    """Runs the crash catcher every half second, between polls, so a dying rank's status and
    faulthandler frame are caught before the launcher tears the job down."""

    INTERVAL = 0.5

    def __init__(self, root_pid: int, run_dir: str | None = None) -> None:
        self._catcher = CrashCatcher(root_pid, run_dir=Path(run_dir) if run_dir else None)
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._run, name="tw-crash-catcher", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self.INTERVAL):
            with self._lock:
                self._catcher.tick()
            if not self._catcher.job_alive():
                with self._lock:
                    self._catcher.tick()
                return

    def records(self) -> list:
        with self._lock:
            return list(self._catcher.records)

    def stop(self) -> None:
        self._stop.set()


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
        if verdict.kind in HANG_VERDICTS:
            self.healthy_since = None
            if self.started is None:
                self.started = min(verdict.since or now, now)
            if not self.bundled and now - self.started >= self.hang_after:
                self.bundled = True
                return True
        elif verdict.kind in HEALTHY_VERDICTS and self.started is not None:
            self.healthy_since = self.healthy_since or now
            if now - self.healthy_since >= self.hang_after:
                self.started, self.healthy_since, self.bundled = None, None, False
        return False


def with_crashes(snapshot: Snapshot, records: list[CrashRecord]) -> Snapshot:
    """The snapshot with each dead rank's exit filled in and a ``crashed`` verdict."""
    by_rank = {r.rank: r for r in records}
    evidence = []
    for rank in map(observed_rank, snapshot.ranks):
        record = by_rank.pop(rank.rank, None)
        evidence.append(dataclasses.replace(rank, seen="exited", exit=record.exit) if record else rank)
    for record in by_rank.values():  # died before any snapshot saw it
        evidence.append(ended.exited_rank(record.pid, record.rank, record.exit, host=snapshot.job.host))
    evidence = sorted(evidence, key=lambda r: (r.rank is None, r.rank or 0))
    job = dataclasses.replace(observed_snapshot(snapshot), ranks=tuple(evidence))
    judged = judge_job(job, JudgeMemory.after(snapshot), snapshot.taken_at or time.time())
    first = next((r for r in records if r.exit.first), records[0])
    verdict = dataclasses.replace(judged.verdict, since=first.exit.at)  # the crash began with the first death
    return dataclasses.replace(snapshot, ranks=judged.ranks, verdict=verdict, groups=judged.groups)


class Watcher:
    """The loop behind ``trainwatch watch``: events on ``emit``, bundles into ``out_dir``."""

    def __init__(self, pid: int, out_dir: Path, *, dump_on: frozenset[str] = PROBLEM_VERDICTS,
                 hang_after: float = 300.0, interval: float = 5.0, crash_interval: float = 0.2,
                 window: float = 1.0, emit: Callable[[str], None] = print, source: Source | None = None,
                 run_dir: Path | None = None, on_event: Callable[[WatchEvent], None] | None = None) -> None:
        self.pid, self.out_dir, self.dump_on = pid, Path(out_dir), dump_on  # verdict kinds to bundle
        self.interval, self.crash_interval, self.emit = interval, crash_interval, emit
        self.on_event = on_event
        self.catcher = CrashCatcher(pid, run_dir, self.out_dir)
        self.episodes = Episodes(hang_after)
        self.source = source
        self.window = window
        self.last: Snapshot | None = None
        self.bundles: list[Path] = []
        self.saw_problem = self.saw_crash = False
        self._crash_bundled = False
        self._last_kind: str | None = None
        self._told: set[int] = set()  # pids whose crash was emitted

    def run(self) -> int:
        next_poll = 0.0
        while True:
            for record in self.catcher.tick():
                self._on_crash(record)
            if not self.catcher.job_alive():
                for record in self.catcher.tick():  # last words: mp.spawn's parent prints as it exits
                    self._on_crash(record)
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
            self._say(WatchEvent("note", f"note: snapshot failed: {exc}"))
            return
        self.last = snapshot
        if snapshot.job.run_dir and self.catcher.run_dir is None:
            self.catcher.run_dir = Path(snapshot.job.run_dir)
        verdict = snapshot.verdict
        if verdict.kind != self._last_kind and verdict.kind not in CRASH_VERDICTS:
            self._say(WatchEvent("verdict", f"verdict {verdict.kind}: {verdict.summary}".rstrip(": "),
                                 verdict.kind, verdict.culprits, verdict.summary))
            self._last_kind = verdict.kind
        if verdict.kind in HANG_VERDICTS:
            self.saw_problem = True
        if verdict.kind in CRASH_VERDICTS:
            self._on_lingering_crash(snapshot)
        if self.episodes.observe(verdict, time.time()):
            path = self._bundle(snapshot, f"{verdict.kind}: {verdict.summary}") \
                if verdict.kind in self.dump_on else None
            self._say(WatchEvent("problem", "", verdict.kind, verdict.culprits, verdict.summary, path))

    def _on_crash(self, record: CrashRecord) -> None:
        self.saw_crash = True
        first = " (first to die)" if record.exit.first else ""
        culprit = (record.rank,) if record.rank is not None else ()
        death = exits.death(record.rank, record.pid, record.exit)
        if record.pid in self._told:  # its reason, read after the death (mp.spawn's parent's report)
            self._say(WatchEvent("crash_reason", f"crash reason {death}{first}", "crashed", culprit, death))
            if record.saved_to:
                self._say(WatchEvent("note", f"crash record {record.saved_to}"))
            return
        self._told.add(record.pid)
        self._say(WatchEvent("crash", f"crash {death}{first}", "crashed", culprit, death))
        if record.saved_to:
            self._say(WatchEvent("note", f"crash record {record.saved_to}"))
        if not self._crash_bundled:
            self._crash_bundled = True
            base = self.last or _bare_snapshot(self.pid)
            snapshot = with_crashes(base, self.catcher.records)
            self._alert_crash(snapshot)

    def _on_lingering_crash(self, snapshot: Snapshot) -> None:
        """A culprit raised and lingers (a non-daemon thread keeps it alive): no death for the
        crash catcher to see, so the snapshot's verdict is the crash event."""
        culprits = set(snapshot.verdict.culprits)
        if self.saw_crash or not any(exits.raised_while_alive(r) and r.rank in culprits for r in snapshot.ranks):
            return
        self.saw_crash = True
        verdict = snapshot.verdict
        self._say(WatchEvent("crash", f"crash {verdict.summary}", "crashed", verdict.culprits, verdict.summary))
        if not self._crash_bundled:
            self._crash_bundled = True
            self._alert_crash(snapshot)

    def _alert_crash(self, snapshot: Snapshot) -> None:
        """Bundle the crash (when asked to) and raise the one ``crashed`` alert of this watch."""
        verdict = snapshot.verdict
        path = self._bundle(snapshot, verdict.summary) if "crashed" in self.dump_on else None
        self._say(WatchEvent("crashed", "", "crashed", verdict.culprits, verdict.summary, path))

    def _on_job_end(self) -> None:
        self._say(WatchEvent("job_ended", f"job ended (pid {self.pid})"))

    def _say(self, event: WatchEvent) -> None:
        if event.text:
            self.emit(f"{_stamp()} {event.text}")
        if self.on_event is not None:
            self.on_event(event)

    def _bundle(self, snapshot: Snapshot, reason: str) -> str | None:
        try:  # the dump's py-spy attaches are not the ranks' progress
            with self.source.paused_judgement() if self.source is not None else contextlib.nullcontext():
                path = write_bundle(self.pid, snapshot, self.out_dir, reason=reason,
                                    familiar=remembered_places(self.source))
        except Exception as exc:
            self._say(WatchEvent("note", f"note: bundle failed: {type(exc).__name__}: {exc}"))
            return None
        self.bundles.append(Path(path))
        verdict = snapshot.verdict
        self._say(WatchEvent("bundle", f"bundle {path}", verdict.kind, verdict.culprits, verdict.summary, str(path)))
        collect = getattr(self.source, "collect_bundles", None)  # a job on several nodes, as `dump` does
        if collect is not None:
            for note in collect(path):  # each other node's bundle under <bundle>/hosts/<node>/
                self._say(WatchEvent("note", f"note: {note}"))
        return str(path)


def _bare_snapshot(pid: int) -> Snapshot:
    return Snapshot(job=Job(launcher="unknown", pid=pid, host=socket.gethostname()), taken_at=time.time())


def _stamp() -> str:
    return time.strftime("%H:%M:%S")
