"""summary.md of an evidence bundle: paste-ready for an issue tracker."""

from __future__ import annotations

import platform
import time
from importlib import metadata

from .bundle_rank import RankEvidence
from ..judge import exits
from ..judge import ras as ras_judge
from ..read.collectives import flightrec
from ..judge.steps import step_label
from ..judge.groups import group_what
from ..read.logs import ranklog
from ..observed import UNTOLD
from ..snapshot import GpuDevice, Job, Rank, Snapshot, age_text, compact_ranks, who
from ..wording import job_title
from ..wording import NA, how_ended, na, pct, size


def _trainwatch_version() -> str:
    try:
        return metadata.version("trainwatch")
    except metadata.PackageNotFoundError:
        return "unknown"


def render(snapshot: Snapshot, evidence: list[RankEvidence], host_notes: list[str], *,
           reason: str | None, redacted: bool, sources: dict[str, list[str]]) -> str:
    """The whole summary. ``sources``: collective-state source -> ranks/where it worked."""
    job, verdict = snapshot.job, snapshot.verdict
    title = f"{job.launcher} job {job.pid}" if job.pid else f"a job ({job.launcher})"
    out = [f"# trainwatch evidence: {job_title(job) if job.pods else f'{title} on {job.host}'}", ""]
    out.append(f"- taken: {time.strftime('%Y-%m-%d %H:%M:%S UTC', time.gmtime(snapshot.taken_at or time.time()))}")
    if reason:
        out.append(f"- reason: {reason}")
    out.append(f"- world size: {na(job.world_size)}, "
               f"ranks here: {len(snapshot.ranks)}")
    out.append(f"- launch command: `{na(' '.join(job.cmdline))}`")
    if not redacted:
        out.append("- **NOT REDACTED**: environment values and secrets were written as they are")
    out += ["", "## Verdict", "", f"**{verdict.kind}**: {na(verdict.summary)}"]
    if verdict.culprits:
        out.append(f"Culprit rank(s): {compact_ranks(verdict.culprits)}")
    out += [*(f"- warning: {w}" for w in snapshot.warnings)]
    out += _crash_lines(snapshot)
    out += pod_lines(job)

    out += ["", "## Collective state", ""]
    state = snapshot.collectives
    if state is None or (not state.ranks and state.ras is None):
        out.append("No collective state: no source had this job's collectives (a Flight Recorder trace needs "
                   "`trainwatch run`, NCCL's debug pipe or its dump files; see below for any that failed).")
    elif not state.ranks:
        out.append("No Flight Recorder trace was obtainable (see below); NCCL RAS answered.")
    else:
        if state.divergence:
            out.append(f"**First disagreement**: {state.divergence}")
            out.append(f"Culprit rank(s) by collectives: {compact_ranks(state.culprits)}")
        else:
            out.append("The ranks' collectives agree.")
        out += ["", f"Source: {state.source}", "", "```", *flightrec.describe(state, now=time.time()), "```"]
    if state is not None and state.ras is not None:
        out += ["", "### NCCL RAS (every rank of the job, from this node)", ""]
        if state.ras.finding:
            out.append(f"**Finding**: {state.ras.finding}")
            if state.ras.culprits:
                out.append(f"Culprit rank(s) by NCCL RAS: {compact_ranks(state.ras.culprits)}")
        out += ["", "```", *ras_judge.describe(state.ras), "```"]
    if sources:
        out += ["", "Sources that worked:"]
        out += [f"- {name}: {', '.join(where)}" for name, where in sorted(sources.items())]

    out += ["", "## Stack groups", ""]
    for group in snapshot.groups:
        named = sorted(set(group.ranks) & set(verdict.culprits))
        mark = (" **(culprit)**" if named == sorted(group.ranks) else f" **(culprit: {who(named)})**") if named else ""
        where = f" at `{group.where}`" if group.where else ""
        out.append(f"- {who(group.ranks)}: {group_what(group)}{where}{mark}")
    if not snapshot.groups:
        out.append(NA)
    waited: dict[str, list[int]] = {}
    for rank in snapshot.ranks:
        if rank.waits_for and rank.rank is not None:
            waited.setdefault(rank.waits_for, []).append(rank.rank)
    if waited:
        out += ["", "## What the ranks wait for", ""]
        out += [f"- {who(numbers)}: {what}" for what, numbers in waited.items()]

    culprits = set(verdict.culprits) | set(state.culprits if state else ())
    for ev in evidence:
        if ev.rank in culprits and ev.files.get("stacks.txt"):
            text = ev.files["stacks.txt"]
            text = text.decode(errors="replace") if isinstance(text, bytes) else text
            out += ["", f"### Stack of culprit rank {ev.rank} (PID {ev.pid})", "", "```", text.rstrip()[:8000], "```"]
    out += _culprit_logs(snapshot, evidence, culprits)

    by_rank = {ev.rank: ev for ev in evidence}
    faults = {rank.rank: na(by_rank[rank.rank].faulthandler if rank.rank in by_rank else None)
              for rank in snapshot.ranks}
    common = _most_common(list(faults.values()))
    out += ["", "## Ranks", ""]
    if common is not None and len(faults) > 1:
        out += [f"faulthandler, {'every rank' if len(set(faults.values())) == 1 else 'other ranks'}: {common}", ""]
    differs = any(value != common for value in faults.values()) or len(faults) == 1
    out += ["| rank | pid | state | step | phase | where |" + (" faulthandler |" if differs else ""),
            "|---|---|---|---|---|---|" + ("---|" if differs else "")]
    for rank in snapshot.ranks:
        step = na(step_label(rank.step, rank.step_period_s))
        fault = faults[rank.rank] if faults[rank.rank] != common or len(faults) == 1 else ""
        pid = na(rank.pid) if rank.container_pid is None else f"{rank.pid} ({rank.container_pid} in its container)"
        out.append(f"| {rank.rank} | {pid} | {state_word(rank)} | {step} | {rank.phase} "
                   f"| `{na(rank.where)}` |" + (f" {fault} |" if differs else ""))

    out += ["", "## GPUs and host", ""]
    for host in snapshot.hosts:
        out.append(f"- host {host.name}: driver {na(host.driver_version)}, "
                   f"CUDA driver {na(host.cuda_driver_version)}" + (f" ({host.error})" if host.error else ""))
        for gpu in host.gpus:
            out.append(f"  - GPU {gpu.index} {gpu.name or ''}: util {pct(gpu.util_pct)}, "
                       f"mem {size(gpu.mem_used_bytes)} / {size(gpu.mem_total_bytes)}"
                       f"{', LOST' if gpu.lost else ''}{', throttle ' + ','.join(gpu.throttle) if gpu.throttle else ''}"
                       f"{_activity(gpu)}")
        for line in host.xid_events:
            out.append(f"  - Xid: {line}")
    if not snapshot.hosts:
        out.append("No GPU facts in the snapshot.")

    out += ["", "## Versions", ""]
    versions = next((ev.versions for ev in evidence if ev.versions), {})
    out.append(f"- job Python: {na(versions.get('python'))}, torch: {na(versions.get('torch'))}, "
               f"torch CUDA: {na(versions.get('torch CUDA'))}, NCCL: {na(versions.get('NCCL'))}")
    driver = next((h.driver_version for h in snapshot.hosts if h.driver_version), None)
    cuda = next((h.cuda_driver_version for h in snapshot.hosts if h.cuda_driver_version), None)
    out.append(f"- driver: {na(driver)}, CUDA driver API: {na(cuda)}")
    out.append(f"- trainwatch {_trainwatch_version()} (Python {platform.python_version()}, {platform.platform()})")

    missing = [*snapshot.notes, *host_notes, *_rank_notes(evidence)]
    out += ["", "## Not collected, and why", ""]
    out += [f"- {line}" for line in dict.fromkeys(missing)] or ["Everything was collected."]
    return "\n".join(out) + "\n"


