"""Bounded reads of a log's tail: the live view, crash records and bundles share this."""

from __future__ import annotations

import os

MAX_BYTES = 16 * 1024


def read_tail(path: str, lines: int = 30, max_bytes: int = MAX_BYTES) -> tuple[str, ...] | None:
    """The last ``lines`` lines of ``path`` reading at most ``max_bytes``; ``None`` if unreadable."""
    try:
        with open(path, "rb") as handle:
            handle.seek(0, os.SEEK_END)
            end = handle.tell()
            start = max(0, end - max_bytes)
            handle.seek(start)
            data = handle.read(max_bytes)
    except OSError:
        return None
    text = data.decode("utf-8", errors="replace")
    parts = text.splitlines()
    if start > 0 and parts:
        parts = parts[1:]  # the first line is probably cut
    # Progress bars rewrite a line with \r; keep only what the terminal would show.
    return tuple(p.rsplit("\r", 1)[-1] for p in parts[-lines:])
