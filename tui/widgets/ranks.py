"""The ranks table: one row per rank, keyed by ``Rank.key`` and updated cell by cell.

Columns are chosen to fit the width: rank, state, phase, op and ``where`` always; the state and
the op as wide as their longest cells need (``all_reduce (DDP gradients)``) while ``where`` keeps room for a frame;
CPU%, step, GPU (where some rank has a GPU reading), RSS and pid only after that, while ``where`` keeps room, so no cell is ever cut
at the screen's edge (what does not fit is in the detail pane). The rank column is pinned when the table is wider
than the screen anyway.

The table remembers the row the user chose (arrows, ``j``/``k``, a click, a group): that row stays
selected across polls and filters. Until the user chooses, the verdict's culprit is selected.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

from rich.text import Text
from textual import events
from textual.widgets import DataTable
from textual.widgets.data_table import ColumnKey

from ...probes import Rank

from . import format as fmt
from .history import History
from .lines import phase_style, phase_text, state_text

SPARK_LEN = 6
STEP_SPARK_LEN = 4  # the step's recent periods, scaled to the slowest shown
PADDING = 2  # DataTable's cell padding, both sides together
WHERE_MIN = 30  # optional columns are shown only while `where` keeps this many cells
WHERE_MAX = 60
WHERE_FLOOR = 24  # the op widens only while `where` keeps this many (`train.py:68 compute_step`)
OP_MIN, OP_MAX = 14, 32
SCROLLBAR = 1  # the vertical scrollbar's width (see trainwatch.tcss)


@dataclass(frozen=True)
class ColumnSpec:
    key: str
    heading: str
    width: int  # cells of content, without padding


STATE_MIN = 11  # `stuck ≥42s`, `running`, `SIGSEGV`; wider when a cell needs it
CORE = (ColumnSpec("state", "state", STATE_MIN), ColumnSpec("phase", "phase", 10))
GPU_COLUMNS = frozenset({"gpu", "gmem"})
COLUMNS_ALWAYS = ("rank", "state", "phase", "op", "where")
OPTIONAL = (  # in the order they are given room, and shown
    ColumnSpec("cpu", "CPU%", 5 + SPARK_LEN),
    ColumnSpec("step", "step", 7 + STEP_SPARK_LEN),
    ColumnSpec("gpu", "GPU%", 5 + SPARK_LEN),
    ColumnSpec("gmem", "GPU mem", 11),
    ColumnSpec("rss", "RSS", 6),
    ColumnSpec("pid", "pid", 7),
)


def plan_columns(width: int, rank_width: int, with_step: bool, op_width: int = OP_MIN,
                 state_width: int = STATE_MIN, with_gpu: bool = True) -> tuple[ColumnSpec, ...]:
    """The columns that fit in ``width`` cells: the state as wide as its longest cell (a stuck time
    is never cut: ``stuck ≥12m34s``), the op what its cells need (``where`` keeping
    ``WHERE_FLOOR``), then the optional columns, and ``where`` takes what is left. Where the op
    would be cut, the phase column folds into it: ``what`` shows the op (or the phase when there is
    none) in the phase's colour, so ``all_reduce (DDP gradients)`` stays whole at 80 columns.
    ``with_gpu``: some rank has a GPU reading (else the GPU columns would only say n/a)."""
    core = (ColumnSpec("state", "state", max(STATE_MIN, state_width)), CORE[1])
    plan = _plan(width, rank_width, with_step, op_width, core, "op", with_gpu)
    if _width(plan, "op") < op_width:
        folded = _plan(width, rank_width, with_step, op_width, core[:1], "what", with_gpu)
        if _width(folded, "what") > _width(plan, "op"):
            return folded
    return plan


def _plan(width: int, rank_width: int, with_step: bool, op_width: int, core_columns: tuple[ColumnSpec, ...],
          op_key: str, with_gpu: bool = True) -> tuple[ColumnSpec, ...]:
    core = (ColumnSpec("rank", "rank", rank_width), *core_columns)
    room = width - SCROLLBAR - sum(c.width + PADDING for c in core) - PADDING
    op = ColumnSpec(op_key, "op", max(OP_MIN, min(op_width, OP_MAX, room - PADDING - WHERE_FLOOR)))
    fixed = (*core, op)
    room -= op.width + PADDING
    extra = []
    for column in OPTIONAL:
        if (column.key == "step" and not with_step) or (column.key in GPU_COLUMNS and not with_gpu):
            continue
        if room - (column.width + PADDING) >= WHERE_MIN:
            extra.append(column)
            room -= column.width + PADDING
    where = ColumnSpec("where", "where", max(12, min(room, WHERE_MAX)))
    return (*fixed, where, *extra)


def _width(plan: tuple[ColumnSpec, ...], key: str) -> int:
    return next(c.width for c in plan if c.key == key)


@dataclass(frozen=True)
class RankCell:
    """The rank column's cell: draws the number (and culprit mark) and knows the row order."""

    text: Text
    order: tuple

    def __rich__(self) -> Text:
        return self.text