def state_word(rank: Rank) -> str:
    """The rank's state, or how it ended (the words of the live view's state column)."""
    if rank.exit is not None:
        return how_ended(rank.exit, alive=rank.state != "exited", short=True)
    if rank.state == "stuck" and rank.stuck_for_s is not None:
        source = f" ({rank.stuck_source})" if rank.stuck_source else ""
        return f"stuck ≥ {age_text(rank.stuck_for_s)}{source}"
    return rank.state


def _most_common(values: list[str]) -> str | None:
    return max(dict.fromkeys(values), key=values.count) if values else None


def _rank_notes(evidence: list[RankEvidence]) -> list[str]:
    """Each rank's notes said once: ``(every rank)`` when all share it, else for the ranks it concerns."""
    by_text: dict[str, list[RankEvidence]] = {}
    for ev in evidence:
        prefix = f"{ev.label}: "
        for note in dict.fromkeys(ev.notes):
            by_text.setdefault(note.removeprefix(prefix), []).append(ev)
    lines = []
    for text, evs in by_text.items():
        numbers = [ev.rank for ev in evs if ev.rank is not None]
        if len(evs) == len(evidence) and len(evidence) > 1:
            lines.append(f"{text} (every rank)")
        elif len(numbers) == len(evs):
            lines.append(f"{who(numbers)}: {text}")
        else:
            lines += [f"{ev.label}: {text}" for ev in evs]
    return lines


