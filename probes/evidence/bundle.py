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
from ..read import flightrec
from ..judge.judgement import JudgeMemory, judge_job
from ..read import hookclient, nccl_state, ras
from ..read.discover import find_job
from ..observed import ObservedRas, observed_snapshot
from ..snapshot import UNJUDGED_VERDICTS, CollectiveState, Snapshot
from ..source import Source

BUNDLE_FORMAT = "trainwatch-bundle"
BUNDLE_VERSION = 1
MAX_WORKERS = 8


def bundle_name(host: str, pid: int, when: float | None = None) -> str:
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
                pass
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
           debug_urls: dict[int, str]) -> list[RankPlan]:
    run_dir = Path(job.run_dir) if job and job.run_dir else None
    sockets = hookclient.armed_ranks(run_dir) if run_dir else {}
    if job is not None:
        procs = [(r.pid, r.rank, r.log_path) for r in job.ranks]
        launcher, host = job.launcher_pid, job.host
    else:  # discovery failed: fall back to the snapshot's ranks
        procs = [(r.pid, r.rank, r.log_path) for r in snapshot.ranks if r.pid]
        launcher, host = None, snapshot.job.host
    return [RankPlan(pid=pid, rank=rank, host=host, launcher_pid=launcher, run_dir=run_dir,
                     hook_socket=sockets.get(rank) if rank is not None else None, log_path=log,
                     native=native, fault_signal=fault_signal,
                     debug_url=debug_urls.get(rank) if rank is not None else None)
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


def _ras(evidence: list[RankEvidence]) -> tuple[dict[str, str], list[str], list[str], ObservedRas | None]:
    """NCCL RAS once per address the ranks name (default localhost:28028): the text report a person
    reads (host/ras.txt), the JSON one where the service has it (host/ras.json), and this job's
    report as evidence for the judge."""
    files, notes, worked, seen = {}, [], [], None
    envs = [ev.env or {} for ev in evidence]
    if envs and all(ras.disabled(env) for env in envs):
        return files, ["NCCL RAS: off in this job (NCCL_RAS_ENABLE=0)"], worked, None
    pids = {ev.pid for ev in evidence if ev.pid is not None}
    addresses = {ras.address(env) for env in envs} or {("localhost", ras.DEFAULT_PORT)}
    for host, port in sorted(addresses):
        text = ras.query(host, port, want_json=False)
        if text.raw is None:
            notes.append(f"NCCL RAS: {text.note}")
            continue
        files["host/ras.txt"] = text.raw.decode(errors="replace")
        files["host/ras-summary.txt"] = "\n".join(nccl_state.summarize_ras(files["host/ras.txt"])) + "\n"
        worked.append(f"{host}:{port}")
        at = time.time()
        reply = ras.query(host, port, want_json=True)
        if reply.format == "json" and reply.raw:
            files["host/ras.json"] = reply.raw.decode(errors="replace")
        report = reply.report or text.report
        whose = ras.ownership(report, pids) if report is not None else None
        if whose:
            notes.append(whose)
        elif report is not None and seen is None:
            seen = ObservedRas(reply.origin, at, report, tuple(ras.local_names().items()))
        notes += [f"NCCL RAS: {r.note}" for r in (text, reply) if r.note]
    return files, notes, worked, seen


def _with_collectives(snapshot: Snapshot, evidence: list[RankEvidence], redactor: Redactor,
                      extra_notes: list[str], familiar: Mapping[int, frozenset[str]] | None = None,
                      ras_seen: ObservedRas | None = None) -> Snapshot:
    traces = {ev.rank: ev.trace for ev in evidence if ev.rank is not None and ev.trace is not None}
    sources = sorted({ev.trace_source for ev in evidence if ev.trace is not None and ev.trace_source})
    state = flightrec.analyze(traces, source="+".join(sources) or "flight-recorder") if traces else None
    if state is not None and snapshot.collectives is not None and snapshot.collectives.ras is not None:
        state = dataclasses.replace(state, ras=snapshot.collectives.ras)  # judged across the live view's polls
    if snapshot.collectives is not None and snapshot.collectives.ras is not None:
        ras_seen = None  # the live view's RAS state beats the bundle's single look
    job = dataclasses.replace(snapshot.job, cmdline=redactor.cmdline(snapshot.job.cmdline))
    notes = tuple(dict.fromkeys([*snapshot.notes, *extra_notes]))
    taken = dataclasses.replace(snapshot, job=job, notes=notes)
    if (state is None or state == snapshot.collectives) and ras_seen is None:
        return taken
    return rejudged(taken, state or snapshot.collectives, familiar, ras_seen)


def rejudged(snapshot: Snapshot, collectives: CollectiveState | None,
             familiar: Mapping[int, frozenset[str]] | None = None, ras_seen: ObservedRas | None = None) -> Snapshot:
    """The snapshot with the bundle's own collective state (and NCCL RAS reply), judged again by
    the one judge, so the summary's verdict and its Collective state section tell one story. A
    verdict that finds nothing (healthy, unknown) does not replace the sampled one. ``familiar``:
    where the source saw each rank while running (its judge's memory), for tie-breaks."""
    ras = (ras_seen,) if ras_seen is not None else ()
    judged = judge_job(dataclasses.replace(observed_snapshot(snapshot), collectives=collectives, ras=ras),
                       JudgeMemory.after(snapshot, familiar), snapshot.taken_at)
    if judged.verdict.kind in UNJUDGED_VERDICTS:
        return dataclasses.replace(snapshot, collectives=judged.collectives)
    return dataclasses.replace(snapshot, collectives=judged.collectives, verdict=judged.verdict, groups=judged.groups)


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
    with source.paused_judgement():
        return write_bundle(snapshot.job.pid, snapshot, out_dir, familiar=remembered_places(source), **options)


def remembered_places(source: object) -> Mapping[int, frozenset[str]] | None:
    """Where a source's judge saw each rank while running (live and multi-node sources keep a
    ``JudgeMemory``; a bundle source has none)."""
    memory = getattr(source, "memory", None)
    return memory.familiar if isinstance(memory, JudgeMemory) else None


def write_bundle(source_pid: int, snapshot: Snapshot, out_dir: Path, *, tar: bool = False,
                 redact: bool = True, reason: str | None = None, native: bool = True,
                 fault_signal: int | None = None, familiar: Mapping[int, frozenset[str]] | None = None) -> Path:
    """Collect evidence about the job of ``source_pid`` and write the bundle; returns its path.
    ``familiar``: the source judge's memory of where ranks ran (see :func:`rejudged`).

    Raises :class:`OutputError` when ``out_dir`` cannot hold it (nothing is left behind).
    """
    out_dir = Path(out_dir)
    host = socket.gethostname()
    name = bundle_name(host, source_pid)
    partial = out_dir / f"{name}.partial"
    final = out_dir / (f"{name}.tar.gz" if tar else name)
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
        partial.mkdir(mode=0o700)
    except OSError as exc:
        raise OutputError(f"cannot create the bundle in {out_dir}: {exc.strerror}",
                          "choose another directory with --out") from None

    notes: list[str] = []
    try:
        job = find_job(source_pid)
    except TrainwatchError as exc:
        job = None
        notes.append(f"job discovery failed at dump time ({exc.message}); used the snapshot's ranks")
    debug_urls: dict[int, str] = {}
    if job is not None:
        ranks = [r.rank for r in job.ranks if r.rank is not None]
        result, why = bounded(lambda: nccl_state.debug_server_urls(job.master_addr, job.master_port, ranks), 30)
        debug_urls, why = result if result else ({}, why)
        if why:
            notes.append(f"torch.distributed.debug: {why}")
    evidence = _collect_all(_plans(job, snapshot, native, fault_signal, debug_urls), native)
    for ev in evidence:
        if ev.faulthandler and ev.faulthandler != "collected":
            ev.note(f"faulthandler traces: {ev.faulthandler}")
        if ev.trace is None and ev.rank is not None:
            ev.note("no Flight Recorder trace obtainable")
    ras_files, ras_notes, ras_worked, ras_seen = _ras(evidence)
    notes += ras_notes
    host_files, host_notes = _host_files(snapshot)
    notes += host_notes

    redactor = Redactor.from_envs([ev.env or {} for ev in evidence],
                                  [ev.cmdline for ev in evidence] + [snapshot.job.cmdline], enabled=redact)
    sources: dict[str, list[str]] = {}
    for ev in evidence:
        if ev.trace_source:
            sources.setdefault(ev.trace_source, []).append(ev.label)
    if ras_worked:
        sources["ras"] = ras_worked
    bundle_snapshot = _with_collectives(snapshot, evidence, redactor, [], familiar, ras_seen)
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
        for rel, content in {**host_files, **ras_files}.items():
            writer.write(rel, content)
        root = job.root_pid if job else source_pid
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
