"""Small formatters shared by the widgets: every unreadable value prints as ``n/a``."""

from __future__ import annotations

from collections.abc import Sequence

NA = "n/a"
SPARK = "▁▂▃▄▅▆▇█"

# Styles use the 16 ANSI colours so they read the same in 256-colour terminals.
VERDICT_STYLES = {
    "healthy": "bold black on green",
    "straggler": "bold black on yellow",
    "mismatch": "bold white on magenta",
    "hang": "bold white on red",
    "rendezvous": "bold black on cyan",
    "crashed": "bold white on red",
    "unknown": "bold white on bright_black",
}
STATE_STYLES = {
    "running": "green",
    "stuck": "bold red",
    "exited": "red",
    "missing": "bold magenta",
    "unknown": "dim",
}


def duration(seconds: float | None) -> str:
    """``75`` -> ``1m15s``; compact enough for a table cell."""
    if seconds is None:
        return NA
    seconds = max(0, int(seconds))
    if seconds < 60:
        return f"{seconds}s"
    minutes, secs = divmod(seconds, 60)
    if minutes < 60:
        return f"{minutes}m{secs:02d}s"
    hours, minutes = divmod(minutes, 60)
    if hours < 48:
        return f"{hours}h{minutes:02d}m"
    days, hours = divmod(hours, 24)
    return f"{days}d{hours:02d}h"


def size(num: int | None) -> str:
    """Bytes in binary units with one decimal at most: ``1.5G``."""
    if num is None:
        return NA
    value = float(num)
    for unit in ("B", "K", "M", "G", "T"):
        if value < 1024 or unit == "T":
            return f"{value:.0f}{unit}" if unit in ("B", "K") or value >= 100 else f"{value:.1f}{unit}"
        value /= 1024
    return NA  # unreachable


def pct(value: float | None) -> str:
    return NA if value is None else f"{value:.0f}%"


def sparkline(values: Sequence[float | None], top: float = 100.0) -> str:
    """One block character per sample, scaled to ``top``; unknown samples are blank."""
    out = []
    for value in values:
        if value is None:
            out.append(" ")
            continue
        level = min(max(value / top, 0.0), 1.0)
        out.append(SPARK[round(level * (len(SPARK) - 1))])
    return "".join(out)


def state_label(rank) -> str:
    """``running``, ``stuck``, or how an exited rank ended: ``SIGSEGV``, ``exit 1``, ``exited``."""
    if rank.exit is not None and rank.state != "exited":
        return "raised"  # an uncaught exception; a non-daemon thread keeps the process alive
    if rank.exit is not None:
        return rank.exit.signal or (f"exit {rank.exit.code}" if rank.exit.code is not None else "exited")
    return rank.state


def rank_noun(count: int) -> str:
    return "rank" if count == 1 else "ranks"


def shorten(text: str | None, width: int) -> str:
    """Cut long text at ``width`` with an ellipsis, keeping the start."""
    if text is None:
        return NA
    return text if len(text) <= width else text[: width - 1] + "…"


def update_if_changed(widget, content, key: object = None, layout: bool = True) -> None:
    """``Static.update`` re-lays out the screen; skip it when nothing visible changed.
    ``key`` identifies the content when the renderable itself cannot be compared."""
    key = content if key is None else key
    if getattr(widget, "_shown_key", None) == key:
        return
    widget._shown_key = key
    widget.update(content, layout=layout)
