"""Write an evidence bundle: everything about a hung or crashed job, redacted, in one place.

Layout of ``trainwatch-<host>-<pid>-<UTC time>/``::

    bundle.json        what this is (format, version, time, source pid, redacted or not)
    summary.md         paste-ready: verdict, collectives, stacks, GPUs, versions, gaps
    snapshot.json      the snapshot at dump time (``trainwatch snapshot --json`` schema)
    ranks/<rank>/      stacks.txt, stacks-native.txt, hook-stacks.txt, faulthandler.txt,
                       flight-recorder/*, proc.txt, fds.txt, env.txt, nccl-settings.txt,
                       log-tail.txt (as the live view reads it), log-raw.txt, notes.txt
    host/              gpu.txt, xid.txt, process-tree.txt, ras.txt, ras.json, ras-summary.txt,
                       debug-server.txt

Written owner-only into ``<name>.partial/`` and renamed when complete (a tarball goes
through a temp file and ``os.replace``), so the final name never holds half a bundle.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import socket
import tarfile
import time
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import psutil

from ..errors import OutputError, TrainwatchError
from .bundle_rank import RankEvidence, RankPlan, bounded, collect_rank
from ..redact import Redactor
from .summary import render
from ..judge.judgement import JudgeMemory, JudgeOptions, judge_job
from ..judge.warnings import rejudged_warnings
from ..read.collectives import hookclient, nccl_state
from ..read.collectives.collective_feed import CollectiveFeed, FeedEvidence
from ..read.processes.discover import find_job
from ..read.collectives.nccl_state import PIPE_WAIT_S
from ..read.processes.process import JobProcesses, RankProcess
from ..read.collectives.sources import FeedOptions
from ..observed import observed_snapshot
from ..snapshot import UNJUDGED_VERDICTS, CollectiveState, Rank, Snapshot, ThreadStack
from ..source import Source

BUNDLE_FORMAT = "trainwatch-bundle"
BUNDLE_VERSION = 1
MAX_WORKERS = 8
COLLECTIVE_WAIT_S = PIPE_WAIT_S + 10.0  # after the ranks' own evidence: a pipe dump may still come


def bundle_name(host: str, pid: int | str, when: float | None = None) -> str:
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(when or time.time()))
    return f"trainwatch-{host}-{pid}-{stamp}"


class _Writer:
    """Owner-only files under one root; every text goes through the redactor."""

    def __init__(self, root: Path, redactor: Redactor) -> None:
        self.root, self.redactor = root, redactor
        self.altered: list[str] = []

    def write(self, rel: str, content: str | bytes) -> None:
        path = self.root / rel
        self._mkdirs(path.parent)
        if isinstance(content, bytes):
            try:
                content = content.decode("utf-8")
            except UnicodeDecodeError:
                pass  # binary: written as it is, unredacted text cannot hide in it
        if isinstance(content, str):
            data = self.redactor.text(content).encode()
        else:
            # Binary (pickled traces): mask in place; note when that changed the file.
            text = content.decode("latin-1")
            masked = self.redactor.text(text)
            if masked != text:
                self.altered.append(rel)
            data = masked.encode("latin-1", errors="replace")
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)

    def _mkdirs(self, path: Path) -> None:
        if path.is_dir():
            return
        self._mkdirs(path.parent)
        path.mkdir(mode=0o700)


def _plans(job, snapshot: Snapshot, native: bool, fault_signal: int | None,
           debug_urls: dict[int, str], early: Mapping[int, tuple[ThreadStack, ...]]) -> list[RankPlan]:
    run_dir = Path(job.run_dir) if job and job.run_dir else None
    sockets = hookclient.armed_ranks(run_dir) if run_dir else {}
    if job is not None:
        procs = [(r.pid, r.rank, r.log_path) for r in job.ranks]
        launcher, host = job.launcher_pid, job.host
    else:  # discovery failed: fall back to the snapshot's ranks of this node (never another node's PIDs)
        procs = [(r.pid, r.rank, r.log_path) for r in snapshot.ranks if r.pid and _here(r, snapshot)]
        launcher, host = None, snapshot.job.host
    known = {pid for pid, _, _ in procs}
    procs += [(r.pid, r.rank, r.log_path) for r in snapshot.ranks if r.pid in early and r.pid not in known]
    return [RankPlan(pid=pid, rank=rank, host=host, launcher_pid=launcher, run_dir=run_dir,
                     hook_socket=sockets.get(rank) if rank is not None else None, log_path=log,
                     native=native, fault_signal=fault_signal,
                     debug_url=debug_urls.get(rank) if rank is not None else None,
                     early_stacks=early.get(pid, ()))
            for pid, rank, log in procs]


def _collect_all(plans: list[RankPlan], native: bool) -> list[RankEvidence]:
    """Ranks in parallel; a rank that takes too long leaves a note, never blocks the dump."""
    bound = 30.0 + (30.0 if native else 0.0)
    results: list[RankEvidence] = []
    with ThreadPoolExecutor(max_workers=min(MAX_WORKERS, max(1, len(plans)))) as pool:
        futures = [pool.submit(bounded, lambda p=p: collect_rank(p), bound) for p in plans]
        for plan, future in zip(plans, futures):
            evidence, why = future.result()
            if evidence is None:
                evidence = RankEvidence(rank=plan.rank, pid=plan.pid)
                evidence.note(f"collection failed: {why}")
            results.append(evidence)
    return results


def _process_tree(root_pid: int, redactor: Redactor) -> str:
    """The job's processes, indented under the launcher, with (redacted) command lines."""
    try:
        root = psutil.Process(root_pid)
        procs = [root, *root.children(recursive=True)]
    except psutil.Error as exc:
        return f"process tree of {root_pid} unreadable: {exc}\n"
    lines = []
    for proc in procs:
        try:
            depth = 0 if proc.pid == root_pid else next(
                (i + 1 for i, p in enumerate(proc.parents()) if p.pid == root_pid), 1)
            cmd = " ".join(redactor.cmdline(proc.cmdline()))
            lines.append(f"{'  ' * depth}{proc.pid} [{proc.status()}] {cmd}")
        except psutil.Error:
            lines.append(f"  {proc.pid} (gone)")
    return "\n".join(lines) + "\n"


