"""Headless watching: bundle evidence once per problem, report every death.

:class:`Watcher` runs the crash catcher (``crash_catcher.py``: cheap, often) between the heavier
snapshots (``LocalSource.poll()``), and writes the bundles.
"""

from __future__ import annotations

import contextlib
import dataclasses
import socket
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Mapping

from .bundle import write_bundle
from .crash_catcher import CrashCatcher
from ..judge import exits
from ..read.processes import exits as ended
from ..read.processes.exits import CrashRecord
from ..judge.judgement import JudgeMemory, JudgeOptions, judge_job
from ..judge.warnings import rejudged_warnings
from ..judge.phases import classify
from ..read.processes import procfs
from ..read.stacks.sampler import sample_all
from ..read.stacks.source_lines import source_line
from ..observed import combine_states, observed_rank, observed_snapshot
from ..read.collectives import last_words
from .. import rundir
from ..wording import one_line
from ..snapshot import (CRASH_VERDICTS, HANG_VERDICTS, HEALTHY_VERDICTS, PROBLEM_VERDICTS, CollectiveState, ExitInfo,
                        Job, Snapshot, ThreadStack, Verdict)
from ..source import Source
from ..record import Record


MIN_PAUSE_S = 0.2  # between the end of a poll that took longer than the interval and the next
RECENT_KEPT = 4  # polls kept: the last one judged before a signal reached the ranks is among them
SETTLE_S = 1.5  # the crash alert waits this long after the first death for the cause to be read
LAST_WORDS_WAIT_S = 8.0  # ... and in an armed job, at most this long for the other ranks' last words
EARLY_TIMEOUT_S = 2.0  # the survivors' stacks at the first death: py-spy's bound for each
EARLY_PARALLEL = 16  # py-spy runs at once then (a node's ranks, all at once on common nodes)

# `trainwatch watch` exit statuses (documented in its --help)
EXIT_CLEAN, EXIT_PROBLEM, EXIT_CRASH = 0, 10, 11


@dataclass(frozen=True, repr=False)
class WatchEvent(Record):
    """One thing ``watch`` saw. ``alert`` events (``problem``, ``crashed``) are the ones a person
    should hear about: once per problem episode, once per crash, with the bundle if one was written."""

    kind: str  # verdict, crash, ended (a rank stopped by a signal), crash_reason, bundle, note, job_ended; alerts: problem, crashed
    text: str = ""  # the line `watch` prints; empty for alerts (their bundle line says it)
    verdict: str | None = None
    culprits: tuple[int, ...] = ()
    summary: str = ""
    bundle: str | None = None
    at: float = field(default_factory=time.time)

    @property
    def alert(self) -> bool:
        return self.kind in ("problem", "crashed")


class Episodes:
    """Exactly one bundle per problem episode: a problem verdict that persists ``hang_after``.

    An episode ends only when the job has looked healthy for ``hang_after`` too: one healthy
    sample in the middle of a hang (a flapping verdict) must not start a second episode.
    The problem's age is the verdict's ``since`` (the job's own evidence); but a verdict that
    blames ranks not judged yet (``unsure``: read once, or not read) waits ``hang_after`` of our
    own looking, so a node's agent gets its second look before the bundle is written.
    """

    def __init__(self, hang_after: float) -> None:
        self.hang_after = hang_after
        self.started: float | None = None
        self.seen_at: float | None = None
        self.healthy_since: float | None = None
        self.bundled = False

    def observe(self, verdict: Verdict, now: float, unsure: bool = False) -> bool:
        """True once per episode, when the problem has lasted long enough to bundle."""
        if verdict.kind in HANG_VERDICTS:
            self.healthy_since = None
            if self.started is None:
                self.started = min(verdict.since or now, now)
                self.seen_at = now
            long_enough = now - self.started >= self.hang_after
            if unsure:
                long_enough = long_enough and now - (self.seen_at or now) >= self.hang_after
            if not self.bundled and long_enough:
                self.bundled = True
                return True
        elif verdict.kind in HEALTHY_VERDICTS and self.started is not None:
            self.healthy_since = self.healthy_since or now
            if now - self.healthy_since >= self.hang_after:
                self.started, self.seen_at, self.healthy_since, self.bundled = None, None, None, False
        return False


