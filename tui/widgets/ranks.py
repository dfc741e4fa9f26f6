"""The ranks table: one row per rank, keyed by ``Rank.key`` and updated cell by cell."""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

from rich.text import Text
from textual.widgets import DataTable

from trainwatch.probes.snapshot import Rank

from . import format as fmt
from .history import History

SPARK_LEN = 6

# (column key, heading); the order puts what answers "who is stuck where" first.
COLUMNS = (
    ("rank", "rank"),
    ("state", "state"),
    ("phase", "phase"),
    ("op", "op"),
    ("where", "where"),
    ("stuck", "stuck"),
    ("cpu", "CPU%"),
    ("rss", "RSS"),
    ("gpu", "GPU%"),
    ("gmem", "GPU mem"),
    ("pid", "pid"),
)


@dataclass(frozen=True)
class RankCell:
    """The rank column's cell: draws the number (and culprit mark) and knows the row order."""

    text: Text
    order: tuple

    def __rich__(self) -> Text:
        return self.text


def rank_cell(rank: Rank, culprit: bool) -> RankCell:
    label = str(rank.rank) if rank.rank is not None else f"pid{rank.pid}"
    text = Text(("▶" if culprit else " ") + label, style="bold red" if culprit else "")
    order = (rank.host, rank.rank if rank.rank is not None else math.inf, rank.pid or 0)
    return RankCell(text, order)


def state_cell(rank: Rank) -> Text:
    style = fmt.STATE_STYLES["exited"] if rank.exit is not None else fmt.STATE_STYLES.get(rank.state, "")
    return Text(fmt.state_label(rank), style=style)


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


def row_cells(rank: Rank, culprit: bool, history: History) -> dict[str, object]:
    cpu = Text(f"{fmt.pct(rank.cpu_pct):>4} ")
    cpu.append(fmt.sparkline(history.cpu(rank.key)[-SPARK_LEN:]), style="green")
    gpu, gmem = gpu_cells(rank, history)
    stuck_style = "bold red" if rank.state == "stuck" else ""
    return {
        "rank": rank_cell(rank, culprit),
        "state": state_cell(rank),
        "phase": Text(rank.phase),
        "op": Text(rank.op or "-"),
        "where": Text(fmt.shorten(rank.where, 34) if rank.where else "-"),
        "stuck": Text(fmt.duration(rank.stuck_for_s) if rank.stuck_for_s else "-", style=stuck_style),
        "cpu": cpu,
        "rss": Text(fmt.size(rank.rss_bytes)),
        "gpu": gpu,
        "gmem": gmem,
        "pid": Text(str(rank.pid) if rank.pid is not None else fmt.NA),
    }


class RanksTable(DataTable):
    """Rows are added once per rank key and then only their changed cells are updated."""

    def __init__(self, **kwargs: object) -> None:
        super().__init__(cursor_type="row", zebra_stripes=False, **kwargs)
        self._cells: dict[str, dict[str, object]] = {}

    def on_mount(self) -> None:
        for key, label in COLUMNS:
            self.add_column(label, key=key)

    @property
    def selected_key(self) -> str | None:
        if not self.row_count:
            return None
        return self.coordinate_to_cell_key(self.cursor_coordinate).row_key.value

    def show(self, ranks: Iterable[Rank], culprits: frozenset[int], history: History) -> None:
        """Bring the rows in line with ``ranks``: update changed cells, add and drop rows."""
        ranks = list(ranks)
        selected = self.selected_key
        wanted = {r.key for r in ranks}
        for key in [k for k in self._cells if k not in wanted]:
            self.remove_row(key)
            del self._cells[key]
        added = False
        for rank in ranks:
            cells = row_cells(rank, rank.rank in culprits, history)
            old = self._cells.get(rank.key)
            if old is None:
                self.add_row(*cells.values(), key=rank.key)
                added = True
            else:
                for column, value in cells.items():
                    if old[column] != value:
                        self.update_cell(rank.key, column, value, update_width=True)
            self._cells[rank.key] = cells
        if added:
            self.sort("rank", key=lambda cell: cell.order)
        if selected in self._cells:
            self.move_cursor(row=self.get_row_index(selected), scroll=False)