def _host_files(snapshot: Snapshot) -> tuple[dict[str, str], list[str]]:
    files, notes = {}, []
    if snapshot.hosts:
        files["host/gpu.txt"] = json.dumps([dataclasses.asdict(h) for h in snapshot.hosts], indent=2) + "\n"
        xid = [f"{h.name}: {line}" for h in snapshot.hosts for line in h.xid_events]
        errors = [f"{h.name}: {h.error}" for h in snapshot.hosts if h.error]
        files["host/xid.txt"] = "\n".join(xid or ["no Xid events in the snapshot", *errors]) + "\n"
    else:
        notes.append("GPU state and Xid events: the snapshot holds no host facts")
    return files, notes


def _here(rank: Rank, snapshot: Snapshot) -> bool:
    """A rank of this node: a merged snapshot holds other nodes' PIDs, which mean other processes here."""
    return rank.host in ("", snapshot.job.host, socket.gethostname())


def _snapshot_job(snapshot: Snapshot) -> JobProcesses:
    """The snapshot's ranks as a job to read collective state of (discovery failed at dump time)."""
    ranks = tuple(RankProcess(pid=r.pid, rank=r.rank, local_rank=r.local_rank, log_path=r.log_path)
                  for r in snapshot.ranks if r.pid and _here(r, snapshot))
    return JobProcesses(launcher=snapshot.job.launcher, root_pid=snapshot.job.pid, host=snapshot.job.host,
                        ranks=ranks, run_dir=snapshot.job.run_dir, started_at=snapshot.job.started_at)


def _collective_evidence(job: JobProcesses, debug_urls: dict[int, str]) -> CollectiveFeed:
    """Every collective-state source, asked once for everything (the debug-info pipes, NCCL RAS's
    text and JSON reports, the debug servers), keeping the raw evidence; read meanwhile."""
    return CollectiveFeed(job, options=FeedOptions(bundle=True, debug_urls=debug_urls), min_interval=0.0)


def _with_collectives(snapshot: Snapshot, fields: Mapping[str, object], redactor: Redactor,
                      familiar: Mapping[int, frozenset[str]] | None = None) -> Snapshot:
    """The snapshot as the bundle shows it: the command line redacted and, where the bundle read
    collective state of its own, judged again with it (:func:`rejudged`)."""
    job = dataclasses.replace(snapshot.job, cmdline=redactor.cmdline(snapshot.job.cmdline))
    taken = dataclasses.replace(snapshot, job=job)
    fields = {name: value for name, value in fields.items() if value}
    if snapshot.collectives is not None and snapshot.collectives.ras is not None:
        fields.pop("ras", None)  # the live view's RAS state, judged across its polls, beats one look
    if not fields:
        return taken
    return rejudged(taken, fields, familiar)


