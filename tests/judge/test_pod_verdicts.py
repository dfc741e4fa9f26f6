"""A --k8s job judged over its pods (``merge_nodes`` with the pods Kubernetes reports): a pod that
never ran, one that keeps dying, one that could not be read, and pods known by what they are,
whatever host name they report."""

from __future__ import annotations

import dataclasses

from test_merge import node, rank

from trainwatch.probes.remote.merge import NodeView, merge_nodes
from trainwatch.probes.remote.pods import words
from trainwatch.probes.snapshot import Job, PodState, Rank, Snapshot


def pod(name: str, node_rank: int, per: int = 2, **kw) -> PodState:
    state = PodState(name=name, pod_phase=kw.pop("pod_phase", "Running"), node_rank=node_rank,
                     ranks=tuple(range(node_rank * per, (node_rank + 1) * per)), **kw)
    return dataclasses.replace(state, words=words(state))


PENDING = dict(pod_phase="Pending", reason="Unschedulable",
               message="0/8 nodes are available: 8 Insufficient nvidia.com/gpu.")
CRASHING = dict(pod_phase="Running", reason="CrashLoopBackOff", message="OOMKilled", exit_code=137, restarts=3)
BARE = Job(launcher="kubernetes", pid=0, host="pods -l training.kubeflow.org/job-name=llm")


def waiting_launcher(host: str, node_id: str) -> Snapshot:
    """A pod whose torchrun waits in its static rendezvous, no rank started (world of 3 nodes)."""
    job = Job(launcher="torchrun", pid=5, host=host, world_size=6, local_world_size=2, nnodes=3,
              waiting_rendezvous=True, node_id=node_id)
    return Snapshot(job=job, taken_at=100.0, window_s=2.0)


def test_a_pending_pod_is_named_with_the_schedulers_words():
    pods = [pod("llm-master-0", 0), pod("llm-worker-0", 1), pod("llm-worker-1", 2, **PENDING)]
    views = [NodeView("llm-master-0", waiting_launcher("gpu-node-1", "b/1"), pod=True),
             NodeView("llm-worker-0", waiting_launcher("gpu-node-2", "b/2"), pod=True)]
    merged = merge_nodes(views, pods=pods, job=BARE)
    assert merged.verdict.kind == "rendezvous" and merged.verdict.culprits == (4, 5), merged.verdict
    assert merged.verdict.summary.startswith(
        "ranks 4-5 never joined: llm-worker-1 is Pending: 0/8 nodes are available: 8 Insufficient nvidia.com/gpu.")
    held = [r for r in merged.ranks if r.rank in (4, 5)]
    assert {(r.state, r.host, r.scheduler) for r in held} == {
        ("missing", "llm-worker-1", "llm-worker-1 is Pending: 0/8 nodes are available: 8 Insufficient nvidia.com/gpu.")}
    assert [p.name for p in merged.job.pods] == ["llm-master-0", "llm-worker-0", "llm-worker-1"]


def test_every_pod_pending_is_still_a_verdict():
    pods = [pod("llm-master-0", 0, **PENDING), pod("llm-worker-0", 1, **PENDING)]
    merged = merge_nodes([], pods=pods, job=BARE)
    assert merged.verdict.kind == "rendezvous" and merged.verdict.culprits == (0, 1, 2, 3)
    assert merged.job.world_size == 4 and merged.job.launcher == "kubernetes"


def test_ranks_in_init_wait_for_the_pending_pod():
    """Ranks started by a plain `python train.py` per pod (env:// rendezvous) wait in init_process_group."""
    ready = [rank(0, "gpu-node-1", 7, phase="init"), rank(1, "gpu-node-1", 8, phase="init")]
    pods = [pod("llm-master-0", 0), pod("llm-worker-0", 1, **PENDING)]
    merged = merge_nodes([NodeView("llm-master-0", node("gpu-node-1", ready), pod=True)], pods=pods, job=BARE)
    assert merged.verdict.kind == "rendezvous" and merged.verdict.culprits == (2, 3)
    assert "ranks 0-1 wait in init" in merged.verdict.summary


def test_a_crash_looping_pod_is_the_crash_with_all_its_ranks():
    pods = [pod("llm-master-0", 0), pod("llm-worker-0", 1, **CRASHING)]
    views = [NodeView("llm-master-0", waiting_launcher("gpu-node-1", "b/1"), pod=True)]
    merged = merge_nodes(views, pods=pods, job=BARE, world_size=4)
    assert merged.verdict.kind == "crashed" and merged.verdict.culprits == (2, 3), merged.verdict
    assert merged.verdict.summary == "ranks 2-3 died: llm-worker-0 is in CrashLoopBackOff: OOMKilled, exit 137, " \
                                     "restarted 3 times"
    dead = next(r for r in merged.ranks if r.rank == 2)
    assert (dead.state, dead.exit.code, dead.exit.source) == ("exited", 137, "kubernetes")


