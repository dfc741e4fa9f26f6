"""The text of a frame's source line, read from the file on this machine (the classifier's hint)."""

from __future__ import annotations

import linecache
from collections.abc import Callable

from ..processes.namespaces import foreign_mounts, path_here
from ...snapshot import Frame


def source_line(frame: Frame) -> str:
    """The stripped line ``frame`` points at; empty when the file or line cannot be read."""
    if not frame.line:
        return ""
    return linecache.getline(frame.file, frame.line).strip()


def source_line_of(pid: int) -> Callable[[Frame], str]:
    """:func:`source_line` for the frames of process ``pid``: a container's files are read through
    its root (/proc/PID/root), where the paths its frames name lead."""
    if not foreign_mounts(pid):
        return source_line

    def line(frame: Frame) -> str:
        if not frame.line:
            return ""
        return linecache.getline(path_here(pid, frame.file), frame.line).strip()
    return line
