"""The judge's warnings about the whole job it was given: ranks it cannot see (a job that spans
nodes read from one), GPUs spinning in a collective against idle ones, steps far slower than their
rhythm. Pure: the same evidence gives the same warnings on every path, so a merged view makes
them once over every node, and each node's own can be told apart (:func:`job_warnings` on it)."""

from __future__ import annotations

from collections.abc import Sequence

from ..snapshot import RAY_TRAIN, Job, Rank, Snapshot, compact_ranks
from .gpu_warnings import gpu_phase_warnings
from .steps import slow_step_warnings


def job_warnings(job: Job, ranks: Sequence[Rank], window: float) -> tuple[str, ...]:
    """Every warning the judge gives about ``ranks`` of ``job`` sampled over ``window`` seconds."""
    return (*unseen_nodes(job, ranks), *gpu_phase_warnings(ranks), *slow_step_warnings(ranks, window))


def unseen_nodes(job: Job, ranks: Sequence[Rank]) -> tuple[str, ...]:
    """``job spans 2 nodes (world size 4); only this node's ranks (0-1) are shown: add …`` when
    fewer ranks were read than the world has, because the others run on nodes not read."""
    numbers = {r.rank for r in ranks if r.rank is not None}
    if not (job.world_size and job.local_world_size and job.world_size > job.local_world_size
            and len(numbers) < job.world_size):
        return ()
    how = "--ray auto" if job.launcher == RAY_TRAIN else "--hosts/--slurm"
    return (f"job spans {job.nnodes or '?'} nodes (world size {job.world_size}); only this node's ranks "
            f"({compact_ranks(numbers)}) are shown: add {how} to see the others",)


def rejudged_warnings(snapshot: Snapshot, fresh: Sequence[str]) -> tuple[str, ...]:
    """A snapshot judged again (a bundle, ``watch`` after deaths): its readers' warnings kept, the
    judge's own about its ranks replaced by ``fresh`` (the new judgement's)."""
    before = set(job_warnings(snapshot.job, snapshot.ranks, snapshot.window_s))
    return tuple(dict.fromkeys([*(w for w in snapshot.warnings if w not in before), *fresh]))
