"""GPU readings against where the ranks are: GPUs spinning in a collective versus idle GPUs."""

from __future__ import annotations

from collections.abc import Sequence

from ..snapshot import Rank, compact_ranks

SPIN_PCT = 90.0  # a GPU this busy while its rank waits in a collective is spinning
IDLE_PCT = 5.0


def gpu_phase_warnings(ranks: Sequence[Rank]) -> tuple[str, ...]:
    """A phrase for the verdict: GPUs spinning in a collective versus idle GPUs.

    e.g. ``"GPUs of ranks 0-2 spin at 100% in the collective; rank 3's GPU is idle"``.
    """
    spinning: list[tuple[int, float]] = []
    idle: list[int] = []
    for r in ranks:
        if r.rank is None or r.gpu is None:
            continue
        util = r.gpu.util_pct
        if r.gpu.shared_with and r.gpu.proc_util_pct is not None:
            util = r.gpu.proc_util_pct  # the device figure mixes in the other ranks
        if util is None:
            continue
        if r.phase == "collective" and util >= SPIN_PCT:
            spinning.append((r.rank, util))
        elif util <= IDLE_PCT:
            idle.append(r.rank)
    if not spinning:
        return ()
    low = min(u for _, u in spinning)
    level = "100%" if low >= 99.5 else f"{low:.0f}-100%"
    ranks_s = [r for r, _ in spinning]
    head = (
        f"GPU of rank {ranks_s[0]} spins at {level} in the collective" if len(ranks_s) == 1
        else f"GPUs of ranks {compact_ranks(ranks_s)} spin at {level} in the collective"
    )
    if not idle:
        return (head,)
    tail = (
        f"rank {idle[0]}'s GPU is idle" if len(idle) == 1
        else f"the GPUs of ranks {compact_ranks(idle)} are idle"
    )
    return (f"{head}; {tail}",)
