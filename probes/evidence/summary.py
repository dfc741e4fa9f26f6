"""summary.md of an evidence bundle: paste-ready for an issue tracker."""

from __future__ import annotations

import platform
import time
from importlib import metadata

from .bundle_rank import RankEvidence
from ..judge import exits
from ..judge import ras as ras_judge
from ..read import flightrec
from ..judge.steps import step_label
from ..judge.groups import group_what
from ..read import ranklog
from ..snapshot import Rank, Snapshot, compact_ranks, who


def _trainwatch_version() -> str:
    try:
        return metadata.version("trainwatch")
    except metadata.PackageNotFoundError:
        return "unknown"


def _bytes(value: int | None) -> str:
    return f"{value / 2**30:.1f} GiB" if value is not None else "n/a"


def render(snapshot: Snapshot, evidence: list[RankEvidence], host_notes: list[str], *,
           reason: str | None, redacted: bool, sources: dict[str, list[str]]) -> str:
    """The whole summary. ``sources``: collective-state source -> ranks/where it worked."""
    job, verdict = snapshot.job, snapshot.verdict
    out = [f"# trainwatch evidence: {job.launcher} job {job.pid} on {job.host}", ""]
    out.append(f"- taken: {time.strftime('%Y-%m-%d %H:%M:%S UTC', time.gmtime(snapshot.taken_at or time.time()))}")
    if reason:
        out.append(f"- reason: {reason}")
    out.append(f"- world size: {job.world_size if job.world_size is not None else 'n/a'}, "
               f"ranks here: {len(snapshot.ranks)}")
    out.append(f"- launch command: `{' '.join(job.cmdline) or 'n/a'}`")
    if not redacted:
        out.append("- **NOT REDACTED**: environment values and secrets were written as they are")
    out += ["", "## Verdict", "", f"**{verdict.kind}**: {verdict.summary or 'n/a'}"]
    if verdict.culprits:
        out.append(f"Culprit rank(s): {compact_ranks(verdict.culprits)}")
    out += [*(f"- warning: {w}" for w in snapshot.warnings)]
    out += _crash_lines(snapshot)

    out += ["", "## Collective state", ""]
    state = snapshot.collectives
    if state is None or (not state.ranks and state.ras is None):
        out.append("No collective state: no Flight Recorder trace was obtainable (see below).")
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
        mark = " **(culprit)**" if group.culprit else ""
        where = f" at `{group.where}`" if group.where else ""
        out.append(f"- {who(group.ranks)}: {group_what(group)}{where}{mark}")
    if not snapshot.groups:
        out.append("n/a")

    culprits = set(verdict.culprits) | set(state.culprits if state else ())
    for ev in evidence:
        if ev.rank in culprits and ev.files.get("stacks.txt"):
            text = ev.files["stacks.txt"]
            text = text.decode(errors="replace") if isinstance(text, bytes) else text
            out += ["", f"### Stack of culprit rank {ev.rank} (PID {ev.pid})", "", "```", text.rstrip()[:8000], "```"]
    out += _culprit_logs(snapshot, evidence, culprits)

    out += ["", "## Ranks", "", "| rank | pid | state | step | phase | where | faulthandler |",
            "|---|---|---|---|---|---|---|"]
    by_rank = {ev.rank: ev for ev in evidence}
    for rank in snapshot.ranks:
        ev = by_rank.get(rank.rank)
        fault = ev.faulthandler if ev else "n/a"
        step = step_label(rank.step, rank.step_period_s) or "n/a"
        out.append(f"| {rank.rank} | {rank.pid} | {rank.state} | {step} | {rank.phase} "
                   f"| `{rank.where or 'n/a'}` | {fault} |")

    out += ["", "## GPUs and host", ""]
    for host in snapshot.hosts:
        out.append(f"- host {host.name}: driver {host.driver_version or 'n/a'}, "
                   f"CUDA driver {host.cuda_driver_version or 'n/a'}" + (f" ({host.error})" if host.error else ""))
        for gpu in host.gpus:
            out.append(f"  - GPU {gpu.index} {gpu.name or ''}: util {gpu.util_pct if gpu.util_pct is not None else 'n/a'}%, "
                       f"mem {_bytes(gpu.mem_used_bytes)} / {_bytes(gpu.mem_total_bytes)}"
                       f"{', LOST' if gpu.lost else ''}{', throttle ' + ','.join(gpu.throttle) if gpu.throttle else ''}")
        for line in host.xid_events:
            out.append(f"  - Xid: {line}")
    if not snapshot.hosts:
        out.append("No GPU facts in the snapshot.")

    out += ["", "## Versions", ""]
    versions = next((ev.versions for ev in evidence if ev.versions), {})
    out.append(f"- job Python: {versions.get('python', 'n/a')}, torch: {versions.get('torch', 'n/a')}, "
               f"torch CUDA: {versions.get('torch CUDA', 'n/a')}, NCCL: {versions.get('NCCL', 'n/a')}")
    driver = next((h.driver_version for h in snapshot.hosts if h.driver_version), None)
    cuda = next((h.cuda_driver_version for h in snapshot.hosts if h.cuda_driver_version), None)
    out.append(f"- driver: {driver or 'n/a'}, CUDA driver API: {cuda or 'n/a'}")
    out.append(f"- trainwatch {_trainwatch_version()} (Python {platform.python_version()}, {platform.platform()})")

    missing = [*snapshot.notes, *host_notes, *(n for ev in evidence for n in ev.notes)]
    out += ["", "## Not collected, and why", ""]
    out += [f"- {line}" for line in dict.fromkeys(missing)] or ["Everything was collected."]
    return "\n".join(out) + "\n"


def _crash_lines(snapshot: Snapshot) -> list[str]:
    """One line per dead rank (first to die first): how it ended, the reason and the fatal message."""
    dead = [r for r in snapshot.ranks if (r.state == "exited" and exits.abnormal(r.exit)) or exits.raised_while_alive(r)]
    if not dead:
        return []
    out = ["", "## Crash", ""]
    for rank in sorted(dead, key=lambda r: (not r.exit.first, r.exit.at or 0.0)):
        out.append(_crash_line(rank))
    return out


def _crash_line(rank: Rank) -> str:
    info = rank.exit
    alive = rank.state != "exited"
    how = "raised an uncaught exception; the process is still alive" if alive else exits.how(info)
    line = f"- rank {rank.rank} (PID {rank.pid}): {how}" + (" — **first to die**" if info.first else "")
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
