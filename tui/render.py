"""Plain rich rendering of a snapshot, for `trainwatch snapshot` and `demo --no-tui`."""

from __future__ import annotations

from rich.console import Group as RichGroup
from rich.table import Table
from rich.text import Text

from ..probes import Rank, Snapshot, step_label
from .widgets import format as fmt
from .widgets.lines import group_line, phase_text, state_text, verdict_line


def gpu_text(rank: Rank) -> str:
    if rank.gpu is None:
        return fmt.NA
    return f"{fmt.pct(rank.gpu.util_pct)} {fmt.size(rank.gpu.mem_used_bytes)}"


def render_table(snapshot: Snapshot) -> RichGroup:
    """Verdict, one row per rank, the stack groups, then warnings and notes."""
    job = snapshot.job
    world = fmt.NA if job.world_size is None else job.world_size
    head = Text(f"{job.launcher} pid {job.pid} on {job.host}  world size {world}  "
                f"window {snapshot.window_s:g}s", style="bold")
    table = Table(expand=False, pad_edge=False, box=None, header_style="bold")
    with_step = any(r.step is not None for r in snapshot.ranks)
    columns = ("rank", "pid", "state", "phase", "op", "where", *(("step",) if with_step else ()),
               "cpu%", "rss", "gpu")
    for column in columns:
        table.add_column(column, no_wrap=column != "where")
    culprits = set(snapshot.verdict.culprits)
    for rank in snapshot.ranks:
        style = "bold" if rank.rank in culprits else ""
        marker = "▶ " if rank.rank in culprits else "  "
        step = (step_label(rank.step, rank.step_period_s) or "",) if with_step else ()
        table.add_row(
            Text(marker + (str(rank.rank) if rank.rank is not None else fmt.NA), style=style),
            str(rank.pid or fmt.NA), state_text(rank), phase_text(rank.phase), rank.op or "", rank.where or "",
            *step, fmt.pct(rank.cpu_pct), fmt.size(rank.rss_bytes), gpu_text(rank),
        )
    parts: list = [head, verdict_line(snapshot), table, Text("stack groups", style="bold underline")]
    for group in snapshot.groups:
        parts.append(Text("  ") + group_line(group, group.culprit or bool(culprits & set(group.ranks))))
    for warning in snapshot.warnings:
        parts.append(Text(f"warning: {warning}", style="yellow"))
    for note in snapshot.notes:
        parts.append(Text(f"note: {note}", style="dim"))
    return RichGroup(*parts)
