"""The pods of a job on Kubernetes, as the API server reports them (``kubectl get pods -o json``).

Every pod of the selector, whatever its phase: a running one is a node of the job (an agent is
started in it with ``kubectl exec``); one that is not says why in Kubernetes' own words (the
scheduler's condition, its container's state), with the ranks it would run: its node rank (the
Kubeflow PyTorchJob's ``PET_NODE_RANK``, an indexed Job's completion index, ``--node-rank`` on its
command line) times its ranks per node (``PET_NPROC_PER_NODE``, ``--nproc-per-node``).
"""

from __future__ import annotations

import json
import re
import shlex
from dataclasses import dataclass, field, replace
from datetime import datetime

from ..judge.exits import KUBERNETES
from ..read.processes.discover import option_value
from ..record import Record
from ..snapshot import ExitInfo, PodState

# ``--k8s KIND/NAME``: the label the job's controller puts on each of its pods.
SHORTHANDS = {
    "pytorchjob": "training.kubeflow.org/job-name",  # Kubeflow training-operator v1
    "pytorchjobs": "training.kubeflow.org/job-name",
    "jobset": "jobset.sigs.k8s.io/jobset-name",
    "jobsets": "jobset.sigs.k8s.io/jobset-name",
    "trainjob": "jobset.sigs.k8s.io/jobset-name",  # Kubeflow Trainer v2 runs a TrainJob as a JobSet of its name
    "trainjobs": "jobset.sigs.k8s.io/jobset-name",
    "job": "batch.kubernetes.io/job-name",
    "jobs": "batch.kubernetes.io/job-name",
}
# The container that runs the job, where a pod has several (Kubeflow's default name).
JOB_CONTAINERS = ("pytorch", "trainer", "node")
COMPLETION_INDEX = "batch.kubernetes.io/job-completion-index"


def selector_for(text: str) -> str:
    """The label selector ``--k8s`` names: ``pytorchjob/llm`` (and ``jobset/``, ``trainjob/``,
    ``job/``) is the label its controller puts on the job's pods; anything else is a selector."""
    kind, slash, name = text.partition("/")
    label = SHORTHANDS.get(kind.strip().lower())
    if slash and label and name and "=" not in text:
        return f"{label}={name.strip()}"
    return text


@dataclass(frozen=True, repr=False)
class Pod(Record):
    """One pod as listed: its state (the snapshot's record) and what reaching it needs."""

    state: PodState
    uid: str = ""
    container: str | None = None  # the container the job runs in
    running: bool = False  # that container runs now: an agent can be started in it
    env: dict[str, str] = field(default_factory=dict, hash=False)  # its literal environment values
    world_size: int | None = None
    nproc: int | None = None
    host_network: bool = False

    @property
    def name(self) -> str:
        return self.state.name


def parse_pods(text: str, container: str | None = None) -> list[Pod]:
    """Pods from ``kubectl get pods -o json`` (a List, or one Pod), ranks laid out over all of them.
    Raises ValueError when it is not JSON."""
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(f"kubectl did not print JSON: {exc}") from exc
    items = data.get("items", [data] if data.get("kind") == "Pod" else []) if isinstance(data, dict) else []
    pods = [_pod(item, container) for item in items if isinstance(item, dict) and item.get("metadata", {}).get("name")]
    return lay_out(pods)


def _pod(item: dict, wanted: str | None) -> Pod:
    meta, spec, status = item.get("metadata") or {}, item.get("spec") or {}, item.get("status") or {}
    containers = spec.get("containers") or []
    names = [c.get("name") for c in containers]
    name = wanted if wanted in names else next((n for n in JOB_CONTAINERS if n in names), names[0] if names else None)
    declared = next((c for c in containers if c.get("name") == name), {})
    env = {e["name"]: str(e["value"]) for e in declared.get("env") or () if "name" in e and "value" in e}
    argv = [_expand(a, env) for a in (declared.get("command") or []) + (declared.get("args") or [])]
    argv = [word for a in argv for word in (shlex.split(a) if " " in a else [a])]  # `sh -c "torchrun …"`
    labels, annotations = meta.get("labels") or {}, meta.get("annotations") or {}
    statuses = {s.get("name"): s for s in status.get("containerStatuses") or ()}
    own = statuses.get(name) or {}
    current, last = own.get("state") or {}, own.get("lastState") or {}
    pod_phase = status.get("phase") or "Unknown"
    running = pod_phase == "Running" and "running" in current and not meta.get("deletionTimestamp")
    reason, message, code, ended = _why(meta, status, current, last, pod_phase)
    nproc = _int(env.get("PET_NPROC_PER_NODE")) or _int(option_value(argv, "--nproc-per-node", "--nproc_per_node"))
    nnodes = _int((env.get("PET_NNODES") or "").split(":")[-1]) or _int(
        (option_value(argv, "--nnodes") or "").split(":")[-1])
    world = _int(env.get("WORLD_SIZE")) or (nnodes * nproc if nnodes and nproc else None)
    state = PodState(
        name=meta["name"], pod_phase=pod_phase, node=spec.get("nodeName"),
        node_rank=_node_rank(env, argv, labels, annotations), reason=reason, message=message, exit_code=code,
        restarts=int(own.get("restartCount") or 0), ended_at=ended)
    return Pod(state=state, uid=meta.get("uid") or "", container=name, running=running, env=env, world_size=world,
               nproc=nproc, host_network=bool(spec.get("hostNetwork")))


