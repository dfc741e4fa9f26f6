"""Small plain-text formatters shared by the widgets: every unreadable value prints as ``n/a``."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from ...probes import NA, duration, pct, size  # noqa: F401  (shared with summary.md)

SPARK = "▁▂▃▄▅▆▇█"


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


def pid_text(pid: int | None, container_pid: int | None = None) -> str:
    """``3155``, or ``3155 (4)`` for a rank in a container: its PID here, then the one it has there."""
    if pid is None:
        return NA
    return f"{pid} ({container_pid})" if container_pid is not None else str(pid)


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


def display_path(path: Path) -> str:
    """``./name`` inside the current directory, ``~/…`` under home, else the absolute path."""
    path = Path(path).absolute()
    if path == Path.cwd():
        return "the current directory"
    try:
        return "./" + str(path.relative_to(Path.cwd()))
    except ValueError:
        pass  # not under the current directory: shown in full
    home = Path.home()
    try:
        return "~/" + str(path.relative_to(home))
    except ValueError:
        return str(path)


def fit_path(path: Path, width: int) -> str:
    """``display_path`` in ``width`` cells: the bundle's own name stays whole; its folder loses
    its start (``…/runs/trainwatch-node1-…``) rather than the line wrapping inside a name."""
    shown = display_path(path)
    if len(shown) <= width:
        return shown
    name = Path(path).name
    folder = shown[: len(shown) - len(name)]
    keep = max(0, width - len(name) - 1)
    return ("…" + folder[len(folder) - keep:] if keep else "…/") + name
