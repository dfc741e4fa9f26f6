"""Merge the snapshots of every node of a job into one snapshot of the whole job.

Ranks are concatenated (each keeps its node in ``Rank.host``), and groups and the verdict are
computed again over the whole set, so a culprit on another node is named as if it were local.
Ranks of ``WORLD_SIZE`` seen on no node are ``missing`` only when every node answered; while a
node could not be read they are ``unknown`` (unread is not dead), and the verdict names the
nodes it could not read. Everything here is linear in ranks.
"""

from __future__ import annotations

import dataclasses
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

from ..gc_pause import gc_paused
from ..judge.judgement import JudgeMemory, JudgeOptions, judge_job
from ..judge.warnings import job_warnings
from ..observed import ObservedJob, combine_states, observed_rank
from ..snapshot import AttemptEnd, HostInfo, Job, PodState, Rank, Snapshot, Verdict
from ..record import Record
from .pods import dead as pod_dead, exit_of, runs as pod_runs


@dataclass(frozen=True, repr=False)
class NodeView(Record):
    """One node's part of the job: its snapshot, or why there is none."""

    name: str  # how the node was reached (host, SLURM node, pod); the local node's own name
    snapshot: Snapshot | None = None
    error: str | None = None
    stale_s: float | None = None  # the snapshot is an earlier one, this many seconds old
    note: str | None = None
    local: bool = False
    pod: bool = False  # a Kubernetes pod: known by its name, whatever host name it reports (hostNetwork)


def _node_labels(views: Sequence[NodeView]) -> dict[int, str]:
    """The host name each node's ranks carry: its own, unless another node reports the same one; a
    pod's name (a hostNetwork pod reports its node's host name, which two pods may share)."""
    own = {i: _own_host(v) for i, v in enumerate(views) if v.snapshot is not None}
    counts = Counter(own.values())
    labels = {}
    for i, host in own.items():
        unique_host = bool(host) and counts[host] == 1
        labels[i] = views[i].name if views[i].pod else host if unique_host or (views[i].local and host) \
            else views[i].name
    return labels


def one_view_per_node(views: Sequence[NodeView]) -> tuple[list[NodeView], list[str]]:
    """Each node once, known by what it is (``Job.node_id``: its boot and PID namespace), not by
    its name: a pod reached both here and through ``kubectl exec`` (its name and its node's being
    different words for it) is read once, here; the local view then bears the pod's name."""
    kept: list[NodeView] = []
    notes: list[str] = []
    seen: dict[str, int] = {}
    for view in views:
        node = view.snapshot.job.node_id if view.snapshot is not None else None
        if node is None or node not in seen:
            if node is not None:
                seen[node] = len(kept)
            kept.append(view)
            continue
        first = kept[seen[node]]
        if view.pod and not first.pod:  # the pod trainwatch runs in: its name is the one a person knows
            kept[seen[node]] = dataclasses.replace(first, name=view.name, pod=True)
        notes.append(f"{view.name} is {first.name} (one PID namespace of one machine, reached twice): "
                     "its ranks are read once")
    return kept, notes


def _own_host(view: NodeView) -> str:
    snap = view.snapshot
    assert snap is not None
    hosts = {r.host for r in snap.ranks if r.host}
    if len(hosts) == 1:
        return hosts.pop()
    return snap.job.host or view.name


SAME_ATTEMPT_S = 2.0  # two nodes' launchers log one attempt's end within this of each other


