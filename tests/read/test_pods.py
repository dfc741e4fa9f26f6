"""A --k8s job's pods as kubectl lists them: the ranks each runs, and Kubernetes' own words for
each that does not run its job. The pod documents below are written by hand in the shape the API
server sends (the same shapes tests/k8s_pods.py serves to the real kubectl in tests/jobs/test_k8s.py)."""

from __future__ import annotations

import json

import pytest

from trainwatch.probes.remote.pods import (dead, exit_of, forbidden, not_installed, parse_pods, runs,
                                           selector_for)


def pod(name: str, status: dict, env: dict | None = None, labels: dict | None = None, command=None,
        annotations: dict | None = None, containers: int = 1) -> dict:
    declared = [{"name": "pytorch", "env": [{"name": k, "value": v} for k, v in (env or {}).items()],
                 **({"command": command} if command else {})}]
    declared += [{"name": f"sidecar{i}"} for i in range(containers - 1)]
    return {"kind": "Pod", "metadata": {"name": name, "uid": f"uid-{name}", "labels": labels or {},
                                        "annotations": annotations or {}},
            "spec": {"containers": declared, "nodeName": "gpu-node-1" if status.get("phase") != "Pending" else None},
            "status": status}


RUNNING = {"phase": "Running", "containerStatuses": [{"name": "pytorch", "state": {"running": {}}}]}
PYTORCHJOB_ENV = {"PET_NPROC_PER_NODE": "8", "PET_NNODES": "3", "WORLD_SIZE": "24"}


def listed(*pods: dict) -> list:
    return parse_pods(json.dumps({"kind": "List", "items": list(pods)}))


def test_each_pod_runs_its_node_rank_times_ranks_per_node():
    pods = listed(pod("llm-master-0", RUNNING, {**PYTORCHJOB_ENV, "PET_NODE_RANK": "0", "RANK": "0"}),
                  pod("llm-worker-0", RUNNING, {**PYTORCHJOB_ENV, "PET_NODE_RANK": "1", "RANK": "1"}),
                  pod("llm-worker-1", {"phase": "Pending"}, {**PYTORCHJOB_ENV, "PET_NODE_RANK": "2", "RANK": "2"}))
    assert [(p.name, p.state.node_rank, p.state.ranks) for p in pods] == [
        ("llm-master-0", 0, tuple(range(0, 8))), ("llm-worker-0", 1, tuple(range(8, 16))),
        ("llm-worker-1", 2, tuple(range(16, 24)))]
    assert [p.running for p in pods] == [True, True, False]
    assert pods[0].world_size == 24 and pods[0].container == "pytorch"


@pytest.mark.parametrize("given, node_rank, nproc", [
    # a Kubeflow PyTorchJob of an older operator: only the replica says which node, and --nproc-per-node
    (dict(labels={"training.kubeflow.org/replica-type": "worker", "training.kubeflow.org/replica-index": "1"},
          command=["torchrun", "--nproc-per-node", "4", "train.py"]), 2, 4),
    (dict(labels={"training.kubeflow.org/replica-type": "master", "training.kubeflow.org/replica-index": "0"},
          command=["torchrun", "--nproc_per_node=2", "train.py"]), 0, 2),
    # an indexed Job / JobSet: the completion index, and the command's $(VAR) expanded as Kubernetes does
    (dict(annotations={"batch.kubernetes.io/job-completion-index": "3"},
          env={"NPROC": "8"}, command=["sh", "-c", "torchrun --nnodes 4 --nproc-per-node $(NPROC) train.py"]), 3, 8),
    # --node-rank on the command line wins over the replica
    (dict(labels={"training.kubeflow.org/replica-type": "worker", "training.kubeflow.org/replica-index": "0"},
          command=["torchrun", "--node-rank=5", "--nproc-per-node=1", "t.py"]), 5, 1),
])
def test_node_rank_and_ranks_per_node_from_what_the_pod_says(given, node_rank, nproc):
    (found,) = listed(pod("p", RUNNING, **given))
    assert (found.state.node_rank, found.nproc) == (node_rank, nproc)
    assert found.state.ranks == tuple(range(node_rank * nproc, (node_rank + 1) * nproc))


def test_a_pod_that_does_not_say_its_ranks_per_node_takes_the_others():
    pods = listed(pod("a", RUNNING, {"PET_NODE_RANK": "0", "PET_NPROC_PER_NODE": "2"}),
                  pod("b", {"phase": "Pending"}, {"PET_NODE_RANK": "1"}))
    assert pods[1].state.ranks == (2, 3)


UNSCHEDULABLE = {"phase": "Pending", "conditions": [
    {"type": "PodScheduled", "status": "False", "reason": "Unschedulable",
     "message": "0/8 nodes are available: 8 Insufficient nvidia.com/gpu."}]}
