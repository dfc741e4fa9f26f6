"""STAT-style stack groups: which ranks sit in the same place, culprits marked.

With focus, ``j``/``k`` (or the arrows) move a cursor over the groups; each move posts
:class:`GroupsPane.Picked` so the app can select the group's first rank.
"""

from __future__ import annotations

from rich.text import Text
from textual.binding import Binding
from textual.containers import VerticalScroll
from textual.geometry import Region
from textual.message import Message
from textual.widgets import Static

from ...probes import Group, Snapshot

from . import format as fmt
from .lines import group_line

CURSOR_STYLE = "reverse"


def groups_text(snapshot: Snapshot | None, cursor: int | None = None, width: int | None = None) -> Text:
    """The groups (the one at ``cursor`` highlighted), the collectives' divergence and NCCL RAS's
    finding, then notes; ``width``: the cells a line has (a group's frame is never wrapped in the middle)."""
    if snapshot is None:
        return Text("no sample yet", style="dim")
    culprits = set(snapshot.verdict.culprits)
    lines = []
    for index, group in enumerate(snapshot.groups):
        line = group_line(group, group.culprit or bool(culprits & set(group.ranks)), width)
        if index == cursor:
            line.stylize(CURSOR_STYLE)
        lines.append(line)
    if not lines:
        lines.append(Text("no stacks in this sample", style="dim"))
    collectives = snapshot.collectives
    if collectives is not None and collectives.divergence:
        lines.append(Text.assemble(("collectives: ", "bold magenta"), collectives.divergence))
    if collectives is not None and collectives.ras is not None and collectives.ras.finding:
        lines.append(Text.assemble(("NCCL RAS: ", "bold magenta"), collectives.ras.finding))
    for note in snapshot.notes:
        lines.append(Text(f"note: {note}", style="dim"))
    return Text("\n").join(lines)


class GroupsPane(VerticalScroll):
    """Scrollable list of stack groups and the snapshot's notes; a cursor while focused."""

    BINDINGS = [
        Binding("j,down", "move(1)", "next group", show=False),
        Binding("k,up", "move(-1)", "previous group", show=False),
    ]

    class Picked(Message):
        """The user moved the cursor onto ``group``."""

        def __init__(self, group: Group) -> None:
            super().__init__()
            self.group = group

    def __init__(self, **kwargs: object) -> None:
        super().__init__(**kwargs)
        self.snapshot: Snapshot | None = None
        self.cursor = 0

    def compose(self):
        yield Static(id="groups-body")

    def show(self, snapshot: Snapshot | None) -> None:
        self.snapshot = snapshot
        count = len(snapshot.groups) if snapshot else 0
        self.cursor = min(self.cursor, max(0, count - 1))
        self._draw()

    def follow(self, rank: int) -> None:
        """Put the cursor on the group of the rank selected elsewhere (not while the user moves it)."""
        groups = self.snapshot.groups if self.snapshot else ()
        index = next((i for i, g in enumerate(groups) if rank in g.ranks), None)
        if index is not None and not self.has_focus:
            self.cursor = index

    def _draw(self) -> None:
        cursor = self.cursor if self.has_focus and self.snapshot and self.snapshot.groups else None
        width = self.scrollable_content_region.width or None
        fmt.update_if_changed(self.query_one("#groups-body", Static), groups_text(self.snapshot, cursor, width))

    def on_resize(self) -> None:
        self._draw()

    def watch_has_focus(self, focused: bool) -> None:
        if self.is_mounted:
            self._draw()

    def action_move(self, delta: int) -> None:
        groups = self.snapshot.groups if self.snapshot else ()
        if not groups:
            return
        self.cursor = max(0, min(len(groups) - 1, self.cursor + delta))
        self._draw()
        self.scroll_to_region(Region(0, self.cursor, 1, 1), animate=False)
        self.post_message(self.Picked(groups[self.cursor]))