def with_crashes(snapshot: Snapshot, records: list[CrashRecord],
                 early: Mapping[int, tuple[ThreadStack, ...]] | None = None,
                 collectives: CollectiveState | None = None) -> Snapshot:
    """The snapshot with each dead rank's exit filled in and a ``crashed`` verdict. ``early``: per
    PID, stacks read at the first death, newer than the snapshot's (where each rank was then).
    ``collectives``: the ranks' collectives read at the crash (their last words), fresher than
    the snapshot's: each rank's row is taken from them first."""
    by_rank = {r.rank: r for r in records}
    evidence = []
    for rank in map(observed_rank, snapshot.ranks):
        if early and rank.pid in early:
            cls = classify(early[rank.pid], source_line)
            rank = dataclasses.replace(rank, threads=early[rank.pid], phase=cls.phase, op=cls.op, where=cls.where,
                                       user_frame=cls.user_frame, detail=cls.detail, native=False)
        record = by_rank.pop(rank.rank, None)
        evidence.append(dataclasses.replace(rank, seen="exited", exit=record.exit) if record else rank)
    for record in by_rank.values():  # died before any snapshot saw it
        evidence.append(ended.exited_rank(record.pid, record.rank, record.exit, host=snapshot.job.host))
    evidence = sorted(evidence, key=lambda r: (r.rank is None, r.rank or 0))
    job = dataclasses.replace(observed_snapshot(snapshot), ranks=tuple(evidence),
                              collectives=combine_states([collectives, snapshot.collectives]))
    judged = judge_job(job, JudgeMemory.after(snapshot), snapshot.taken_at or time.time(),
                       JudgeOptions(window=snapshot.window_s))
    first = next((r for r in records if r.exit.first), records[0])
    verdict = dataclasses.replace(judged.verdict, since=first.exit.at)  # the crash began with the first death
    return dataclasses.replace(snapshot, ranks=judged.ranks, verdict=verdict, groups=judged.groups,
                               warnings=rejudged_warnings(snapshot, judged.warnings))