IMAGE_PULL = {"phase": "Pending", "containerStatuses": [{"name": "pytorch", "restartCount": 0, "state": {"waiting": {
    "reason": "ImagePullBackOff", "message": 'Back-off pulling image "registry.example/llm:v2"'}}}]}
CRASH_LOOP = {"phase": "Running", "containerStatuses": [{"name": "pytorch", "restartCount": 3, "state": {"waiting": {
    "reason": "CrashLoopBackOff"}}, "lastState": {"terminated": {"reason": "OOMKilled", "exitCode": 137,
                                                                 "finishedAt": "2026-11-28T08:01:00Z"}}}]}
EVICTED = {"phase": "Failed", "reason": "Evicted", "message": "The node was low on resource: memory."}
FAILED = {"phase": "Failed", "containerStatuses": [{"name": "pytorch", "state": {"terminated": {
    "reason": "Error", "exitCode": 1, "finishedAt": "2026-11-28T08:01:00Z"}}}]}
SUCCEEDED = {"phase": "Succeeded", "containerStatuses": [{"name": "pytorch", "state": {"terminated": {
    "reason": "Completed", "exitCode": 0}}}]}


@pytest.mark.parametrize("status, words, is_dead", [
    (UNSCHEDULABLE, "w is Pending: 0/8 nodes are available: 8 Insufficient nvidia.com/gpu.", False),
    (IMAGE_PULL, 'w is Pending: ImagePullBackOff: Back-off pulling image "registry.example/llm:v2"', False),
    (CRASH_LOOP, "w is in CrashLoopBackOff: OOMKilled, exit 137, restarted 3 times", True),
    (EVICTED, "w was Evicted: The node was low on resource: memory.", True),
    (FAILED, "w Failed: Error, exit 1", True),
    (SUCCEEDED, "w Succeeded (exit 0)", True),
    ({"phase": "Unknown"}, "w's state is Unknown (its node stopped reporting)", False),
])
def test_a_pod_not_running_its_job_says_why_in_kubernetes_words(status, words, is_dead):
    (found,) = listed(pod("w", status))
    assert found.state.words == words
    assert not found.running and not runs(found.state)
    assert dead(found.state) == is_dead


def test_a_crash_looping_pods_ranks_ended_as_kubernetes_says():
    (found,) = listed(pod("w", CRASH_LOOP, {"PET_NODE_RANK": "1", "PET_NPROC_PER_NODE": "2"}))
    info = exit_of(found.state)
    assert (info.code, info.reason, info.source) == (137, "OOMKilled", "kubernetes")
    assert info.message == "w is in CrashLoopBackOff: OOMKilled, exit 137, restarted 3 times"
    assert info.at == pytest.approx(1795852860.0)
    assert found.state.ranks == (2, 3)


def test_a_pod_being_deleted_does_not_run_its_job():
    item = pod("w", RUNNING)
    item["metadata"]["deletionTimestamp"] = "2026-11-28T08:02:00Z"
    (found,) = listed(item)
    assert not found.running and found.state.words == "w is Terminating (being deleted)"


@pytest.mark.parametrize("given, selector", [
    ("pytorchjob/llm", "training.kubeflow.org/job-name=llm"),
    ("PyTorchJob/llm", "training.kubeflow.org/job-name=llm"),
    ("jobset/pretrain", "jobset.sigs.k8s.io/jobset-name=pretrain"),
    ("trainjob/ft", "jobset.sigs.k8s.io/jobset-name=ft"),
    ("job/indexed", "batch.kubernetes.io/job-name=indexed"),
    ("app=llm,tier!=db", "app=llm,tier!=db"),
    ("example.com/team=a", "example.com/team=a"),  # a label with a slash is a selector, not a shorthand
])
def test_k8s_names_a_selector_or_a_job(given, selector):
    assert selector_for(given) == selector


def test_forbidden_names_the_verb_and_the_rule_that_grants_it():
    said = ('Error from server (Forbidden): pods is forbidden: User "system:serviceaccount:ml:default" cannot '
            'list resource "pods" in API group "" in the namespace "ml"')
    assert forbidden(said) == (
        'system:serviceaccount:ml:default may not list pods in namespace ml (grant it with a Role rule: '
        'apiGroups: [""], resources: ["pods"], verbs: ["list"]; docs/multi-node.md has the whole Role)')
    assert forbidden("error: You must be logged in to the server (Unauthorized)") is None


def test_an_image_without_trainwatch_is_said_with_what_to_do():
    said = ('error: Internal error occurred: error executing command in container: failed to exec in container: '
            'OCI runtime exec failed: exec: "trainwatch": executable file not found in $PATH: unknown')
    line = not_installed("llm-worker-0", said, "trainwatch")
    assert line.startswith("trainwatch is not installed in pod llm-worker-0's image")
    assert "--remote-trainwatch" in line
    assert not_installed("p", "trainwatch: no training job on p", "trainwatch") is None