def rejudged(snapshot: Snapshot, fields: Mapping[str, object],
             familiar: Mapping[int, frozenset[str]] | None = None) -> Snapshot:
    """The snapshot with the bundle's own collective evidence (``ObservedJob`` fields, each
    source's reading) judged again by the one judge, so the summary's verdict and its Collective
    state section tell one story. A source the bundle read replaces the snapshot's reading of it;
    the live view's NCCL RAS state is kept. A verdict that finds nothing
    (healthy, unknown) does not replace the sampled one. ``familiar``: where the source saw each
    rank while running (its judge's memory), for tie-breaks."""
    fields = dict(fields)
    mine, live_ras = fields.get("collectives"), snapshot.collectives.ras if snapshot.collectives else None
    if isinstance(mine, CollectiveState) and mine.ras is None and live_ras is not None:
        fields["collectives"] = dataclasses.replace(mine, ras=live_ras)
    observed = dataclasses.replace(observed_snapshot(snapshot), **fields)
    judged = judge_job(observed, JudgeMemory.after(snapshot, familiar), snapshot.taken_at,
                       JudgeOptions(window=snapshot.window_s))
    if judged.verdict.kind in UNJUDGED_VERDICTS:
        return dataclasses.replace(snapshot, collectives=judged.collectives)
    return dataclasses.replace(snapshot, collectives=judged.collectives, verdict=judged.verdict, groups=judged.groups,
                               warnings=rejudged_warnings(snapshot, judged.warnings))


def _manifest(source_pid: int, reason: str | None, redacted: bool, evidence: list[RankEvidence],
              sources: dict[str, list[str]]) -> str:
    return json.dumps({
        "format": BUNDLE_FORMAT, "version": BUNDLE_VERSION, "created_at": time.time(),
        "source_pid": source_pid, "host": socket.gethostname(), "reason": reason, "redacted": redacted,
        "ranks": sorted(str(ev.rank) for ev in evidence), "collective_sources": sources,
    }, indent=2) + "\n"


def _env_text(env: dict[str, str] | None, redactor: Redactor) -> str:
    if env is None:
        return "environment unreadable\n"
    return "".join(f"{k}={v}\n" for k, v in redactor.env(env).items())


def write_evidence(source: Source, snapshot: Snapshot, out_dir: Path, **options: Any) -> Path:
    """Write an evidence bundle about ``snapshot``'s job into ``out_dir`` while ``source`` holds
    its judgement; returns the bundle's path (``write_bundle`` names it)."""
    # A source over other nodes alone (a login box's view of pods) has no job here: its PIDs are the pods'.
    pid = None if getattr(source, "local", "") is None else snapshot.job.pid
    with source.paused_judgement():
        return write_bundle(pid, snapshot, out_dir, familiar=source.remembered_places(), **options)