def _attempts(jobs: list[Job]) -> dict:
    """A restarted job's attempts over every node: each node's launcher logs the failures of its own
    ranks only, so the ends of all nodes, in time order (one attempt's, logged by two nodes, once),
    are the job's history, numbered back from the attempt running now."""
    current = max((j.attempt for j in jobs if j.attempt is not None), default=None)
    ends = sorted((e for j in jobs for e in j.attempts), key=lambda e: (e.exit.at is None, e.exit.at or 0.0))
    kept: list[AttemptEnd] = []
    for end in ends:
        if kept and end.exit.at is not None and kept[-1].exit.at is not None \
                and end.exit.at - kept[-1].exit.at <= SAME_ATTEMPT_S:
            continue
        kept.append(end)
    if current is None or not kept:
        return {}
    began = min((j.attempt_started_at for j in jobs if j.attempt == current and j.attempt_started_at is not None),
                default=None)
    before = [e for e in kept if began is None or e.exit.at is None or e.exit.at <= began]
    first = max(0, current - len(before))
    numbered = tuple(dataclasses.replace(e, attempt=first + i) for i, e in enumerate(kept))
    return {"attempt": current, "attempt_started_at": began, "attempts": numbered}


def _pods_read_here(views: Sequence[NodeView], pods: Sequence[PodState]) -> tuple[list[NodeView], list[str]]:
    """A pod whose agent could not be read while every rank it runs was read here is the pod
    trainwatch runs in (its exec refused like the others'): no node unread, and the local view
    bears its name."""
    local = next((v for v in views if v.local and v.snapshot is not None), None)
    if local is None or not pods:
        return list(views), []
    assert local.snapshot is not None
    here = {r.rank for r in local.snapshot.ranks if r.state != "missing" and r.rank is not None}
    mine = [p.name for p in pods if p.ranks and set(p.ranks) <= here]
    target = next((v for v in views if v.snapshot is None and v.pod and v.name in mine), None) \
        if len(mine) == 1 else None
    if target is None:
        return list(views), []
    named = dataclasses.replace(local, name=target.name, pod=True)
    note = f"{target.name} is this node, read here (its agent: {target.error or 'no answer'})"
    return [named if v is local else v for v in views if v is not target], [note]


def merge_nodes(views: Sequence[NodeView], *, memory: JudgeMemory | None = None,
                world_size: int | None = None, pods: Sequence[PodState] = (), job: Job | None = None) -> Snapshot:
    """One snapshot of the job from every node's view (``source="remote"``), judged again over
    all ranks; ``memory``: the judge's memory across polls of this job (tie-breaks, ``since``).
    ``pods``: the job's pods as Kubernetes reports them (a pod that runs none of its ranks says
    why); ``job``: the job's record where no node answered (every pod Pending, say)."""
    with gc_paused():  # every rank made again, twice: many small acyclic objects
        return _merged(views, memory, world_size, pods, job)


