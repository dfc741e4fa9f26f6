"""STAT-style equivalence classes: ranks that sit in the same place, listed compactly."""

from __future__ import annotations

from collections import defaultdict
from typing import Iterable

from ..snapshot import Group, Rank, compact_ranks


def group_key(rank: Rank) -> tuple[str, str | None, str | None]:
    """(phase, op, where); ranks no longer (or not yet) running by how, and, where Kubernetes says
    why their pod does not run them, by its words: two pods' ranks are two groups."""
    if rank.state == "missing":
        return ("missing", None, rank.scheduler)
    if rank.state == "exited":
        info = rank.exit
        how = (info.signal or (f"exit {info.code}" if info.code is not None else "exited")) if info else "exited"
        return ("exited", how, rank.scheduler)
    return (rank.phase, rank.op, rank.where)


def shown_key(rank: Rank) -> tuple[str, str | None, str | None]:
    """:func:`group_key`, with ranks that died at a place their last stack shows (last words, a
    faulthandler dump) told apart by it: the straggler killed in its sleep is not grouped with the
    ranks killed in the all_reduce that waited for it."""
    key = group_key(rank)
    if key[0] != "exited" or not rank.where:
        return key
    return ("exited", f"{key[1]} in {rank.op or rank.phase}", rank.where)


def group_ranks(ranks: Iterable[Rank], culprits: Iterable[int] = ()) -> tuple[Group, ...]:
    """Groups of ranks by (phase, op, where) (:func:`shown_key`), biggest first; a group is a
    culprit if it holds one."""
    buckets: dict[tuple, list[int]] = defaultdict(list)
    for rank in ranks:
        if rank.rank is not None:
            buckets[shown_key(rank)].append(rank.rank)
    bad = set(culprits)
    groups = [
        Group(ranks=tuple(sorted(members)), phase=key[0], op=key[1], where=key[2],
              label=compact_ranks(members), culprit=bool(bad.intersection(members)))
        for key, members in buckets.items()
    ]
    return tuple(sorted(groups, key=lambda g: (-len(g.ranks), g.ranks)))


def group_what(group: Group) -> str:
    """What a group of ranks is doing: ``all_reduce``, ``sleep``, ``synchronize (gpu_wait)``."""
    what = group.op or group.phase
    if group.op and group.phase not in ("collective", "unknown", group.op):
        what += f" ({group.phase})"
    return what