class Watcher:
    """The loop behind ``trainwatch watch``: events on ``emit``, bundles into ``out_dir``."""

    def __init__(self, pid: int | None, out_dir: Path, *, dump_on: frozenset[str] = PROBLEM_VERDICTS,
                 hang_after: float = 300.0, interval: float = 5.0, crash_interval: float = 0.2,
                 window: float = 1.0, emit: Callable[[str], None] = print, source: Source | None = None,
                 run_dir: Path | None = None, on_event: Callable[[WatchEvent], None] | None = None) -> None:
        self.pid, self.out_dir, self.dump_on = pid, Path(out_dir), dump_on  # verdict kinds to bundle
        self.interval, self.crash_interval, self.emit = interval, crash_interval, emit
        self.on_event = on_event
        # No job here (a login box watching pods): no crash catcher; the nodes' answers say every death.
        self.catcher = CrashCatcher(pid, run_dir, self.out_dir) if pid is not None else None
        self.episodes = Episodes(hang_after)
        self.source = source
        self.window = window
        self.last: Snapshot | None = None
        self._recent: deque[Snapshot] = deque(maxlen=RECENT_KEPT)  # the last polls, for the one before a stop
        self.bundles: list[Path] = []
        self.saw_problem = self.saw_crash = False
        self._crash_bundled = False
        self._alert_due: float | None = None  # when the crash alert fires if no cause was read before
        self._last_kind: str | None = None
        self._problems: list[str] = []  # problem verdicts seen, for job_ended
        self._blamed: tuple[int, ...] = ()  # the last alert's culprits: job_ended names them
        self._told: set[int] = set()  # pids whose crash was emitted
        # A restarted job: the first crash alerted, and the ends of later attempts alerted since (a
        # crash loop, once; a new failure, once each).
        self._alerted: CrashRecord | None = None
        self._ends_alerted: set[tuple] = set()
        self.early: dict[int, tuple[ThreadStack, ...]] = {}  # pid -> stacks read at the first death
        self.stopped: Snapshot | None = None  # the job as judged when it was stopped from outside, if it was
        self._held_kills: list[CrashRecord] = []  # SIGKILLs said once it is known whether every rank got one
        self.early_fr: CollectiveState | None = None  # an armed job's survivors' collectives at the first death
        self._early_read = False
        self._early_lock = threading.Lock()

    def run(self) -> int:
        if self.catcher is None:
            return self._run_remote()
        next_poll = 0.0
        threading.Thread(target=self._at_first_death, name="tw-first-death", daemon=True).start()
        while True:
            for record in self.catcher.tick():
                self._on_crash(record)
            if self._alert_due is not None and time.monotonic() >= self._alert_due:
                if self._last_words_coming():
                    self._alert_due = time.monotonic() + self.crash_interval
                else:
                    self._raise_crash_alert()
            if not self.catcher.job_alive():
                for record in self.catcher.tick():  # last words: mp.spawn's parent prints as it exits
                    self._on_crash(record)
                self._on_job_end()
                break
            now = time.monotonic()
            if now >= next_poll:  # every interval from one poll's start to the next
                self._poll()
                next_poll = max(now + self.interval, time.monotonic() + MIN_PAUSE_S)
            time.sleep(self.crash_interval)
        return EXIT_CRASH if self.saw_crash else EXIT_PROBLEM if self.saw_problem else EXIT_CLEAN

    def _run_remote(self) -> int:
        """A job seen only through its nodes' agents (``watch --k8s`` from a login box): polls alone;
        a ``crashed`` verdict is the crash alert; the watch ends when every pod of the job has ended."""
        next_poll = 0.0
        while True:
            now = time.monotonic()
            if now >= next_poll:
                self._poll()
                next_poll = max(now + self.interval, time.monotonic() + MIN_PAUSE_S)
                last = self.last
                if last is not None and last.verdict.kind in CRASH_VERDICTS and not self._crash_bundled:
                    self._crash_bundled = self.saw_crash = True
                    verdict = last.verdict
                    self._say(WatchEvent("crash", f"crash {verdict.summary}", "crashed", verdict.culprits,
                                         verdict.summary))
                    self._alert_crash(last)
                if last is not None and last.job.pods and all(p.pod_phase in ("Succeeded", "Failed")
                                                              for p in last.job.pods):
                    ended = "; ".join(p.words for p in last.job.pods)
                    before = f"; before it: {', '.join(self._problems)}" if self._problems else ""
                    self._say(WatchEvent("job_ended", f"job ended: {ended}{before}",
                                         "crashed" if self.saw_crash else None, (), ended))
                    break
            time.sleep(self.crash_interval)
        return EXIT_CRASH if self.saw_crash else EXIT_PROBLEM if self.saw_problem else EXIT_CLEAN

    def _poll(self) -> None:
        if self.source is None:
            return
        try:
            snapshot = self.source.poll()
        except Exception as exc:  # noqa: BLE001 - the job may be ending under us; the crash path still works
            self._say(WatchEvent("note", f"note: snapshot failed: {exc}"))
            return
        self.last = snapshot
        self._recent.append(snapshot)
        if snapshot.job.run_dir and self.catcher is not None and self.catcher.run_dir is None:
            self.catcher.run_dir = Path(snapshot.job.run_dir)
        verdict = snapshot.verdict
        if verdict.kind != self._last_kind and verdict.kind not in CRASH_VERDICTS:
            self._say(WatchEvent("verdict", f"verdict {verdict.kind}: {verdict.summary}".rstrip(": "),
                                 verdict.kind, verdict.culprits, verdict.summary))
            self._last_kind = verdict.kind
        if verdict.kind in PROBLEM_VERDICTS and verdict.kind not in self._problems:
            self._problems.append(verdict.kind)
        if verdict.kind in CRASH_VERDICTS:
            self._on_lingering_crash(snapshot)
        unsure = any(r.state == "unknown" for r in snapshot.ranks if r.rank in verdict.culprits)
        if self.episodes.observe(verdict, time.time(), unsure):
            # The watch's outcome (exit 10): a problem that held past --hang-after, not a look or two.
            self.saw_problem = self.saw_problem or verdict.kind in HANG_VERDICTS
            path = self._bundle(snapshot, f"{verdict.kind}: {verdict.summary}") \
                if verdict.kind in self.dump_on else None
            self._say(WatchEvent("problem", "", verdict.kind, verdict.culprits, verdict.summary, path))

    def _at_first_death(self) -> None:
        """Wakes at the first rank's exit (the kernel's exit events), whatever the loop is doing.
        Without those events the crash path reads the survivors itself (``_on_crash``)."""
        events = self.catcher.exit_events
        if events is None or events.unavailable is not None:
            return
        while not self._early_read and self.catcher.job_alive():
            if self.catcher.wait_for_death(0.5):
                self._read_survivors()

    def _read_survivors(self) -> None:
        """At the first death, before anything else: every other rank's stacks, read at once. A
        launcher tears the rest down within its monitor interval (torchrun: 0.1 s), and a rank
        killed while it waits takes its stacks with it. Once; a second caller waits for the first."""
        with self._early_lock:
            if not self._early_read:
                self._early_read = True
                self._read_them()

    def _read_them(self) -> None:
        started = time.monotonic()
        pids = self.catcher.rank_pids
        alive = [pid for pid in pids if procfs.state_letter(pid) not in (None, "Z", "X")]
        asking = None
        if self.catcher.run_dir is not None and alive:  # an armed job: the survivors' collectives too, at once
            ranks = sorted({pids[pid] for pid in alive if pids.get(pid) is not None})
            asking = threading.Thread(target=self._ask_survivors, args=(self.catcher.run_dir, ranks),
                                      name="tw-fr-first-death", daemon=True)
            asking.start()
        samples = sample_all([(pid, False, None, False, None) for pid in alive], timeout=EARLY_TIMEOUT_S,
                             parallel=max(1, min(len(alive), EARLY_PARALLEL)))
        if asking is not None:
            asking.join(EARLY_TIMEOUT_S)
        self.early = {pid: s.threads for pid, s in samples.items() if s.threads}
        took = (time.monotonic() - started) * 1000
        if not alive:
            self._say(WatchEvent("note", "note: at the first death, every other rank had ended too: no stacks left "
                                         "to read (start the job with `trainwatch run` to keep each rank's last words)"))
            return
        self._say(WatchEvent("note", f"note: at the first death, stacks of {len(self.early)} of {len(alive)} "
                                     f"other ranks read in {took:.0f} ms"))

    def _on_crash(self, record: CrashRecord) -> None:
        self._read_survivors()  # without the kernel's exit events, the first the watcher hears of it
        first = " (first to die)" if record.exit.first else ""
        culprit = (record.rank,) if record.rank is not None else ()
        death = exits.death(record.rank, record.pid, record.exit)
        if _stopped(record.exit):  # SIGTERM, SIGINT, SIGHUP: a stop, whoever sent it; what it ended is judged
            self._told.add(record.pid)
            self._say_ended(record)
            return  # judged with every death once the job ends (or at once, with a cause's)
        if record.exit.signal == "SIGKILL" and record.exit.reason != exits.OOM_KILLED and not self._crash_bundled \
                and record.pid not in self._told:
            # one rank killed is its crash; every rank killed at one moment (scancel, kubectl) a stop:
            # said once the moment is over (exits.killed_together)
            self._held_kills.append(record)
            due = time.monotonic() + exits.SAME_MOMENT_S
            self._alert_due = due if self._alert_due is None else min(self._alert_due, due)
            return
        self.saw_crash = True
        if record.pid in self._told:  # its reason, read after the death (mp.spawn's parent's report)
            self._say(WatchEvent("crash_reason", f"crash reason {death}{first}", "crashed", culprit, death))
            if record.saved_to:
                self._say(WatchEvent("note", f"crash record {record.saved_to}"))
            return
        self._told.add(record.pid)
        self._say(WatchEvent("crash", f"crash {death}{first}", "crashed", culprit, death))
        if record.saved_to:
            self._say(WatchEvent("note", f"crash record {record.saved_to}"))
        if self._crash_bundled:
            self._on_later_attempt(record)
            return
        self._alerted = record
        # The alert names the rank whose death came first in cause: a death that is a cause (a
        # fatal signal, a kill from outside, an error of its own) raises it at once; a death that
        # follows from another's (a lost peer, the launcher's teardown) waits a moment for that one,
        # as does a rank a collective library failed: it is a witness, and the odd call may be a
        # peer's, read from the peers' own ends (their errors, their last words).
        if _is_cause(record.exit) and record.exit.library is None:
            self._raise_crash_alert()
        elif self._alert_due is None:
            self._alert_due = time.monotonic() + SETTLE_S

    def _last_words_coming(self) -> bool:
        """An armed job whose first death is a peer's witness (a library failed it over another
        rank's call) has ranks still ending: the launcher's teardown makes each write its last words,
        the Flight Recorder that names the odd call. The alert waits for them, within
        ``LAST_WORDS_WAIT_S`` of the first death (on a loaded node they take seconds)."""
        records = self.catcher.records
        if self.catcher.run_dir is None or not records or self._crash_bundled:
            return False
        first = min((r.exit.at for r in records if r.exit.at is not None), default=None)
        if first is None or time.time() - first > LAST_WORDS_WAIT_S:
            return False
        if not all(r.exit.library is not None or _stopped(r.exit) for r in records):
            return False  # a death of its own cause says enough
        dead = {r.pid for r in records}
        return any(pid not in dead and procfs.state_letter(pid) not in (None, "Z", "X")
                   for pid in self.catcher.rank_pids)

    def _raise_crash_alert(self) -> None:
        self._alert_due = None
        if self._crash_bundled or not self.catcher.records:
            return
        base = self._last_live_look() or _bare_snapshot(self.pid)
        if base.job.stopped_by is None:
            base = dataclasses.replace(base, job=dataclasses.replace(base.job, stopped_by=self.catcher.launcher_stop()))
        judged = with_crashes(base, self.catcher.records, self.early, self._last_words(base))
        held, self._held_kills = self._held_kills, []
        verdict = judged.verdict
        if verdict.kind in HANG_VERDICTS and any(r.exit.reason in exits.CONSEQUENCES for r in self.catcher.records):
            # Ranks died of what the hang did to them (their collective timed out while the culprit
            # sat in its own work): the hang is the cause, and the alert, naming its culprit.
            self._crash_bundled = True
            self.saw_crash = True
            for record in held:
                self._on_crash(record)
            path = self._bundle(judged, f"{verdict.kind}: {verdict.summary}") if verdict.kind in self.dump_on else None
            self._say(WatchEvent("problem", "", verdict.kind, verdict.culprits, verdict.summary, path))
            return
        if verdict.kind not in CRASH_VERDICTS:  # no rank died of a cause: the job was stopped
            self.stopped = judged
            for record in held:
                self._told.add(record.pid)
                self._say_ended(record)
            return
        self._crash_bundled = True
        self.saw_crash = True
        for record in held:  # each kill said as the crash it was (no second alert: one was just raised)
            self._on_crash(record)
        if self._alerted is None and held:
            self._alerted = held[0]
        self._alert_crash(judged)

    def _last_live_look(self) -> Snapshot | None:
        """The last poll that found a rank alive, and, where the ranks' last words say when a signal
        reached them (an armed job), judged before it: a poll during a stop reads the ranks' handling
        of the signal (faulthandler's dump, the hook writing) as progress, and one after their deaths
        (their ends not yet read) says "job finished"; neither is what the job was doing."""
        if self.last is None:
            return None
        looks = [s for s in self._recent if any(r.state in ("running", "stuck") for r in s.ranks)]
        run_dir = self.catcher.run_dir
        if run_dir is not None:
            ranks = sorted({r.rank for r in self.last.ranks if r.rank is not None}
                           | set(self.catcher.rank_numbers_known()))
            at = last_words.signalled_at(run_dir, ranks, since=self.last.job.started_at or 0.0)
            if at is not None:
                looks = [s for s in looks if s.taken_at is not None and s.taken_at < at] or looks
        return looks[-1] if looks else self.last

    def _on_later_attempt(self, record: CrashRecord) -> None:
        """A death in an attempt the launcher started after the one alerted: the same end again is
        a crash loop, alerted once; another end is a new failure, alerted too (once each)."""
        first = self._alerted
        if first is None or record.attempt is None or first.attempt is None or record.attempt <= first.attempt:
            return
        if not _is_cause(record.exit):
            return  # a peer that lost the failed rank, or the teardown: the failure's own record says it
        key = _end_key(record)
        if key in self._ends_alerted:
            return
        self._ends_alerted.add(key)
        records = [r for r in self.catcher.records if r.attempt == record.attempt]
        base = self.last or _bare_snapshot(self.pid)
        self._alert_crash(with_crashes(base, records, None, self._last_words(base, at_first_death=False)))

    def _ask_survivors(self, run_dir: Path, ranks: list[int]) -> None:
        self.early_fr = last_words.survivors_state(run_dir, ranks, timeout=EARLY_TIMEOUT_S / 2)

    def _last_words(self, base: Snapshot, at_first_death: bool = True) -> CollectiveState | None:
        """An armed job's collectives as its ranks left them in their last words at the crash (the
        freshest), else as their hooks told them at the first death (that crash's only)."""
        run_dir = self.catcher.run_dir
        if run_dir is None:
            return None
        ranks = {r.rank for r in base.ranks if r.rank is not None} | set(self.catcher.rank_numbers_known())
        said = last_words.run_dir_state(run_dir, sorted(ranks), since=base.job.started_at or 0.0)
        return combine_states([said, self.early_fr if at_first_death else None])

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
        """The pending crash alert; deaths no one witnessed; then how the job ended: the launcher's
        status, who failed and how, and what was wrong before. A job that ended badly with no
        crash alert before is one now."""
        status = self._launcher_status()
        failed_end = status is not None and status != (0, None)
        unknown = []
        if self.catcher.vanished and not self.catcher.records and failed_end:
            for record in self.catcher.vanished_now():
                self._on_crash(record)
        elif self.catcher.vanished and status is None:  # a normal end looks the same: said, not alerted
            unknown = sorted(r for r in self.catcher.rank_numbers(self.catcher.vanished) if r is not None)
        if self._alert_due is not None or (self.catcher.records and not self._crash_bundled):
            self._raise_crash_alert()
        how = ("status unknown" if status is None else
               f"launcher exited {exits.how(ExitInfo(code=status[0], signal=status[1]))}")
        if self.stopped is not None and not self.saw_crash:
            self._say_stopped(how)
            return
        records = self.catcher.records
        attempts = sorted({r.attempt for r in records if r.attempt is not None})
        if len(attempts) > 1:  # a restarted job: the deaths of its last attempt, and how many there were
            last = [r for r in records if r.attempt == attempts[-1]]
            first = exits.first_to_die((r.pid, r.exit) for r in last)
            records = sorted(last, key=lambda r: r.pid != first)
            how += f" after attempt {attempts[-1]} (restarted {attempts[-1]} times; the deaths of the last attempt)"
        failed = [exits.death(r.rank, r.pid, r.exit) for r in records]
        text = f"job ended (pid {self.pid}): {how}"
        if failed:
            text += "; " + "; ".join(failed[:8]) + (f"; and {len(failed) - 8} more" if len(failed) > 8 else "")
        if unknown:
            text += (f"; ranks {', '.join(map(str, unknown))} were gone before their exit status could be read "
                     f"({self.catcher.vanished_words(-1, time.time()).split('(', 1)[-1].rstrip(')')})")
        if self._problems:
            text += f"; before it: {', '.join(self._problems)}"
        if failed_end and not self._crash_bundled:
            self.saw_crash = True
            summary = f"the job ended with {how.removeprefix('launcher exited ')} and no rank's death was seen"
            self._say(WatchEvent("crashed", "", "crashed", (), summary))
        # The culprits are the last alert's (the cause its verdict named), not every rank that died of it.
        dead = tuple(sorted({r.rank for r in self.catcher.records if r.rank is not None}))
        self._say(WatchEvent("job_ended", text, "crashed" if failed or failed_end else None,
                             self._blamed or dead, text))

    def _say_ended(self, record: CrashRecord) -> None:
        """A rank that a stop ended: said, never a crash."""
        death = exits.death(record.rank, record.pid, record.exit)
        culprit = (record.rank,) if record.rank is not None else ()
        self._say(WatchEvent("ended", f"ended {death.replace(' died: ', ': ', 1)}", None, culprit, death))

    def _say_stopped(self, how: str) -> None:
        """The job was stopped from outside (no rank died of a cause of its own): who stopped it,
        and what the job was doing then; the problem it had, if any, is the watch's outcome."""
        verdict = self.stopped.verdict
        who = self.stopped.job.stopped_by
        if who is None:
            ways = exits.how_they_ended([r.exit for r in self.catcher.records])
            who = f"a signal to every rank ({ways})"
        problem = verdict.kind in HANG_VERDICTS
        self.saw_problem = self.saw_problem or problem  # stopped while stuck: the problem it had is the outcome
        doing = verdict.summary.rsplit("; then the job", 1)[0]
        what = f"while the job was stuck: {verdict.kind}: {doing}" if problem else "while its ranks made progress"
        text = f"job ended (pid {self.pid}): stopped by {who} ({how}) {what}"
        self._say(WatchEvent("job_ended", text, verdict.kind if problem else None,
                             verdict.culprits if problem else (), text))

    def _launcher_status(self) -> tuple[int | None, str | None] | None:
        """The launcher's exit status: the kernel's exit event, or ``trainwatch run``'s record of it."""
        status = self.catcher.launcher_status()
        if status is not None or self.catcher.run_dir is None:
            return status
        deadline = time.monotonic() + 1.0  # the wrapper writes it as the launcher ends
        while True:
            data = rundir.read_json(rundir.launcher_exit_file(self.catcher.run_dir))
            if data and isinstance(data.get("status"), int):
                code = data["status"]
                return (None, rundir.signal_name(-code)) if code < 0 else (code, None)
            if time.monotonic() >= deadline:
                return None
            time.sleep(0.1)

    def _say(self, event: WatchEvent) -> None:
        if event.kind in ("problem", "crashed") and event.culprits:
            self._blamed = event.culprits
        if event.text:  # one line per event, whatever a command line or a log put in it
            self.emit(f"{_stamp()} {one_line(event.text)}")
        if self.on_event is not None:
            self.on_event(event)

    def _bundle(self, snapshot: Snapshot, reason: str) -> str | None:
        try:  # the dump's py-spy attaches are not the ranks' progress
            with self.source.paused_judgement() if self.source is not None else contextlib.nullcontext():
                path = write_bundle(self.pid, snapshot, self.out_dir, reason=reason,
                                    familiar=self.source.remembered_places(), early_stacks=self.early)
        except Exception as exc:  # noqa: BLE001 - a bundle that fails is said, and watching goes on
            self._say(WatchEvent("note", f"note: bundle failed: {type(exc).__name__}: {exc}"))
            return None
        self.bundles.append(Path(path))
        verdict = snapshot.verdict
        self._say(WatchEvent("bundle", f"bundle {path}", verdict.kind, verdict.culprits, verdict.summary, str(path)))
        for note in self.source.collect_bundles(path):  # a job on several nodes, as `dump` does
            self._say(WatchEvent("note", f"note: {note}"))
        return str(path)


