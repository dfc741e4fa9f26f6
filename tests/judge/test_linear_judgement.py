"""Merge, groups and the verdict are linear in ranks: 8,192 ranks are judged in well under a second.

Quadratic judgement (comparing ranks, stacks included, against lists) took about 18 s here;
the bound below is generous for a loaded machine and still minutes away from quadratic.
"""

from __future__ import annotations

import time

from trainwatch.probes.remote.merge import NodeView, merge_nodes
from trainwatch.probes.snapshot import Frame, HostInfo, Job, Rank, Snapshot, ThreadStack

PER_NODE = 8
WORLD = 8192

WAIT = (ThreadStack("MainThread", 1, tuple(Frame(f"f{i}", "/w/lib.py", i) for i in range(40))
                    + (Frame("sync_gradients", "/w/train.py", 40),), is_main=True),)
LATE = (ThreadStack("MainThread", 1, (Frame("compute_step", "/w/train.py", 99),), is_main=True),)


def node(index: int) -> Snapshot:
    host = f"node{index:04d}"
    ranks = []
    for n in range(index * PER_NODE, (index + 1) * PER_NODE):
        late = n == WORLD - 1
        ranks.append(Rank(rank=n, pid=10_000 + n, host=host, local_rank=n % PER_NODE, state="stuck",
                          phase="compute" if late else "collective", op=None if late else "allreduce",
                          where="train.py:99 compute_step" if late else "train.py:40 sync_gradients",
                          stuck_for_s=30.0, threads=LATE if late else WAIT))
    job = Job(launcher="torchrun", pid=1, host=host, world_size=WORLD, local_world_size=PER_NODE,
              master_addr="node0000", master_port=29500)
    return Snapshot(job=job, ranks=tuple(ranks), hosts=(HostInfo(name=host),), taken_at=100.0, window_s=2.0)


def test_8192_ranks_are_judged_in_linear_time_and_unread_ranks_are_not_blamed():
    views = [NodeView(f"node{i:04d}", node(i), local=i == 0) for i in range(WORLD // PER_NODE)]
    views[512] = NodeView("node0512", error="unreachable (Connection timed out)")
    started = time.perf_counter()
    merged = merge_nodes(views)
    elapsed = time.perf_counter() - started
    assert merged.verdict.kind == "straggler"
    assert merged.verdict.culprits == (WORLD - 1,), merged.verdict
    assert merged.verdict.summary.startswith("rank 8191 is in compute at train.py:99 compute_step while ranks")
    assert merged.verdict.summary.endswith("; node not read: node0512")
    unread = [r for r in merged.ranks if r.state == "unknown"]
    assert [r.rank for r in unread] == list(range(4096, 4104)) and {r.host for r in unread} == {"node0512"}
    assert [g.label for g in merged.groups] == ["0-4095,4104-8190", "4096-4103", "8191"]
    assert elapsed < 5.0, f"merge + groups + verdict of {WORLD} ranks took {elapsed:.1f}s"
