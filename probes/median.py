"""The median of a few numbers (``statistics`` would import ``fractions`` and ``decimal``: 3 ms of
every one-shot command's start-up, for one function)."""

from __future__ import annotations

from collections.abc import Iterable


def median(values: Iterable[float]) -> float:
    """The middle value, or the mean of the two middle ones; ValueError when there are none."""
    ordered = sorted(values)
    if not ordered:
        raise ValueError("median of no values")
    middle = len(ordered) // 2
    return ordered[middle] if len(ordered) % 2 else (ordered[middle - 1] + ordered[middle]) / 2