def rank_label(rank: Rank, culprit: bool) -> str:
    return ("▶" if culprit else " ") + (str(rank.rank) if rank.rank is not None else f"pid{rank.pid}")


def rank_cell(rank: Rank, culprit: bool) -> RankCell:
    text = Text(rank_label(rank, culprit), style="bold red" if culprit else "")
    order = (rank.host, rank.rank if rank.rank is not None else math.inf, rank.pid or 0)
    return RankCell(text, order)


def gpu_cells(rank: Rank, history: History) -> tuple[Text, Text]:
    gpu = rank.gpu
    if gpu is None:
        return Text(fmt.NA, style="dim"), Text(fmt.NA, style="dim")
    util = Text(f"{fmt.pct(gpu.util_pct):>4} ")
    util.append(fmt.sparkline(history.gpu(rank.key)[-SPARK_LEN:]), style="cyan")
    mem = fmt.size(gpu.mem_used_bytes)
    if gpu.mem_total_bytes:
        mem += "/" + fmt.size(gpu.mem_total_bytes)
    return util, Text(mem)


def step_cell(rank: Rank, history: History) -> Text:
    """``1205 ▄▄▄█``: the step and a sparkline of its recent periods (a taller bar is a slower step)."""
    cell = Text(f"{rank.step:>6} " if rank.step is not None else " " * 7)
    periods = history.step_period(rank.key)[-STEP_SPARK_LEN:]
    known = sorted(p for p in periods if p is not None)
    if known:  # twice the median is the top: usual steps sit mid-height, a slow one stands out
        top = max(known[-1], 2 * known[len(known) // 2])
        cell.append(fmt.sparkline(periods, top=top), style="magenta")
    return cell


def row_cells(rank: Rank, culprit: bool, history: History) -> dict[str, object]:
    """Every cell of a rank's row (the table shows those its columns ask for)."""
    cpu = Text(f"{fmt.pct(rank.cpu_pct):>4} ")
    cpu.append(fmt.sparkline(history.cpu(rank.key)[-SPARK_LEN:]), style="green")
    gpu, gmem = gpu_cells(rank, history)
    return {
        "rank": rank_cell(rank, culprit),
        "state": state_text(rank),
        "phase": phase_text(rank.phase),
        "op": Text(rank.op or ""),
        "what": Text(rank.op, style=phase_style(rank.phase)) if rank.op else phase_text(rank.phase),
        "where": Text(rank.where) if rank.where else Text(rank.scheduler or "", style="italic"),
        "cpu": cpu,
        "step": step_cell(rank, history),
        "gpu": gpu,
        "gmem": gmem,
        "rss": Text(fmt.size(rank.rss_bytes)),
        "pid": Text(fmt.pid_text(rank.pid)),  # its PID in a container: in the detail pane (7 cells here)
    }


def fit(cell: object, width: int) -> object:
    """A cell cut to its column with an ellipsis, never mid-word at the column's edge."""
    if isinstance(cell, Text) and cell.cell_len > width:
        cell = cell.copy()
        cell.truncate(width, overflow="ellipsis")
    return cell


class RanksTable(DataTable):
    """Rows are added once per rank key and then only their changed cells are updated."""

    def __init__(self, **kwargs: object) -> None:
        super().__init__(cursor_type="row", zebra_stripes=False, fixed_columns=1, **kwargs)
        self._cells: dict[str, dict[str, object]] = {}  # what each row shows now
        self._rows: dict[str, dict[str, object]] = {}  # every cell of each row, shown or not
        self._plan: tuple[ColumnSpec, ...] = ()
        self._with_step = False
        self._with_gpu = False
        self.chosen: str | None = None  # the row the user picked; None until they do

    @property
    def selected_key(self) -> str | None:
        if not self.row_count:
            return None
        return self.coordinate_to_cell_key(self.cursor_coordinate).row_key.value

    # ----- what the user picks

    def choose(self, key: str) -> None:
        """Select ``key`` as the user's own choice (it then survives polls and filters)."""
        self.chosen = key
        if key in self._cells:
            self.move_cursor(row=self.get_row_index(key))

    def _user_moved(self) -> None:
        self.chosen = self.selected_key

    def action_cursor_up(self) -> None:
        super().action_cursor_up()
        self._user_moved()

    def action_cursor_down(self) -> None:
        super().action_cursor_down()
        self._user_moved()

    def action_page_up(self) -> None:
        super().action_page_up()
        self._user_moved()

    def action_page_down(self) -> None:
        super().action_page_down()
        self._user_moved()

    def action_scroll_top(self) -> None:
        super().action_scroll_top()
        self._user_moved()

    def action_scroll_bottom(self) -> None:
        super().action_scroll_bottom()
        self._user_moved()

    async def _on_click(self, event: events.Click) -> None:
        await super()._on_click(event)
        self._user_moved()

    # ----- drawing

    def show(self, ranks: Iterable[Rank], culprits: frozenset[int], history: History,
             default: str | None = None) -> None:
        """Bring the rows in line with ``ranks``: update changed cells, add and drop rows.

        The cursor goes to the user's chosen row when it is shown, else to ``default`` (the
        culprit) until the user has chosen, else it stays where it is.
        """
        ranks = list(ranks)
        self._rows = {r.key: row_cells(r, r.rank in culprits, history) for r in ranks}
        self._with_step = any(r.step is not None for r in ranks)
        self._with_gpu = any(r.gpu is not None for r in ranks)
        for key in [k for k in self._cells if k not in self._rows]:
            self.remove_row(key)
            del self._cells[key]
        self._relayout()
        self._fill()
        target = self.chosen if self.chosen in self._cells else None
        if target is None and self.chosen is None and default in self._cells:
            target = default
        if target is not None and target != self.selected_key:
            self.move_cursor(row=self.get_row_index(target))

    def on_resize(self, event: events.Resize) -> None:
        if self._relayout():
            self._fill()

    def _relayout(self) -> bool:
        """Choose the columns for the current width; True when they changed."""
        width = self.size.width
        if not width:
            width = self.app.size.width
        rank_width = max([4, *(c["rank"].text.cell_len for c in self._rows.values())])
        op_width = max([0, *(c["op"].cell_len for c in self._rows.values())])
        state_width = max([0, *(c["state"].cell_len for c in self._rows.values())])
        plan = plan_columns(width, rank_width, self._with_step, op_width, state_width, self._with_gpu)
        if plan == self._plan:
            return False
        shown = [c.key.value for c in self.ordered_columns]
        same = 0
        while same < min(len(shown), len(plan)) and shown[same] == plan[same].key:
            same += 1
        for key in shown[same:]:
            self.remove_column(key)
        for spec in plan[:same]:
            self.columns[ColumnKey(spec.key)].width = spec.width
        for spec in plan[same:]:
            self.add_column(spec.heading, key=spec.key, width=spec.width, default=Text(""))
        self._plan = plan
        for cells in self._cells.values():  # every cell is drawn again at its new width
            cells.clear()
        self.refresh(layout=True)
        return True

    def _fill(self) -> None:
        """Add new rows and update the cells that changed, cut to their column's width."""
        added = False
        for key, row in self._rows.items():
            cells = {spec.key: fit(row[spec.key], spec.width) for spec in self._plan}
            old = self._cells.get(key)
            if old is None:
                self.add_row(*cells.values(), key=key)
                added = True
            else:
                for column, value in cells.items():
                    if old.get(column) != value:
                        self.update_cell(key, column, value)
            self._cells[key] = cells
        if added:
            self.sort("rank", key=lambda cell: cell.order)
