"""Hand-made snapshots for the TUI tests (fixed times, so screens are deterministic)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace

from trainwatch.probes.source import OneNodeSource
from trainwatch.probes.snapshot import (
    ExitInfo, Frame, Group, Job, Rank, RankGpu, Snapshot, ThreadStack, Verdict,
)

T0 = 1_700_000_000.0
NOW = T0 + 754.0  # the fixed clock of every test app


def clock() -> float:
    return NOW


def _job(world: int = 4) -> Job:
    return Job(launcher="torchrun", pid=4242, host="node1", world_size=world, local_world_size=world,
               nnodes=1, started_at=T0, cmdline=("torchrun", "train.py"))


def _collective_stack(line: int = 88) -> tuple[ThreadStack, ...]:
    main = ThreadStack("MainThread", tid=100, is_main=True, active=False, frames=(
        Frame("all_reduce", "torch/distributed/distributed_c10d.py", 2501),
        Frame("sync_gradients", "/job/train.py", 44),
        Frame("train", "/job/train.py", line),
        Frame("main", "/job/train.py", 130),
    ))
    return (main, ThreadStack("deadline", tid=101, active=False, frames=(Frame("_expire", "/job/train.py", 29),)))


def _rank(n: int, **kw) -> Rank:
    base = Rank(rank=n, pid=5000 + n, host="node1", local_rank=n, state="running", phase="compute",
                where="train.py:37 compute_step", user_frame="train.py:37 compute_step",
                cpu_pct=97.0, rss_bytes=512 * 2**20, log_path=None,
                threads=(ThreadStack("MainThread", tid=200 + n, is_main=True, active=True, frames=(
                    Frame("backward", "torch/_tensor.py", 626),
                    Frame("compute_step", "/job/train.py", 37),
                    Frame("train", "/job/train.py", 105),
                )),))
    return replace(base, **kw)


def healthy() -> Snapshot:
    ranks = tuple(_rank(n, gpu=RankGpu(index=n, util_pct=90.0 + n, mem_used_bytes=30 * 2**30,
                                          mem_total_bytes=80 * 2**30)) for n in range(4))
    return Snapshot(job=_job(), ranks=ranks, taken_at=NOW, window_s=2.0,
                    groups=(Group(ranks=(0, 1, 2, 3), phase="compute", where="train.py:37 compute_step",
                                  label="0-3"),),
                    verdict=Verdict("healthy", summary="all 4 ranks are making progress", since=T0 + 30))


def straggler() -> Snapshot:
    waiting = tuple(_rank(n, state="stuck", phase="collective", op="all_reduce", stuck_for_s=42.0,
                          cpu_pct=3.0, where="train.py:44 sync_gradients",
                          user_frame="train.py:44 sync_gradients", threads=_collective_stack())
                    for n in range(3))
    culprit = _rank(3, state="stuck", phase="sleep", where="train.py:108 train", stuck_for_s=42.0, cpu_pct=0.0,
                    user_frame="train.py:108 train", detail="main thread sleeps in the user's code",
                    threads=(ThreadStack("MainThread", tid=203, is_main=True, active=False, frames=(
                        Frame("sleep", "<built-in>", None, native=True),
                        Frame("train", "/job/train.py", 108),
                        Frame("main", "/job/train.py", 130),
                    )),))
    return Snapshot(
        job=_job(), ranks=(*waiting, culprit), taken_at=NOW, window_s=2.0,
        groups=(Group(ranks=(0, 1, 2), phase="collective", op="all_reduce", where="train.py:44 sync_gradients",
                      label="0-2"),
                Group(ranks=(3,), phase="sleep", where="train.py:108 train", label="3", culprit=True)),
        verdict=Verdict("straggler", culprits=(3,), since=NOW - 42,
                        summary="rank 3 is in its own code (train.py:108) while ranks 0-2 wait in all_reduce"),
        warnings=("ranks 0-2 have waited 42s in all_reduce",),
        notes=("GPU metrics: no NVIDIA driver on this host",),
    )


def crashed() -> Snapshot:
    base = straggler()
    dead = replace(base.ranks[3], state="exited", phase="unknown", threads=(), stuck_for_s=None, cpu_pct=None,
                   rss_bytes=None, where=None, user_frame=None, detail=None,
                   exit=ExitInfo(signal="SIGSEGV", at=NOW - 9, first=True, reason="segmentation fault",
                                 frame="train.py:112 train"))
    return replace(
        base, ranks=(*base.ranks[:3], dead),
        groups=(base.groups[0], Group(ranks=(3,), phase="unknown", label="3", op="exited SIGSEGV", culprit=True)),
        verdict=Verdict("crashed", culprits=(3,), since=NOW - 9,
                        summary="rank 3 died (SIGSEGV) first; ranks 0-2 wait for it in all_reduce"),
        warnings=("rank 3 was killed by SIGSEGV",),
    )


def gpu_wait() -> Snapshot:
    """Rank 1 blocks on its GPU (a synchronize) while the others wait for it; steps are known."""
    base = healthy()
    waiting = tuple(replace(r, state="stuck", phase="collective", op="all_reduce", stuck_for_s=15.0, cpu_pct=2.0,
                            where="train.py:44 sync_gradients", user_frame="train.py:44 sync_gradients",
                            threads=_collective_stack(), step=1200, step_period_s=0.41)
                    for r in base.ranks if r.rank != 1)
    slow = replace(base.ranks[1], state="stuck", phase="gpu_wait", op="synchronize", stuck_for_s=15.0,
                   cpu_pct=100.0, where="train.py:71 log_loss", user_frame="train.py:71 log_loss",
                   detail="the host waits for its GPU (torch.cuda.synchronize)", step=1199, step_period_s=0.43,
                   threads=(ThreadStack("MainThread", tid=201, is_main=True, active=True, frames=(
                       Frame("synchronize", "torch/cuda/__init__.py", 954),
                       Frame("log_loss", "/job/train.py", 71),
                       Frame("train", "/job/train.py", 104),
                   )),))
    return replace(
        base, ranks=tuple(sorted((*waiting, slow), key=lambda r: r.rank)),
        groups=(Group(ranks=(0, 2, 3), phase="collective", op="all_reduce", where="train.py:44 sync_gradients",
                      label="0,2-3"),
                Group(ranks=(1,), phase="gpu_wait", op="synchronize", where="train.py:71 log_loss", label="1",
                      culprit=True)),
        verdict=Verdict("straggler", culprits=(1,), since=NOW - 15,
                        summary="rank 1 waits on its GPU at train.py:71 log_loss while ranks 0,2-3 wait in all_reduce"),
    )


def ddp_straggler() -> Snapshot:
    """As the demo shows it (DDP, steps known): the longest op and verdict the views must fit."""
    def ddp_stack(line: int) -> tuple[ThreadStack, ...]:
        return (ThreadStack("MainThread", tid=300, is_main=True, active=False, frames=(
            Frame("backward", "torch/_tensor.py", 626),
            Frame("compute_step", "/job/train.py", 68),
            Frame("train", "/job/train.py", line),
            Frame("main", "/job/train.py", 196),
        )),)
    waiting = tuple(_rank(n, state="stuck", phase="collective", op="all_reduce (DDP gradients)", stuck_for_s=34.0,
                          cpu_pct=0.0, where="train.py:68 compute_step", user_frame="train.py:68 compute_step",
                          threads=ddp_stack(160), step=4, step_period_s=0.2) for n in range(3))
    culprit = _rank(3, state="stuck", phase="sleep", op="sleep", where="train.py:168 train", stuck_for_s=34.0,
                    cpu_pct=0.0, user_frame="train.py:168 train", detail="main thread sleeps in the user's code",
                    step=3, step_period_s=0.2,
                    threads=(ThreadStack("MainThread", tid=303, is_main=True, active=False, frames=(
                        Frame("sleep", "<built-in>", None, native=True),
                        Frame("train", "/job/train.py", 168),
                        Frame("main", "/job/train.py", 196),
                    )),))
    return Snapshot(
        job=_job(), ranks=(*waiting, culprit), taken_at=NOW, window_s=2.0,
        groups=(Group(ranks=(0, 1, 2), phase="collective", op="all_reduce (DDP gradients)",
                      where="train.py:68 compute_step", label="0-2"),
                Group(ranks=(3,), phase="sleep", op="sleep", where="train.py:168 train", label="3", culprit=True)),
        verdict=Verdict("straggler", culprits=(3,), since=NOW - 34,
                        summary="rank 3 is in sleep at train.py:168 train while ranks 0-2 wait in all_reduce "
                                "(DDP gradients) at train.py:68 compute_step; rank 3 is at step 3 while ranks "
                                "0-2 are at step 4"),
        notes=("NVML unavailable: libnvidia-ml.so.1 not found (no NVIDIA driver on this host)",),
    )


class ListSource(OneNodeSource):
    """Test double for the data boundary: hands out snapshots in order, then repeats the last."""

    def __init__(self, *snapshots: Snapshot | Exception) -> None:
        self.items = list(snapshots)
        self.calls: list[frozenset[int]] = []
        self.closed = False
        self.paused = False

    def poll(self, native_for: frozenset[int] = frozenset()) -> Snapshot:
        self.calls.append(native_for)
        item = self.items.pop(0) if len(self.items) > 1 else self.items[0]
        if isinstance(item, Exception):
            raise item
        return item

    def close(self) -> None:
        self.closed = True

    @contextmanager
    def paused_judgement(self) -> Iterator[None]:
        self.paused = True
        try:
            yield
        finally:
            self.paused = False



def pods_pending() -> Snapshot:
    """A PyTorchJob seen from a login box (``--k8s``): two pods whose torchruns wait in their
    rendezvous, a third the scheduler never placed; judged by the merge, as a live view gets it."""
    from trainwatch.probes.remote.merge import NodeView, merge_nodes
    from trainwatch.probes.remote.pods import words
    from trainwatch.probes.snapshot import PodState

    def pod(name: str, node_rank: int, **kw) -> PodState:
        state = PodState(name=name, pod_phase=kw.pop("pod_phase", "Running"), node_rank=node_rank,
                         ranks=(2 * node_rank, 2 * node_rank + 1), node=kw.pop("node", None), **kw)
        return replace(state, words=words(state))

    def waiting(host: str, node_id: str) -> Snapshot:
        job = Job(launcher="torchrun", pid=5, host=host, world_size=6, local_world_size=2, nnodes=3,
                  waiting_rendezvous=True, node_id=node_id, started_at=T0, cmdline=("torchrun", "train.py"))
        return Snapshot(job=job, taken_at=NOW, window_s=2.0)

    pods = [pod("ft-master-0", 0, node="gpu-node-1"), pod("ft-worker-0", 1, node="gpu-node-2"),
            pod("ft-worker-1", 2, pod_phase="Pending", reason="Unschedulable",
                message="0/8 nodes are available: 8 Insufficient nvidia.com/gpu.")]
    views = [NodeView("ft-master-0", waiting("gpu-node-1", "b/1"), pod=True),
             NodeView("ft-worker-0", waiting("gpu-node-2", "b/2"), pod=True)]
    merged = merge_nodes(views, pods=pods, job=Job(launcher="kubernetes", pid=0, host="pods"))
    return replace(merged, verdict=replace(merged.verdict, since=T0 + 60))