def test_a_pod_that_could_not_be_read_leaves_its_ranks_unread_never_a_hang():
    """Ranks 0-1 wait in their collective; the pod holding 2-3 refused the exec: they may be the
    ones waited for (never "no local culprit")."""
    here = node("gpu-node-1", [rank(0, "gpu-node-1", 7), rank(1, "gpu-node-1", 8)])
    pods = [pod("llm-master-0", 0), pod("llm-worker-0", 1)]
    denied = "permission denied: system:serviceaccount:ml:reader may not create pods/exec in namespace ml"
    merged = merge_nodes([NodeView("gpu-node-1", here, local=True), NodeView("llm-worker-0", error=denied, pod=True)],
                         pods=pods)
    assert merged.verdict.kind == "straggler" and merged.verdict.culprits == (2, 3), merged.verdict
    assert "ranks 2-3 could not be read" in merged.verdict.summary and "no local culprit" not in merged.verdict.summary
    unread = next(r for r in merged.ranks if r.rank == 2)
    assert unread.host == "llm-worker-0" and denied in unread.detail


def test_the_pod_trainwatch_runs_in_reached_again_is_read_once():
    """Inside a hostNetwork pod its host name is its node's: the agent exec'd into that same pod is
    known as this one by its boot and PID namespace, and dropped; the local view takes the pod's name."""
    here = dataclasses.replace(node("gpu-node-1", [rank(0, "gpu-node-1", 7), rank(1, "gpu-node-1", 8)]))
    here = dataclasses.replace(here, job=dataclasses.replace(here.job, node_id="boot/4026532256"))
    other = node("gpu-node-1", [rank(2, "gpu-node-1", 7), rank(3, "gpu-node-1", 8, phase="compute")])
    other = dataclasses.replace(other, job=dataclasses.replace(other.job, node_id="boot/4026532259"))
    views = [NodeView("gpu-node-1", here, local=True), NodeView("llm-master-0", here, pod=True),
             NodeView("llm-worker-0", other, pod=True)]
    merged = merge_nodes(views, pods=[pod("llm-master-0", 0), pod("llm-worker-0", 1)])
    # the same host name and the same PIDs in two pods: two pods, four ranks, each once
    assert [(r.rank, r.host, r.pid) for r in merged.ranks] == [
        (0, "llm-master-0", 7), (1, "llm-master-0", 8), (2, "llm-worker-0", 7), (3, "llm-worker-0", 8)]
    assert merged.verdict.kind == "straggler" and merged.verdict.culprits == (3,)
    assert merged.job.nnodes == 2
    assert not any("listed twice" in n for n in merged.notes)
    assert any("llm-master-0 is gpu-node-1" in n and "read once" in n for n in merged.notes)


def test_absent_ranks_of_a_running_pod_that_answered_are_missing():
    here = node("gpu-node-1", [rank(0, "gpu-node-1", 7)], world=2)
    merged = merge_nodes([NodeView("llm-master-0", here, pod=True)], pods=[pod("llm-master-0", 0)])
    missing = next(r for r in merged.ranks if r.rank == 1)
    assert (missing.state, missing.host, missing.scheduler) == ("missing", "llm-master-0", None)


def test_pods_travel_in_the_json():
    pods = [pod("llm-master-0", 0, **PENDING)]
    merged = merge_nodes([], pods=pods, job=BARE)
    back = Snapshot.from_json(merged.to_json())
    assert back.job.pods == merged.job.pods and back.ranks == merged.ranks
    assert isinstance(back.ranks[0], Rank) and back.ranks[0].scheduler.startswith("llm-master-0 is Pending")


def test_the_pod_trainwatch_runs_in_refused_like_the_others_is_not_unread():
    """Without the exec right, the agent in trainwatch's own pod fails too: that pod's ranks were
    read here, so it is not a node unread; the other pod is."""
    here = node("gpu-node-1", [rank(0, "gpu-node-1", 7), rank(1, "gpu-node-1", 8)])
    denied = "permission denied: system:serviceaccount:ml:reader may not create pods/exec in namespace ml"
    views = [NodeView("gpu-node-1", here, local=True), NodeView("llm-master-0", error=denied, pod=True),
             NodeView("llm-worker-0", error=denied, pod=True)]
    merged = merge_nodes(views, pods=[pod("llm-master-0", 0), pod("llm-worker-0", 1)])
    assert merged.verdict.summary.endswith("; node not read: llm-worker-0"), merged.verdict
    assert [h.name for h in merged.hosts if h.error] == ["llm-worker-0"]
    assert [r.host for r in merged.ranks] == ["llm-master-0"] * 2 + ["llm-worker-0"] * 2
    assert any(n.startswith("llm-master-0 is this node, read here") for n in merged.notes)