def _crash_lines(snapshot: Snapshot) -> list[str]:
    """One line per dead rank (first to die first): how it ended, the reason and the fatal message."""
    dead = [r for r in snapshot.ranks if (r.state == "exited" and exits.abnormal(r.exit) and r.exit.reason != UNTOLD)
            or exits.raised_while_alive(r)]
    if not dead:
        return []
    out = ["", "## Crash", ""]
    for rank in sorted(dead, key=lambda r: (not r.exit.first, r.exit.at or 0.0)):
        out.append(_crash_line(rank))
    return out


def pod_lines(job: Job) -> list[str]:
    """The job's pods as Kubernetes reported them, one line each (``--k8s``)."""
    if not job.pods:
        return []
    out = ["", "## Pods (Kubernetes)", ""]
    for pod in job.pods:
        ranks = f" (ranks {compact_ranks(pod.ranks)})" if pod.ranks else ""
        node = f" on node {pod.node}" if pod.node else ""
        out.append(f"- {pod.words}{ranks}{node}")
    return out


def _pid(rank: Rank) -> str:
    """``812``, or ``812, 6 in its container``."""
    return f"{rank.pid}, {rank.container_pid} in its container" if rank.container_pid is not None else str(rank.pid)


def _crash_line(rank: Rank) -> str:
    info = rank.exit
    alive = rank.state != "exited"
    how = how_ended(info, alive)
    line = f"- rank {rank.rank} (PID {_pid(rank)}): {how}" + (" — **first to die**" if info.first else "")
    if info.reason:
        line += f"\n  - reason: {info.reason}"
    if info.message:
        line += f"\n  - message: `{info.message.replace('`', chr(39))}`"
    if info.frame:
        line += f"\n  - in: `{info.frame}`"
    if alive and rank.detail:
        line += f"\n  - {rank.detail}"
    return line


def _culprit_logs(snapshot: Snapshot, evidence: list[RankEvidence], culprits: set[int]) -> list[str]:
    """Each culprit's log as it matters: its error first, then its last output without noise."""
    paths = [r.log_path for r in snapshot.ranks if r.log_path]
    out: list[str] = []
    for ev in evidence:
        rank = snapshot.rank(ev.rank) if ev.rank is not None else None
        text = ev.files.get("log-tail.txt")
        if rank is None or ev.rank not in culprits or not text:
            continue
        text = text.decode(errors="replace") if isinstance(text, bytes) else text
        own = paths.count(rank.log_path) <= 1
        lines = text.splitlines()
        mine = ranklog.rank_lines(lines, rank.rank, rank.local_rank, own)
        shown = mine if own else ranklog.rank_lines(lines, rank.rank, rank.local_rank, own, unprefixed=True)
        tail = ranklog.telling_tail(shown, ranklog.reason_of(mine), 20)
        if tail:
            out += ["", f"### Log of culprit rank {ev.rank}", "", "```", *tail, "```"]
    return out


def _activity(gpu: GpuDevice) -> str:
    """``, power 595 / 700 W, SM active 88%, tensor 61%, DRAM bw 43%`` (what NVML offered; never judged)."""
    out = ""
    if gpu.power_w is not None:
        out += f", power {gpu.power_w:.0f}" + (f" / {gpu.power_limit_w:.0f}" if gpu.power_limit_w is not None else "") + " W"
    for name, value in (("SM active", gpu.sm_active_pct), ("tensor", gpu.tensor_active_pct),
                        ("DRAM bw", gpu.dram_bw_pct)):
        if value is not None:
            out += f", {name} {value:.0f}%"
    return out
