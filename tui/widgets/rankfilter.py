"""The ``/`` filter: which ranks a query keeps."""

from __future__ import annotations

import re

from ...probes import Rank

_RANK_LIST = re.compile(r"^\s*\d+(\s*-\s*\d+)?(\s*,\s*\d+(\s*-\s*\d+)?)*\s*$")


def rank_numbers(query: str) -> set[int] | None:
    """``"0-3,7"`` -> ``{0, 1, 2, 3, 7}``; ``None`` when the query is not a rank list."""
    if not _RANK_LIST.match(query):
        return None
    numbers: set[int] = set()
    for part in query.split(","):
        low, _, high = part.strip().partition("-")
        start = int(low)
        end = int(high) if high.strip() else start
        numbers.update(range(min(start, end), max(start, end) + 1))
    return numbers


def matches(rank: Rank, query: str) -> bool:
    """A rank list selects by rank number; other text matches state, phase, op, where, host."""
    query = query.strip()
    if not query:
        return True
    numbers = rank_numbers(query)
    if numbers is not None:
        return rank.rank in numbers
    fields = (rank.state, rank.phase, rank.op, rank.where, rank.user_frame, rank.host,
              rank.detail, rank.waits_for, str(rank.pid), rank.exit.signal if rank.exit else None)
    text = " ".join(f for f in fields if f).lower()
    return all(word in text for word in query.lower().split())
