"""Plain rich rendering of a snapshot, for `trainwatch snapshot` and `demo --no-tui`."""

from __future__ import annotations

from rich.console import Group as RichGroup
from rich.table import Table
from rich.text import Text

from trainwatch.probes.snapshot import Rank, Snapshot
from trainwatch.probes.steps import step_label
from trainwatch.tui.widgets import format as fmt


def state_text(rank: Rank) -> Text:
    label = fmt.state_label(rank)
    if rank.state == "stuck" and rank.stuck_for_s is not None:
        label += f" {fmt.duration(rank.stuck_for_s)}"
    style = fmt.STATE_STYLES["exited"] if rank.exit is not None else fmt.STATE_STYLES.get(rank.state, "")
    return Text(label, style=style)


def gpu_text(rank: Rank) -> str:
    if rank.gpu is None:
        return fmt.NA
    return f"{fmt.pct(rank.gpu.util_pct)} {fmt.size(rank.gpu.mem_used_bytes)}"


def verdict_line(snapshot: Snapshot) -> Text:
    verdict = snapshot.verdict
    line = Text()
    line.append(f" {verdict.kind.upper()} ", style=fmt.VERDICT_STYLES.get(verdict.kind, fmt.VERDICT_STYLES["unknown"]))
    line.append(f" {verdict.summary}")
    return line


def render_table(snapshot: Snapshot) -> RichGroup:
    """Verdict, one row per rank, the stack groups, then warnings and notes."""
    job = snapshot.job
    world = fmt.NA if job.world_size is None else job.world_size
    head = Text(f"{job.launcher} pid {job.pid} on {job.host}  world size {world}  "
                f"window {snapshot.window_s:g}s", style="bold")
    table = Table(expand=False, pad_edge=False, box=None, header_style="bold")
    for column in ("rank", "pid", "state", "step", "phase", "op", "where", "cpu%", "rss", "gpu"):
        table.add_column(column, no_wrap=column != "where")
    culprits = set(snapshot.verdict.culprits)
    for rank in snapshot.ranks:
        style = "bold" if rank.rank in culprits else ""
        marker = "▶ " if rank.rank in culprits else "  "
        table.add_row(
            Text(marker + (str(rank.rank) if rank.rank is not None else fmt.NA), style=style),
            str(rank.pid or fmt.NA), state_text(rank), step_label(rank.step, rank.step_period_s) or fmt.NA,
            rank.phase, rank.op or "", rank.where or "",
            fmt.pct(rank.cpu_pct), fmt.size(rank.rss_bytes), gpu_text(rank),
        )
    parts: list = [head, verdict_line(snapshot), table, Text("stack groups", style="bold underline")]
    for group in snapshot.groups:
        label = f"rank {group.label}" if len(group.ranks) == 1 else f"ranks {group.label}"
        what = group.op or group.phase
        where = f" ← {group.where}" if group.where else ""
        parts.append(Text(f"  {'▶' if group.culprit else ' '} {label}: {what}{where}",
                          style="bold" if group.culprit else ""))
    for warning in snapshot.warnings:
        parts.append(Text(f"warning: {warning}", style="yellow"))
    for note in snapshot.notes:
        parts.append(Text(f"note: {note}", style="dim"))
    return RichGroup(*parts)
