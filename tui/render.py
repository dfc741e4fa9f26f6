"""Plain rich rendering of a snapshot, for `trainwatch snapshot` and `demo --no-tui`."""

from __future__ import annotations

from rich.console import Group as RichGroup
from rich.table import Table
from rich.text import Text

from ..probes import Rank, Snapshot, age_text, step_label, who
from .widgets import format as fmt
from .widgets.lines import group_line, phase_text, state_text, verdict_line


def gpu_text(rank: Rank) -> str:
    if rank.gpu is None:
        return fmt.NA
    return f"{fmt.pct(rank.gpu.util_pct)} {fmt.size(rank.gpu.mem_used_bytes)}"


def stuck_lines(snapshot: Snapshot) -> list[Text]:
    """How long the stuck ranks have made no progress, and what says so, one line per distinct
    claim: ``ranks 0-1 stuck ≥ 9 min: last output 9 min ago; all_reduce #11 pending 9 min``."""
    claims: dict[tuple[str, str], list[int]] = {}
    for rank in snapshot.ranks:
        if rank.state == "stuck" and rank.stuck_for_s is not None and rank.stuck_source and rank.rank is not None:
            claims.setdefault((age_text(rank.stuck_for_s), rank.stuck_source), []).append(rank.rank)
    return [Text(f"{who(ranks)} stuck ≥ {length}: {source}", style="dim")
            for (length, source), ranks in claims.items()]


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
    parts += stuck_lines(snapshot)
    for warning in snapshot.warnings:
        parts.append(Text(f"warning: {warning}", style="yellow"))
    for note in snapshot.notes:
        parts.append(Text(f"note: {note}", style="dim"))
    return RichGroup(*parts)
