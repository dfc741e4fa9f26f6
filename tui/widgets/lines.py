"""The one styled rendering of each recurring piece: a rank's state and phase, the verdict, a group.

Widgets and the plain ``trainwatch snapshot`` table both draw these from here, so a state, a
phase or a verdict reads and looks the same everywhere.
"""

from __future__ import annotations

from rich.text import Text

from ...probes import WAITING_PHASES, Group, Phase, Rank, Snapshot, State, VerdictKind, compact_ranks, group_what

from ...probes import how_ended

from . import format as fmt

# Styles use the 16 ANSI colours so they read the same in 256-colour terminals.
VERDICT_STYLES: dict[VerdictKind, str] = {
    "healthy": "bold black on green",
    "straggler": "bold black on yellow",
    "mismatch": "bold white on magenta",
    "hang": "bold white on red",
    "rendezvous": "bold black on cyan",
    "crashed": "bold white on red",
    "unknown": "bold white on bright_black",
}
STATE_STYLES: dict[State, str] = {
    "running": "green",
    "stuck": "bold red",
    "exited": "red",
    "missing": "bold magenta",
    "unknown": "dim",
}
WAITING_STYLE = "yellow"  # a phase in which the rank waits on something else (a peer, its GPU, data)
PHASE_STYLES: dict[Phase, str] = {
    "compute": "green",
    "checkpoint": "cyan",
    "exiting": "dim",
    "unknown": "dim",
}


def state_label(rank: Rank) -> str:
    """``running``, ``stuck ≥42s``, or how an exited rank ended: ``SIGSEGV``, ``exit 1``, ``exited``;
    ``raised`` for a rank whose uncaught exception left it alive (a non-daemon thread keeps it)."""
    if rank.exit is not None:
        return how_ended(rank.exit, alive=rank.state != "exited", short=True)
    if rank.state == "stuck" and rank.stuck_for_s is not None:  # a lower bound: what says so is in the detail
        return f"stuck ≥{fmt.duration(rank.stuck_for_s)}"
    return rank.state


def state_text(rank: Rank) -> Text:
    style = STATE_STYLES["exited"] if rank.exit is not None else STATE_STYLES.get(rank.state, "")
    return Text(state_label(rank), style=style)


def phase_style(phase: str) -> str:
    """Waiting phases (collective, gpu_wait, dataloader, lock, ...) share one colour."""
    if phase in PHASE_STYLES:
        return PHASE_STYLES[phase]
    return WAITING_STYLE if phase in WAITING_PHASES else ""


def phase_text(phase: str) -> Text:
    return Text(phase, style=phase_style(phase))


def verdict_line(snapshot: Snapshot | None, now: float | None = None) -> Text:
    """`` STRAGGLER  for 42s rank 3 is …``; ``now`` adds how long the verdict has held."""
    if snapshot is None:
        return Text(" … ", style=VERDICT_STYLES["unknown"])
    verdict = snapshot.verdict
    badge = Text(f" {verdict.kind.upper()} ", style=VERDICT_STYLES.get(verdict.kind, VERDICT_STYLES["unknown"]))
    held = f" for {fmt.duration(now - verdict.since)}" if now is not None and verdict.since else ""
    if held and snapshot.source.startswith("bundle"):
        held = " at dump:" + held  # a bundle's times are its dump's, not the reader's
    summary = verdict.summary
    if not summary and verdict.culprits:
        summary = f"culprit {fmt.rank_noun(len(verdict.culprits))} {compact_ranks(verdict.culprits)}"
    return Text.assemble(badge, (held, "bold"), " ", summary or fmt.NA)


def group_line(group: Group, culprit: bool, width: int | None = None) -> Text:
    """``ranks 0-6: all_reduce ← train.py:88 step``; a culprit group starts with ▶ and is red.
    Wider than ``width``, the ``← where`` goes on a line of its own rather than wrap mid-frame."""
    head = f"{'▶' if culprit else ' '} {fmt.rank_noun(len(group.ranks))} {group.label}: "
    line = Text(head, style="bold red" if culprit else "bold")
    line.append(group_what(group), style="bold red" if culprit else phase_style(group.phase))
    if group.where:
        arrow = " ← "
        if width is not None and line.cell_len + len(arrow) + len(group.where) > width:
            arrow = "\n    ← "
        line.append(arrow, style="dim")
        line.append(group.where, style="red" if culprit else "")
    return line
