"""The text of a frame's source line, read from the file on this machine (the classifier's hint)."""

from __future__ import annotations

import linecache

from ...snapshot import Frame


def source_line(frame: Frame) -> str:
    """The stripped line ``frame`` points at; empty when the file or line cannot be read."""
    if not frame.line:
        return ""
    return linecache.getline(frame.file, frame.line).strip()
