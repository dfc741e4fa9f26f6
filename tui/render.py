"""Plain rich rendering of a snapshot, for `trainwatch snapshot` and `demo --no-tui`."""

from __future__ import annotations

from rich.console import Group as RichGroup
from rich.table import Table
from rich.text import Text

from trainwatch.probes.snapshot import Rank, Snapshot

VERDICT_STYLE = {
    "healthy": "bold green", "straggler": "bold yellow", "mismatch": "bold magenta",
    "hang": "bold red", "rendezvous": "bold cyan", "crashed": "bold red", "unknown": "bold",
}
STATE_STYLE = {"running": "green", "stuck": "red", "exited": "bright_red", "missing": "magenta", "unknown": "dim"}


def na(value: object, fmt: str = "{}") -> str:
    return "n/a" if value is None else fmt.format(value)


def human_bytes(value: int | None) -> str:
    if value is None:
        return "n/a"
    size = float(value)
    for unit in ("B", "K", "M", "G", "T"):
        if size < 1024 or unit == "T":
            return f"{size:.0f}{unit}" if unit in ("B", "K", "M") else f"{size:.1f}{unit}"
        size /= 1024
    return f"{size:.1f}T"


def state_text(rank: Rank) -> str:
    if rank.state == "exited" and rank.exit is not None:
        return rank.exit.signal or f"exit {rank.exit.code}" if (rank.exit.signal or rank.exit.code is not None) else "exited"
    if rank.state == "stuck" and rank.stuck_for_s is not None:
        return f"stuck {rank.stuck_for_s:.0f}s"
    return rank.state


def gpu_text(rank: Rank) -> str:
    if rank.gpu is None:
        return "n/a"
    util = na(rank.gpu.util_pct, "{:.0f}%")
    return f"{util} {human_bytes(rank.gpu.mem_used_bytes)}"


def verdict_line(snapshot: Snapshot) -> Text:
    verdict = snapshot.verdict
    line = Text()
    line.append(f" {verdict.kind.upper()} ", style=f"reverse {VERDICT_STYLE.get(verdict.kind, 'bold')}")
    line.append(f" {verdict.summary}")
    return line


def render_table(snapshot: Snapshot) -> RichGroup:
    """Verdict, one row per rank, the stack groups, then warnings and notes."""
    job = snapshot.job
    head = Text(f"{job.launcher} pid {job.pid} on {job.host}  world size {na(job.world_size)}  "
                f"window {snapshot.window_s:g}s", style="bold")
    table = Table(expand=False, pad_edge=False, box=None, header_style="bold")
    for column in ("rank", "pid", "state", "phase", "op", "where", "cpu%", "rss", "gpu"):
        table.add_column(column, no_wrap=column != "where")
    culprits = set(snapshot.verdict.culprits)
    for rank in snapshot.ranks:
        style = "bold" if rank.rank in culprits else ""
        table.add_row(
            Text(("▶ " if rank.rank in culprits else "  ") + na(rank.rank), style=style),
            na(rank.pid), Text(state_text(rank), style=STATE_STYLE.get(rank.state, "")),
            rank.phase, rank.op or "", rank.where or "", na(rank.cpu_pct, "{:.0f}"),
            human_bytes(rank.rss_bytes), gpu_text(rank),
        )
    parts: list = [head, verdict_line(snapshot), table, Text("stack groups", style="bold underline")]
    for group in snapshot.groups:
        label = f"rank {group.label}" if len(group.ranks) == 1 else f"ranks {group.label}"
        what = group.op or group.phase
        parts.append(Text(f"  {'▶' if group.culprit else ' '} {label}: {what}" + (f" ← {group.where}" if group.where else ""),
                          style="bold" if group.culprit else ""))
    for warning in snapshot.warnings:
        parts.append(Text(f"warning: {warning}", style="yellow"))
    for note in snapshot.notes:
        parts.append(Text(f"note: {note}", style="dim"))
    return RichGroup(*parts)