def _bare_snapshot(pid: int) -> Snapshot:
    return Snapshot(job=Job(launcher="unknown", pid=pid, host=socket.gethostname()), taken_at=time.time())


def _stamp() -> str:
    return time.strftime("%H:%M:%S")


def _stopped(info: ExitInfo) -> bool:
    """Ended by a polite stop (SIGTERM, SIGINT, SIGHUP): the launcher's teardown or a person's; never
    a cause of its own."""
    return info.signal in ("SIGTERM", "SIGINT", "SIGHUP") and info.reason != exits.OOM_KILLED


def _end_key(record: CrashRecord) -> tuple:
    """What makes two attempts' ends the same: the rank, and how and where it ended."""
    info = record.exit
    return record.rank, info.signal, info.reason or info.code, info.frame


def _is_cause(info: ExitInfo) -> bool:
    """A death that causes others rather than follows from one: a fatal signal that is no teardown
    (a SIGKILL counts: launchers tear down with SIGTERM first), the OOM killer, an error of its own."""
    if info.reason == exits.OOM_KILLED or info.signal == "SIGKILL":
        return True
    if info.signal is not None:
        return info.signal not in exits.TEARDOWN_SIGNALS
    return bool(info.reason) and info.reason not in exits.CONSEQUENCES and info.reason != exits.VANISHED