def _why(meta: dict, status: dict, current: dict, last: dict,
         pod_phase: str) -> tuple[str | None, str | None, int | None, float | None]:
    """(reason, message, exit code, when it ended) of a pod that does not run its job: the
    scheduler's condition, its container's waiting or terminated state, the pod's own reason."""
    if meta.get("deletionTimestamp"):
        return "Terminating", None, None, None
    ended = current.get("terminated") or last.get("terminated") or {}
    code = ended.get("exitCode") if isinstance(ended.get("exitCode"), int) else None
    when = _time(ended.get("finishedAt"))
    if status.get("reason"):  # Evicted, NodeLost, DeadlineExceeded: the pod's own
        return status["reason"], status.get("message"), code, when
    waiting = current.get("waiting") or {}
    if waiting.get("reason") == "CrashLoopBackOff":  # how it last ended is the why
        return "CrashLoopBackOff", ended.get("reason") or None, code, when
    if pod_phase == "Failed" and ended:
        return ended.get("reason") or "Error", ended.get("message") or None, code, when
    if waiting.get("reason"):  # ImagePullBackOff, ErrImagePull, ContainerCreating, CreateContainerConfigError
        return waiting["reason"], waiting.get("message"), code, when
    if pod_phase == "Pending":
        for cond in status.get("conditions") or ():
            if cond.get("type") == "PodScheduled" and cond.get("status") == "False":
                return cond.get("reason") or "Unschedulable", cond.get("message"), None, None
        return None, None, None, None
    if "terminated" in current:
        return ended.get("reason") or "Completed", None, code, when
    return None, None, code, when


def lay_out(pods: list[Pod]) -> list[Pod]:
    """Each pod with the global ranks it runs (its node rank times ranks per node, where both are
    known: a pod that says nothing of its ranks per node takes the others' number) and its words."""
    nproc = next((p.nproc for p in pods if p.nproc), None)
    out = []
    for pod in pods:
        per = pod.nproc or nproc
        node = pod.state.node_rank
        ranks = tuple(range(node * per, (node + 1) * per)) if node is not None and per else ()
        state = replace(pod.state, ranks=ranks)
        out.append(replace(pod, state=replace(state, words=words(state)), nproc=per))
    return out


def words(pod: PodState) -> str:
    """The pod's state in one line, in Kubernetes' words: ``llm-worker-1 is Pending: 0/8 nodes are
    available: 8 Insufficient nvidia.com/gpu.``; ``llm-worker-0 is in CrashLoopBackOff: OOMKilled,
    exit 137, restarted 3 times``."""
    restarts = f", restarted {pod.restarts} time{'s' if pod.restarts != 1 else ''}" if pod.restarts else ""
    exit_words = f"exit {pod.exit_code}" if pod.exit_code is not None else ""
    if pod.reason == "CrashLoopBackOff":
        why = ", ".join(w for w in (pod.message, exit_words) if w)
        return f"{pod.name} is in CrashLoopBackOff" + (f": {why}" if why else "") + restarts
    if pod.reason == "Terminating":
        return f"{pod.name} is Terminating (being deleted)"
    if pod.pod_phase == "Pending":
        why = ": ".join(w for w in (pod.reason if pod.reason not in ("Unschedulable",) or not pod.message else None,
                                    pod.message) if w)
        return f"{pod.name} is Pending" + (f": {why}" if why else "") + restarts
    if pod.pod_phase == "Failed":
        why = ", ".join(w for w in (pod.reason, pod.message, exit_words) if w)
        return f"{pod.name} {'was ' + pod.reason if pod.reason == 'Evicted' else 'Failed'}" + (
            f": {pod.message}" if pod.reason == "Evicted" and pod.message else f": {why}" if why else "") + restarts
    if pod.pod_phase == "Succeeded":
        return f"{pod.name} Succeeded" + (f" ({exit_words})" if exit_words else "")
    if pod.pod_phase == "Unknown":
        return f"{pod.name}'s state is Unknown (its node stopped reporting)"
    if pod.reason:
        why = ", ".join(w for w in (pod.message, exit_words) if w)
        return f"{pod.name} is {pod.pod_phase}, its container {pod.reason}" + (f": {why}" if why else "") + restarts
    return f"{pod.name} is {pod.pod_phase}" + restarts