def _merged(views: Sequence[NodeView], memory: JudgeMemory | None, world_size: int | None,
            pods: Sequence[PodState] = (), bare: Job | None = None) -> Snapshot:
    views, notes = one_view_per_node(views)
    views, more = _pods_read_here(views, pods)
    notes += more
    good = [(i, v) for i, v in enumerate(views) if v.snapshot is not None]
    if not good and not (pods and bare is not None):
        raise ValueError("no node answered")
    labels = _node_labels(views)
    base = next((v.snapshot for _, v in good if v.local), good[0][1].snapshot) if good else None

    ranks: list[Rank] = []
    hosts: list[HostInfo] = []
    warnings: list[str] = []
    seen_pids: set[tuple[str, int]] = set()
    for i, view in enumerate(views):
        if view.snapshot is None:
            hosts.append(HostInfo(name=view.name, error=view.error or "no answer"))
            notes.append(f"node {view.name}: {view.error or 'no answer'}")
            continue
        snap, label = view.snapshot, labels[i]
        prefix = "" if view.local else f"{label}: "
        own_host = snap.job.node_id or _own_host(view)  # two pods of a node may hold the same PIDs
        duplicate = False
        for rank in snap.ranks:
            if rank.state == "missing" and rank.pid is None and rank.local_rank is None:
                continue  # a node's own guess about ranks elsewhere; recomputed below
            identity = (own_host, rank.pid) if rank.pid is not None else None
            if identity in seen_pids:
                duplicate = True
                continue
            if identity:
                seen_pids.add(identity)
            ranks.append(rank if rank.host == label else dataclasses.replace(rank, host=label))
        if duplicate:
            notes.append(f"node {view.name}: some ranks were already seen through another node (listed twice?)")
        for info in snap.hosts or (HostInfo(name=label),):
            hosts.append(dataclasses.replace(info, name=label) if info.name != label else info)
        # The judge's warnings about one node's ranks are made again over the whole job below
        # ("only this node's ranks are shown" among them); the node's readers' own are kept.
        judged_there = set(job_warnings(snap.job, snap.ranks, snap.window_s)) if snap.warnings else set()
        warnings.extend(prefix + w for w in snap.warnings if w not in judged_there)
        notes.extend(prefix + n for n in snap.notes)
        if view.stale_s is not None:
            notes.append(f"node {view.name}: slow to answer; showing its snapshot from {view.stale_s:.0f}s ago")
        if view.note:
            notes.append(f"node {view.name}: {view.note}")

    world = world_size or max((v.snapshot.job.world_size or 0 for _, v in good), default=0) or None
    world = max(world or 0, max((max(p.ranks) + 1 for p in pods if p.ranks), default=0)) or None
    unread = [v for v in views if v.snapshot is None]
    launching = {v.name: v.snapshot.job for v in views if v.snapshot is not None and v.snapshot.job.waiting_rendezvous}
    ranks = _sorted(_drop_missing_seen_live(ranks) + _absent(ranks, world, unread, pods, launching))
    warnings.extend(_conflicts(ranks))
    record = base.job if base is not None else bare
    assert record is not None
    job = dataclasses.replace(record, world_size=world,
                              nnodes=max(record.nnodes or 0, len(views), len(pods)) or None, node_id=None,
                              pods=tuple(pods), **_attempts([v.snapshot.job for _, v in good]))
    # Every node's record of its ranks' collectives, together: the judge finds disagreements across nodes.
    collectives = combine_states([v.snapshot.collectives for _, v in good])
    # Each node judged its own RAS replies: the judge picks the view that counts and words it.
    ras_views = tuple((v.name, s.ras) for _, v in good if (s := v.snapshot.collectives) is not None and s.ras)
    taken_at = max((v.snapshot.taken_at for _, v in good), default=0.0) or time.time()
    evidence = ObservedJob(job=job, ranks=tuple(observed_rank(r) for r in ranks), collectives=collectives,
                           ras_views=ras_views)
    window = max((v.snapshot.window_s for _, v in good), default=0.0)
    judged = judge_job(evidence, memory if memory is not None else JudgeMemory(), taken_at,
                       JudgeOptions(window=window))
    if not good and judged.verdict.kind == "unknown":  # nothing read: why, rather than "not judged"
        why = "; ".join(f"{v.name}: {v.error or 'no answer'}" for v in unread[:2])
        more = f"; {len(unread) - 2} more" if len(unread) > 2 else ""
        judged = dataclasses.replace(judged, verdict=dataclasses.replace(
            judged.verdict, summary=f"no node of the job could be read ({why}{more})"))
    else:
        judged = dataclasses.replace(judged, verdict=_naming_unread(judged.verdict, unread))
    warnings.extend(judged.warnings)
    notes.extend(judged.notes)
    return Snapshot(
        job=job, ranks=judged.ranks, groups=judged.groups, verdict=judged.verdict, hosts=tuple(hosts),
        collectives=judged.collectives, warnings=tuple(_unique(warnings)), notes=tuple(_unique(notes)),
        taken_at=taken_at,
        window_s=window, source="remote",
    )


