"""STAT-style stack groups: which ranks sit in the same place, culprits marked."""

from __future__ import annotations

from rich.text import Text
from textual.containers import VerticalScroll
from textual.widgets import Static

from trainwatch.probes.snapshot import Group, Snapshot

from . import format as fmt


def group_line(group: Group, culprit: bool) -> Text:
    """``ranks 0-6: all_reduce ← train.py:88 step``; a culprit group starts with ▶."""
    what = group.op or group.phase
    head = f"{'▶' if culprit else ' '} {fmt.rank_noun(len(group.ranks))} {group.label}: "
    line = Text(head, style="bold red" if culprit else "bold")
    line.append(what, style="bold red" if culprit else "")
    if group.op and group.phase not in ("collective", "unknown", group.op):
        line.append(f" ({group.phase})", style="dim")
    if group.where:
        line.append(" ← ", style="dim")
        line.append(group.where, style="red" if culprit else "")
    return line


def groups_text(snapshot: Snapshot | None) -> Text:
    if snapshot is None:
        return Text("no sample yet", style="dim")
    culprits = set(snapshot.verdict.culprits)
    lines = [group_line(g, g.culprit or bool(culprits & set(g.ranks))) for g in snapshot.groups]
    if not lines:
        lines.append(Text("no stacks in this sample", style="dim"))
    collectives = snapshot.collectives
    if collectives is not None and collectives.divergence:
        lines.append(Text.assemble(("collectives: ", "bold magenta"), collectives.divergence))
    for note in snapshot.notes:
        lines.append(Text(f"note: {note}", style="dim"))
    return Text("\n").join(lines)


class GroupsPane(VerticalScroll):
    """Scrollable list of stack groups and the snapshot's notes."""

    def compose(self):
        yield Static(id="groups-body")

    def show(self, snapshot: Snapshot | None) -> None:
        fmt.update_if_changed(self.query_one("#groups-body", Static), groups_text(snapshot))