def write_bundle(source_pid: int | None, snapshot: Snapshot, out_dir: Path, *, tar: bool = False,
                 redact: bool = True, reason: str | None = None, native: bool = True,
                 fault_signal: int | None = None, familiar: Mapping[int, frozenset[str]] | None = None,
                 early_stacks: Mapping[int, tuple[ThreadStack, ...]] | None = None) -> Path:
    """Collect evidence about the job of ``source_pid`` and write the bundle; returns its path
    (``source_pid`` None: no rank runs here, a login box's view of pods: the snapshot alone).
    ``familiar``: the source judge's memory of where ranks ran (see :func:`rejudged`);
    ``early_stacks``: per PID, stacks read at the job's first death (``watch``), kept for a rank
    that is gone by now.

    Raises :class:`OutputError` when ``out_dir`` cannot hold it (nothing is left behind).
    """
    out_dir = Path(out_dir)
    host = socket.gethostname()
    name = bundle_name(host, source_pid if source_pid is not None else "pods")
    partial = out_dir / f"{name}.partial"
    final = out_dir / (f"{name}.tar.gz" if tar else name)
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
        partial.mkdir(mode=0o700)
    except OSError as exc:
        raise OutputError(f"cannot create the bundle in {out_dir}: {exc.strerror}",
                          "choose another directory with --out") from None

    try:  # whatever stops it half-way (an error, Ctrl-C, SIGTERM, the terminal's SIGHUP) leaves no .partial
        notes: list[str] = []
        job = None
        if source_pid is not None:
            try:
                job = find_job(source_pid)
            except TrainwatchError as exc:
                notes.append(f"job discovery failed at dump time ({exc.message}); used the snapshot's ranks")
        debug_urls: dict[int, str] = {}
        no_debug_server = None
        if job is not None:
            ranks = [r.rank for r in job.ranks if r.rank is not None]
            result, why = bounded(lambda: nccl_state.debug_server_urls(job.master_addr, job.master_port, ranks), 30)
            debug_urls, no_debug_server = result if result else ({}, why)
        if source_pid is None:  # no rank runs here (a login box): the nodes' own bundles hold their ranks
            evidence, collective = [], FeedEvidence({})
            notes.append("no rank of the job runs where this bundle was written: each node's (pod's) own bundle "
                         "is under hosts/<node>/")
        else:
            feed = _collective_evidence(job or _snapshot_job(snapshot), debug_urls)
            try:
                evidence = _collect_all(_plans(job, snapshot, native, fault_signal, debug_urls, early_stacks or {}),
                                        native)
                feed.wait(COLLECTIVE_WAIT_S)
                collective = feed.evidence()
            finally:
                feed.close()
        for ev in evidence:
            if ev.faulthandler and ev.faulthandler != "collected":
                ev.note(f"faulthandler traces: {ev.faulthandler}")
            for note in collective.rank_notes.get(ev.rank, ()) if ev.rank is not None else ():
                ev.note(note)
        notes += collective.notes
        if no_debug_server and not set(collective.worked) - {"ras"}:  # said only where no other source had a trace
            notes.append(f"torch.distributed.debug: {no_debug_server}")
        host_files, host_notes = _host_files(snapshot)
        notes += host_notes

        redactor = Redactor.from_envs([ev.env or {} for ev in evidence],
                                      [ev.cmdline for ev in evidence] + [snapshot.job.cmdline], enabled=redact)
        sources = {name: list(where) for name, where in collective.worked.items()}
        bundle_snapshot = _with_collectives(snapshot, collective.fields, redactor, familiar)
        try:
            writer = _Writer(partial, redactor)
            writer.write("bundle.json", _manifest(source_pid, reason, redact, evidence, sources))
            writer.write("snapshot.json", bundle_snapshot.to_json())
            for ev in evidence:
                base = f"ranks/{ev.rank if ev.rank is not None else 'pid' + str(ev.pid)}"
                for rel, content in ev.files.items():
                    writer.write(f"{base}/{rel}", content)
                writer.write(f"{base}/env.txt", _env_text(ev.env, redactor))
                writer.write(f"{base}/cmdline.txt", " ".join(redactor.cmdline(ev.cmdline)) + "\n")
                writer.write(f"{base}/notes.txt", "\n".join(ev.notes or ["nothing missing"]) + "\n")
            for rel, content in {**host_files, **collective.files}.items():
                writer.write(rel, content)
            root = job.root_pid if job else source_pid
            if root is not None:
                writer.write("host/process-tree.txt", _process_tree(root, redactor))
            if writer.altered:
                notes.append(f"secrets masked inside binary files: {', '.join(writer.altered)}")
            writer.write("summary.md", render(bundle_snapshot, evidence, notes, reason=reason,
                                              redacted=redact, sources=sources))
            return _finish(partial, final, tar)
        except OSError as exc:
            raise OutputError(f"cannot write the bundle to {out_dir}: {exc.strerror or exc}",
                              "free some space or choose another directory with --out") from None
    finally:
        if partial.exists():
            shutil.rmtree(partial, ignore_errors=True)


def _finish(partial: Path, final: Path, tar: bool) -> Path:
    if not tar:
        os.rename(partial, final)
        return final
    tmp = final.with_name(f".{final.name}.tmp")
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "wb") as raw, tarfile.open(fileobj=raw, mode="w:gz") as archive:
            archive.add(partial, arcname=final.name.removesuffix(".tar.gz"))
        os.replace(tmp, final)
    finally:
        if tmp.exists():
            tmp.unlink()
    return final