def runs(pod: PodState) -> bool:
    """Its job's container runs: an agent can be started in it, and its ranks are read there."""
    return pod.pod_phase == "Running" and pod.reason is None


def dead(pod: PodState) -> bool:
    """The pod's job ended there (its container terminated, crash-looping, the pod failed or was
    evicted), as opposed to never started (Pending) or unreachable (Unknown)."""
    return pod.reason == "CrashLoopBackOff" or pod.pod_phase in ("Failed", "Succeeded") or (
        pod.exit_code is not None and pod.pod_phase != "Pending")


def exit_of(pod: PodState) -> ExitInfo:
    """How the pod's ranks ended, as Kubernetes says (its words are the message)."""
    code = pod.exit_code if pod.exit_code is not None else (0 if pod.pod_phase == "Succeeded" else None)
    return ExitInfo(code=code, at=pod.ended_at, reason=(pod.message if pod.reason == "CrashLoopBackOff" else pod.reason)
                    or ("Failed" if pod.pod_phase == "Failed" else None),
                    message=pod.words, source=KUBERNETES)


# -- what kubectl said -----------------------------------------------------------------------
# Kubernetes' Forbidden: `pods is forbidden: User "system:serviceaccount:ml:default" cannot list
# resource "pods" in API group "" in the namespace "ml"`; exec: `cannot create resource "pods/exec"`.
FORBIDDEN = re.compile(r'[Uu]ser "(?P<user>[^"]*)" cannot (?P<verb>\w+) resource "(?P<resource>[^"]+)"'
                       r'(?: in API group "(?P<group>[^"]*)")?(?: in the namespace "(?P<ns>[^"]*)")?')


def forbidden(text: str) -> str | None:
    """What kubectl's Forbidden says is missing, in one line with the Role rule that grants it; None
    for any other error."""
    found = FORBIDDEN.search(text or "")
    if found is None:
        return None
    verb, resource, user, ns = found["verb"], found["resource"], found["user"], found["ns"]
    where = f" in namespace {ns}" if ns else ""
    return (f"{user or 'this user'} may not {verb} {resource}{where} (grant it with a Role rule: apiGroups: [\"\"], "
            f"resources: [\"{resource}\"], verbs: [\"{verb}\"]; docs/multi-node.md has the whole Role)")


NO_TRAINWATCH = ("executable file not found", "not found in $path", "no such file or directory", "command not found")


def not_installed(pod: str, text: str, trainwatch: str) -> str | None:
    """kubectl exec could not start trainwatch in the pod's image: one line saying what to do."""
    low = (text or "").lower()
    if not any(marker in low for marker in NO_TRAINWATCH) or "trainwatch:" in low:
        return None
    return (f"trainwatch is not installed in pod {pod}'s image ({trainwatch!r} not found there): add `pip install "
            "trainwatch` to the image, or put it on a volume the pod mounts and pass --remote-trainwatch PATH")


# -- small parsers ------------------------------------------------------------------------------
_VAR = re.compile(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)")


def _expand(text: str, env: dict[str, str]) -> str:
    """Kubernetes' own ``$(VAR)`` expansion of a command's arguments, from the literal env."""
    return _VAR.sub(lambda m: env.get(m.group(1), m.group(0)), str(text))


def _node_rank(env: dict[str, str], argv: list[str], labels: dict, annotations: dict) -> int | None:
    """The pod's node rank: torchrun's PET_NODE_RANK, its --node-rank, an indexed Job's completion
    index, a Kubeflow PyTorchJob's replica (master 0, worker i is i + 1)."""
    for value in (env.get("PET_NODE_RANK"), option_value(argv, "--node-rank", "--node_rank")):
        if _int(value) is not None:
            return _int(value)
    index = annotations.get(COMPLETION_INDEX) or labels.get(COMPLETION_INDEX)
    if _int(index) is not None and not _int(labels.get("jobset.sigs.k8s.io/job-index")):
        return _int(index)
    kind = labels.get("training.kubeflow.org/replica-type") or labels.get("replica-type")
    replica = _int(labels.get("training.kubeflow.org/replica-index") or labels.get("replica-index"))
    if kind and replica is not None:
        return replica if kind.lower() == "master" else replica + 1 if kind.lower() == "worker" else None
    return None


def _int(value: object) -> int | None:
    try:
        return int(str(value)) if value not in (None, "") else None
    except ValueError:
        return None


def _time(text: object) -> float | None:
    """An RFC 3339 time (``2026-11-28T08:12:03Z``) as unix time."""
    if not isinstance(text, str) or not text:
        return None
    try:
        return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None