def _absent(ranks: Sequence[Rank], world: int | None, unread: Sequence[NodeView],
            pods: Sequence[PodState] = (), launching: dict[str, Job] | None = None) -> list[Rank]:
    """Ranks of the world seen on no node: ``missing`` when every node answered, else ``unknown``
    (they may live on a node that could not be read), with that node and its error. A rank whose
    pod Kubernetes does not run says why, in its words: ``missing`` while the pod never ran
    (Pending), ``exited`` where it died (a crash loop, OOMKilled, evicted); a rank of a running
    pod that could not be read is ``unknown`` with that pod's error; one of a pod whose launcher has
    not started its ranks yet (it waits for the other nodes) is ``missing``, saying so."""
    present = {r.rank for r in ranks}
    by_rank = {n: pod for pod in pods for n in pod.ranks}
    numbers = set(range(world or 0)) | set(by_rank)
    absent = sorted(n for n in numbers if n not in present)
    if not absent:
        return []
    errors = {v.name: v.error or "no answer" for v in unread}
    host = unread[0].name if len(unread) == 1 else "?"
    why = "; ".join(f"{v.name}: {v.error or 'no answer'}" for v in unread[:3])
    why += f"; {len(unread) - 3} more" if len(unread) > 3 else ""
    out = []
    for n in absent:
        pod = by_rank.get(n)
        if pod is not None and not pod_runs(pod):
            out.append(_from_pod(n, pod))
        elif pod is not None and pod.name in errors:
            out.append(Rank(rank=n, state="unknown", host=pod.name,
                            detail=f"not read: pod {pod.name} could not be read ({errors[pod.name]})"))
        elif pod is not None and launching and pod.name in launching:
            job = launching[pod.name]
            out.append(Rank(rank=n, state="missing", host=pod.name,
                            detail=f"not started yet: its launcher ({job.launcher} PID {job.pid} in pod {pod.name}) "
                                   "waits in its rendezvous for the other nodes"))
        elif not unread:
            out.append(Rank(rank=n, state="missing", host=pod.name if pod is not None else "?",
                            detail=f"rank {n} of {world} is on no node that was asked"))
        else:
            out.append(Rank(rank=n, state="unknown", host=host,
                            detail=f"not read: on a node that could not be read ({why})"))
    return out


def _from_pod(number: int, pod: PodState) -> Rank:
    """A rank of a pod Kubernetes does not run, in Kubernetes' words."""
    if pod_dead(pod):
        return Rank(rank=number, state="exited", host=pod.name, exit=exit_of(pod), scheduler=pod.words,
                    detail=pod.words)
    return Rank(rank=number, state="missing", host=pod.name, scheduler=pod.words, detail=pod.words)


def _drop_missing_seen_live(ranks: list[Rank]) -> list[Rank]:
    """A node's own ``missing`` rank that another node reports alive is not missing."""
    alive = {r.rank for r in ranks if r.state != "missing"}
    return [r for r in ranks if r.state != "missing" or r.rank not in alive]


def _naming_unread(verdict: Verdict, unread: Sequence[NodeView]) -> Verdict:
    """The verdict says which nodes it could not read (their ranks are never culprits)."""
    if not unread:
        return verdict
    names = ", ".join(v.name for v in unread[:5]) + (f" and {len(unread) - 5} more" if len(unread) > 5 else "")
    node = "node" if len(unread) == 1 else "nodes"
    return dataclasses.replace(verdict, summary=f"{verdict.summary}; {node} not read: {names}")


def _conflicts(ranks: Sequence[Rank]) -> list[str]:
    """Two live processes claiming one rank number means two jobs (or a restart) got mixed."""
    claimed = Counter(r.rank for r in ranks if r.rank is not None and r.pid is not None)
    twice = {n for n, count in claimed.items() if count > 1}
    if not twice:
        return []
    by_rank: dict[int, list[Rank]] = {}
    for r in ranks:
        if r.rank in twice and r.pid is not None:
            by_rank.setdefault(r.rank, []).append(r)
    return [f"rank {n} is reported by more than one process: "
            + ", ".join(f"{r.host} pid {r.pid}" for r in claims)
            for n, claims in sorted(by_rank.items())]


def _sorted(ranks: list[Rank]) -> list[Rank]:
    return sorted(ranks, key=lambda r: (r.rank is None, r.rank if r.rank is not None else 0, r.host, r.pid or 0))


def _unique(items) -> list[str]:
    return list(dict.fromkeys(items))
