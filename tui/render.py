"""Plain rich rendering of a snapshot, for `trainwatch snapshot` and `demo --no-tui`.

The ranks table fits the width it is printed at (an 80-column terminal, a pipe): rank, state (with
the stuck time), phase, op and ``where`` stay; pid, RSS, GPU, CPU% and step go first, in that order;
then phase and op share one column. ``where`` is never cut: it wraps. ``wide`` shows every column
whatever the width (``snapshot --wide`` prints on a console of ``wide_width`` cells).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from rich.console import Console, ConsoleOptions, RenderResult
from rich.console import Group as RichGroup
from rich.table import Table
from rich.text import Text

from ..probes import Group, Rank, Snapshot, age_text, group_what, job_title, step_label, who
from .widgets import format as fmt
from .widgets.lines import group_line, phase_style, phase_text, state_text, verdict_line

GAP = 2  # cells between two columns (rich's padding of 1 on each side, none at the edges)
# The columns that may go, first to last, when the table is wider than its room.
DROP_ORDER = ("pid", "rss", "gpu", "cpu%", "step")


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


def what_text(rank: Rank) -> Text:
    """Phase and op in one cell, as the stack groups say it: ``all_reduce``, ``acquire (lock)``."""
    return Text(group_what(rank), style=phase_style(rank.phase))  # a rank has a group's phase and op


@dataclass(frozen=True)
class Column:
    heading: str
    cell: Callable[[Rank], Text | str]
    wraps: bool = False


def _columns(snapshot: Snapshot) -> dict[str, Column]:
    culprits = set(snapshot.verdict.culprits)

    def rank_cell(rank: Rank) -> Text:
        marker = "▶ " if rank.rank in culprits else "  "
        return Text(marker + (str(rank.rank) if rank.rank is not None else fmt.NA),
                    style="bold" if rank.rank in culprits else "")

    columns = {
        "rank": Column("rank", rank_cell),
        "pid": Column("pid", lambda r: fmt.pid_text(r.pid, r.container_pid)),
        "state": Column("state", state_text),
        "phase": Column("phase", lambda r: phase_text(r.phase)),
        "op": Column("op", lambda r: r.op or ""),
        # a rank its pod never ran (or that died with it): what Kubernetes says, where its place would be
        "where": Column("where", lambda r: r.where or r.scheduler or "", wraps=True),
        "step": Column("step", lambda r: step_label(r.step, r.step_period_s) or ""),
        "cpu%": Column("cpu%", lambda r: fmt.pct(r.cpu_pct)),
        "rss": Column("rss", lambda r: fmt.size(r.rss_bytes)),
        "gpu": Column("gpu", gpu_text),
    }
    if not any(r.step is not None for r in snapshot.ranks):
        del columns["step"]
    return columns


def _cell_width(cell: Text | str) -> int:
    return cell.cell_len if isinstance(cell, Text) else Text(cell).cell_len


class RanksTable:
    """The ranks table, its columns chosen for the width it is rendered at."""

    def __init__(self, snapshot: Snapshot, wide: bool = False) -> None:
        self.snapshot, self.wide = snapshot, wide

    def plan(self, width: int) -> list[str]:
        """The column keys shown at ``width`` cells."""
        columns = _columns(self.snapshot)
        keys = list(columns)
        if self.wide:
            return keys
        natural = {key: self._natural(columns[key]) for key in keys}
        need = lambda shown: sum(natural[k] for k in shown) + GAP * (len(shown) - 1)  # noqa: E731
        for key in DROP_ORDER:
            if need(keys) <= width:
                return keys
            if key in keys:
                keys.remove(key)
        if need(keys) > width:  # phase and op share one column: `acquire (lock)`
            natural["what"] = self._natural(Column("op", what_text))
            keys = [("what" if k == "phase" else k) for k in keys if k != "op"]
        return keys

    def _natural(self, column: Column) -> int:
        return max([len(column.heading), *(_cell_width(column.cell(r)) for r in self.snapshot.ranks)])

    def table(self, width: int) -> Table:
        columns = {**_columns(self.snapshot), "what": Column("phase/op", what_text)}
        keys = self.plan(width)
        table = Table(expand=False, pad_edge=False, box=None, header_style="bold")
        for key in keys:
            column = columns[key]
            if column.wraps:
                table.add_column(column.heading, overflow="fold", ratio=1 if not self.wide else None)
            else:
                table.add_column(column.heading, no_wrap=True, min_width=self._natural(column))
        for rank in self.snapshot.ranks:
            table.add_row(*(columns[key].cell(rank) for key in keys))
        return table

    def full_width(self) -> int:
        """Cells every column needs, each at its widest cell (what ``--wide`` prints at)."""
        columns = _columns(self.snapshot)
        return sum(self._natural(c) for c in columns.values()) + GAP * (len(columns) - 1)

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        yield from console.render(self.table(options.max_width), options)


class GroupLine:
    """A stack group's line at the width it is printed at: a ``where`` that does not fit goes on a
    line of its own rather than wrap inside the frame's name."""

    def __init__(self, group: Group, culprit: bool) -> None:
        self.group, self.culprit = group, culprit

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        yield Text("  ") + group_line(self.group, self.culprit, width=options.max_width - 2)


def wide_width(snapshot: Snapshot) -> int:
    """The console width ``--wide`` needs for every column of the table, uncut."""
    return RanksTable(snapshot, wide=True).full_width()


def waiting_lines(snapshot: Snapshot) -> list[Text]:
    """``  ▶ rank 2: its child process PID 812 `sleep 3600` (running 41 s)``: what each rank waits
    for, where it is named, ranks that wait for the same thing on one line."""
    culprits = set(snapshot.verdict.culprits)
    same: dict[str, list[int]] = {}
    for rank in snapshot.ranks:
        if rank.waits_for and rank.rank is not None:
            same.setdefault(rank.waits_for, []).append(rank.rank)
    lines = []
    for what, numbers in same.items():
        culprit = bool(culprits & set(numbers))
        line = Text(("  ▶ " if culprit else "    ") + f"{who(numbers)}: ", style="bold" if culprit else "")
        line.append(what)
        lines.append(line)
    return lines


def render_table(snapshot: Snapshot, wide: bool = False) -> RichGroup:
    """Verdict, one row per rank, the stack groups, then warnings and notes. ``wide``: every
    column, whatever the width."""
    job = snapshot.job
    world = fmt.NA if job.world_size is None else job.world_size
    head = Text(f"{job_title(job)}  world size {world}  "
                f"window {snapshot.window_s:g}s", style="bold")
    culprits = set(snapshot.verdict.culprits)
    parts: list = [head, verdict_line(snapshot), RanksTable(snapshot, wide=wide)]
    if not snapshot.ranks:
        parts.append(Text("no ranks in this snapshot", style="dim"))
    waited = waiting_lines(snapshot)
    if waited:
        parts.append(Text("waiting for", style="bold underline"))
        parts += waited
    parts.append(Text("stack groups", style="bold underline"))
    for group in snapshot.groups:
        parts.append(GroupLine(group, group.culprit or bool(culprits & set(group.ranks))))
    parts += stuck_lines(snapshot)
    for warning in snapshot.warnings:
        parts.append(Text(f"warning: {warning}", style="yellow"))
    for note in snapshot.notes:
        parts.append(Text(f"note: {note}", style="dim"))
    return RichGroup(*parts)
