"""Kubernetes from where people stand: a login box with nothing but kubectl, inside a pod, the node's host.

The real ``kubectl`` of this machine talks to the API server stand-in of tests/k8s_api.py; pods are
PID/mount/UTS namespaces (tests/k8s_pods.py) running real torchrun gloo jobs with a Kubeflow
PyTorchJob's labels and environment, hostNetwork (their host name is their node's: both pods of the
straggler job are on ``gpu-node-1``, and their ranks have the same PIDs there). The login box has its
own PID and network namespaces: none of the job's processes or sockets is visible from it.
"""

from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
import time
from pathlib import Path

import pytest

import k8s_pods
from k8s_pods import NO_EXEC, NOBODY, VIEWER
from real_jobs import default_signals, free_port, rank_stuck_at, wait_until

pytestmark = [pytest.mark.job, pytest.mark.slow]

JOB = "pytorchjob/llm"  # the straggler: 2 pods x 2 ranks, rank 3 (in llm-worker-0) stuck in its own work
TRAINWATCH = "trainwatch"  # on the login box's and the pods' PATH (this venv), as a user installs it


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    reason = k8s_pods.unavailable_reason()
    if reason:
        if k8s_pods.in_ci():
            pytest.fail(f"CI: {reason}")
        pytest.skip(reason)
    with k8s_pods.Cluster(tmp_path_factory.mktemp("k8s")).start(login_box=True) as made:
        yield made


def start_job(cluster, job: str, scenario: str, nodes: list[str], nproc: int, deadline: float = 200,
              pending: dict | None = None, nnodes: int | None = None) -> Path:
    """A PyTorchJob's pods: ``{job}-master-0`` and ``{job}-worker-i``, one on each of ``nodes``; a
    pod whose node is None is only declared (``pending``: what the API server says of it)."""
    port, work = free_port(), cluster.dir / job
    names = [f"{job}-master-0"] + [f"{job}-worker-{i}" for i in range(len(nodes) - 1)]
    for index, (name, node) in enumerate(zip(names, nodes)):
        env = cluster.pytorchjob_env(job, index, nnodes or len(nodes), nproc, port)
        replica = ("master", 0) if index == 0 else ("worker", index - 1)
        command = k8s_pods.planted_command(work, scenario, deadline) if node else None
        cluster.add_pod(name, job=job, replica=replica, node=node or "", env=env, command=command, workdir=work,
                        status=None if node else pending)
    return work


@pytest.fixture(scope="module")
def straggler(cluster):
    work = start_job(cluster, "llm", "straggler", ["gpu-node-1", "gpu-node-1"], nproc=2)
    wait_until(lambda: all(cluster.log(p).count("scenario straggler") >= 2 for p in ("llm-master-0", "llm-worker-0")),
               90, "the four ranks to start")
    wait_until(lambda: rank_stuck_at(work / "train.py", "# stuck in its own work"), 60,
               "rank 3 to reach its planted sleep")
    yield cluster


def on_login(cluster, *args: str, token: str = VIEWER, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run(cluster.on_login([TRAINWATCH, *args], token=token), capture_output=True, text=True,
                          timeout=timeout)


def in_pod(cluster, pod: str, shell: str, timeout: float = 120) -> subprocess.CompletedProcess:
    """A command run in ``pod`` by ``kubectl exec`` (as the pod's own service account would run it)."""
    return subprocess.run(cluster.exec_argv(pod, ["sh", "-c", shell]), capture_output=True, text=True,
                          timeout=timeout)


def snapshot_in_master_as(cluster, token: str) -> subprocess.CompletedProcess:
    """``snapshot <torchrun's PID> --k8s`` in llm-master-0, its kubectl the service account of ``token``."""
    cluster.change("llm-master-0", _env=cluster.kube_env(token))
    try:
        return in_pod(cluster, "llm-master-0",
                      f"{TRAINWATCH} snapshot $(pgrep -f 'torch[.]distributed[.]run') --k8s {JOB} --json")
    finally:
        cluster.change("llm-master-0", _env=cluster.kube_env(VIEWER))


def judged(done: subprocess.CompletedProcess) -> dict:
    assert done.stdout.strip(), f"no output (exit {done.returncode}):\n{done.stderr}"
    return json.loads(done.stdout)


def test_the_login_box_sees_none_of_the_job(straggler):
    """What makes it a login box: no process of the job and no socket of its store is here."""
    done = subprocess.run(straggler.on_login(["sh", "-c", "pgrep -f 'trai[n].py' | wc -l; ip -o addr"]),
                          capture_output=True, text=True, timeout=30)
    assert done.stdout.splitlines()[0].strip() == "0", done.stdout  # no rank, no launcher
    assert "10.214.0.2" in done.stdout and "127.0.0.1" in done.stdout
    done = on_login(straggler, "snapshot", "--match", f"llm-master-0:{_port(straggler)}")
    assert done.returncode == 4 and "no job with master" in done.stderr


def test_from_a_login_box_the_straggler_is_named_in_its_pod(straggler):
    data = judged(on_login(straggler, "snapshot", "--k8s", JOB, "--json"))
    assert data["verdict"]["kind"] == "straggler" and data["verdict"]["culprits"] == [3], data["verdict"]
    # one rank each, known by its pod: the two pods share a host name and their ranks' PIDs
    assert [(r["rank"], r["host"]) for r in data["ranks"]] == [
        (0, "llm-master-0"), (1, "llm-master-0"), (2, "llm-worker-0"), (3, "llm-worker-0")]
    assert sorted(r["pid"] for r in data["ranks"]) in ([6, 7, 7, 8], [7, 7, 8, 8])  # each pod's own PIDs
    assert [(p["name"], p["pod_phase"], p["ranks"]) for p in data["job"]["pods"]] == [
        ("llm-master-0", "Running", [0, 1]), ("llm-worker-0", "Running", [2, 3])]
    assert not [h for h in data["hosts"] if h["error"]]
    text = on_login(straggler, "snapshot", "--k8s", JOB, "--window", "1")
    assert text.returncode == 0, text.stderr
    assert text.stdout.startswith("torchrun in pods llm-master-0, llm-worker-0  world size 4"), text.stdout


def test_from_inside_the_master_pod_its_own_pod_is_read_once(straggler):
    done = in_pod(straggler, "llm-master-0", f"{TRAINWATCH} snapshot --k8s {JOB} --json")
    data = judged(done)
    assert data["verdict"]["kind"] == "straggler" and data["verdict"]["culprits"] == [3], data["verdict"]
    assert [r["host"] for r in data["ranks"]] == ["llm-master-0"] * 2 + ["llm-worker-0"] * 2
    assert data["job"]["nnodes"] == 2
    # with the PID, as one runs it beside the job: this pod read here, the other through its agent
    done = in_pod(straggler, "llm-master-0",
                  f"{TRAINWATCH} snapshot $(pgrep -f 'torch[.]distributed[.]run') --k8s {JOB} --json")
    data = judged(done)
    assert done.returncode == 0, done.stderr
    assert data["verdict"]["culprits"] == [3], data["verdict"]
    assert [r["host"] for r in data["ranks"]] == ["llm-master-0"] * 2 + ["llm-worker-0"] * 2
    assert any("llm-master-0 is gpu-node-1" in n and "read once" in n for n in data["notes"]), data["notes"]
    assert not any("listed twice" in n for n in data["notes"])


def test_without_the_exec_right_the_unread_pod_is_named_never_a_hang(straggler):
    done = snapshot_in_master_as(straggler, NO_EXEC)
    data = judged(done)
    assert done.returncode == 9  # partial: a node could not be read
    assert data["verdict"]["kind"] == "straggler" and data["verdict"]["culprits"] == [2, 3], data["verdict"]
    assert "no local culprit" not in data["verdict"]["summary"]
    assert "ranks 2-3 could not be read" in data["verdict"]["summary"]
    assert [(r["rank"], r["state"], r["host"]) for r in data["ranks"]][:2] == [
        (0, "stuck", "llm-master-0"), (1, "stuck", "llm-master-0")]  # its own pod, read here: not unread
    assert data["verdict"]["summary"].endswith("; node not read: llm-worker-0"), data["verdict"]
    unread = next(r for r in data["ranks"] if r["rank"] == 3)
    assert unread["host"] == "llm-worker-0" and "may not create pods/exec in namespace ml" in unread["detail"]
    assert 'resources: ["pods/exec"], verbs: ["create"]' in unread["detail"]


def test_without_the_list_right_the_verb_and_its_rule_are_said(straggler):
    done = on_login(straggler, "snapshot", "--k8s", JOB, token=NOBODY)
    assert done.returncode == 5, done
    assert done.stderr.strip().splitlines()[0] == (
        "trainwatch: kubectl get pods -l training.kubeflow.org/job-name=llm: system:serviceaccount:ml:default may not "
        'list pods in namespace ml (grant it with a Role rule: apiGroups: [""], resources: ["pods"], verbs: ["list"]; '
        "docs/multi-node.md has the whole Role)")
    # inside the pod, with its PID: the local ranks are still judged, the rest said unread
    done = snapshot_in_master_as(straggler, NOBODY)
    data = judged(done)
    assert done.returncode == 9
    assert data["verdict"]["culprits"] == [2, 3] and "could not be read" in data["verdict"]["summary"]
    assert any("pods not listed" in n and "may not list pods" in n for n in data["notes"]), data["notes"]


def test_a_pod_whose_image_has_no_trainwatch_says_what_to_do(straggler):
    path = straggler.pod("llm-worker-0")["_path"]
    straggler.change("llm-worker-0", _path=k8s_pods.SYSTEM_PATH)
    try:
        done = on_login(straggler, "snapshot", "--k8s", JOB, "--json")
    finally:
        straggler.change("llm-worker-0", _path=path)
    data = judged(done)
    assert done.returncode == 9
    error = next(h["error"] for h in data["hosts"] if h["name"] == "llm-worker-0")
    assert error.startswith("trainwatch is not installed in pod llm-worker-0's image"), error
    assert "--remote-trainwatch" in error
    assert data["verdict"]["kind"] == "straggler" and data["verdict"]["culprits"] == [2, 3]


def test_dump_from_a_login_box_gathers_every_pods_bundle(straggler):
    out = straggler.dir / "dumps"
    done = on_login(straggler, "dump", "--k8s", JOB, "--window", "3", "--out", str(out), "--no-native")
    assert done.returncode == 0, done.stderr
    bundle = Path(done.stdout.strip().splitlines()[-1])
    summary = (bundle / "summary.md").read_text()
    assert "**straggler**" in summary and "Culprit rank(s): 3" in summary, summary
    assert "## Pods (Kubernetes)" in summary and "- llm-worker-0 is Running (ranks 2-3) on node gpu-node-1" in summary
    for pod in ("llm-master-0", "llm-worker-0"):
        assert (bundle / "hosts" / pod / "summary.md").is_file(), sorted(p.name for p in bundle.rglob("*"))
    assert not (bundle / "ranks").exists()  # no rank runs on the login box: none is read there


def test_watch_from_a_login_box_bundles_and_leaves_nothing_in_the_pods(straggler):
    out = straggler.dir / "watch"
    proc = subprocess.Popen(straggler.on_login([TRAINWATCH, "watch", "--k8s", JOB, "--hang-after", "2",
                                                "--interval", "2", "--out", str(out)], token=VIEWER),
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True,
                            preexec_fn=default_signals)
    lines: list[str] = []
    try:
        deadline = time.monotonic() + 90
        while not any(" bundle " in line for line in lines):
            line = proc.stdout.readline()
            assert line or proc.poll() is None, "".join(lines)
            lines.append(line)
            assert time.monotonic() < deadline, "".join(lines)
        verdict = next(line for line in lines if " verdict " in line)
        assert "verdict straggler: rank 3 is in sleep" in verdict, lines
        bundle = Path(next(line for line in lines if " bundle " in line).split(" bundle ", 1)[1].strip())
        wait_until(lambda: (bundle / "hosts" / "llm-worker-0" / "summary.md").exists(), 60, "the pods' bundles")
    finally:
        os.killpg(proc.pid, signal.SIGINT)
        proc.wait(timeout=30)
    assert (bundle / "hosts" / "llm-master-0" / "summary.md").exists()
    wait_until(lambda: not _agents(straggler), 20, "the agents in the pods to stop")


def test_attach_from_a_login_box_in_tmux(straggler, tmp_path):
    socket = f"tw-k8s-{os.getpid()}"
    tmux = ["tmux", "-L", socket, "-f", "/dev/null"]
    command = shlex.join(straggler.on_login(["env", "TERM=xterm-256color", TRAINWATCH, "attach", "--k8s", JOB,
                                             "--out", str(tmp_path)]))
    subprocess.run([*tmux, "new-session", "-d", "-s", "tw", "-x", "120", "-y", "40", command], check=True,
                   timeout=20)
    screen = ""
    try:
        deadline = time.monotonic() + 60
        while not ("STRAGGLER" in screen and "▶3" in screen and "llm-worker-0" in screen):
            assert time.monotonic() < deadline, f"no straggler in the pods' view:\n{screen}"
            time.sleep(1.0)
            screen = subprocess.run([*tmux, "capture-pane", "-p", "-t", "tw"], capture_output=True, text=True,
                                    timeout=20).stdout
        assert "torchrun in pods llm-master-0, llm-worker-0" in screen
        subprocess.run([*tmux, "send-keys", "-t", "tw", "q"], timeout=20)
        wait_until(lambda: subprocess.run([*tmux, "has-session", "-t", "tw"], capture_output=True,
                                          timeout=20).returncode != 0, 20, "attach to quit")
    finally:
        subprocess.run([*tmux, "kill-server"], capture_output=True, timeout=20)
    wait_until(lambda: not _agents(straggler), 20, "the agents in the pods to stop")
    assert "scenario straggler" in straggler.log("llm-worker-0")  # the job runs on


def test_from_the_nodes_host_each_rank_shows_its_pid_in_the_pod(straggler):
    torchrun = next(int(p) for p in subprocess.run(["pgrep", "-f", "torch.distributed.run .*/llm/train.py"],
                                                   capture_output=True, text=True).stdout.split()
                    if _in_pod(int(p)))
    done = subprocess.run([str(Path(k8s_pods.VENV_BIN) / "trainwatch"), "snapshot", str(torchrun), "--json"],
                          capture_output=True, text=True, timeout=120)
    data = judged(done)
    assert [r["state"] for r in data["ranks"]] == ["stuck", "stuck"], data["ranks"]  # alive, never "exited"
    assert all(r["container_pid"] in (6, 7, 8) for r in data["ranks"]), data["ranks"]


# -- a job that never formed, in the scheduler's words -----------------------------------------------

@pytest.fixture(scope="module")
def never_formed(cluster):
    """A PyTorchJob of 3 nodes x 2 ranks: its master and first worker run (their torchruns wait in the
    static rendezvous for node 2), its second worker was never scheduled."""
    start_job(cluster, "ft", "healthy", ["gpu-node-1", "gpu-node-2", None], nproc=2,
              pending=k8s_pods.pending_status())
    wait_until(lambda: _listening(cluster, "ft-master-0"), 60, "ft's store to listen")
    yield cluster


@pytest.mark.parametrize("where", ["login box", "master pod"])
def test_a_pending_pod_is_named_with_why(never_formed, where):
    if where == "login box":
        done = on_login(never_formed, "snapshot", "--k8s", "pytorchjob/ft", "--window", "1", "--json")
    else:  # the bug: "the job has neither MASTER_ADDR:MASTER_PORT nor a job id" though torchrun's PET_* say
        done = in_pod(never_formed, "ft-master-0",
                      f"{TRAINWATCH} snapshot $(pgrep -f 'torch[.]distributed[.]run') --k8s pytorchjob/ft --window 1 --json")
    data = judged(done)
    assert done.returncode == 0, done.stderr
    assert data["verdict"]["kind"] == "rendezvous" and data["verdict"]["culprits"] == [4, 5], data["verdict"]
    assert data["verdict"]["summary"].startswith(
        "ranks 4-5 never joined: ft-worker-1 is Pending: 0/8 nodes are available: 8 Insufficient nvidia.com/gpu.")
    held = [r for r in data["ranks"] if r["rank"] in (4, 5)]
    assert [(r["state"], r["host"]) for r in held] == [("missing", "ft-worker-1")] * 2
    assert [p["pod_phase"] for p in data["job"]["pods"]] == ["Running", "Running", "Pending"]


def test_a_pod_that_cannot_pull_its_image_then_one_that_keeps_dying(never_formed):
    never_formed.set_status("ft-worker-1", k8s_pods.image_pull_status())
    data = judged(on_login(never_formed, "snapshot", "--k8s", "pytorchjob/ft", "--window", "1", "--json"))
    assert data["verdict"]["kind"] == "rendezvous" and data["verdict"]["culprits"] == [4, 5]
    assert 'ft-worker-1 is Pending: ImagePullBackOff: Back-off pulling image "registry.example/llm:v2"' in \
        data["verdict"]["summary"]
    never_formed.set_status("ft-worker-1", k8s_pods.crash_loop_status("gpu-node-3"))
    done = on_login(never_formed, "snapshot", "--k8s", "pytorchjob/ft", "--window", "1")
    assert done.returncode == 0, done.stderr
    assert " CRASHED  ranks 4-5 died: ft-worker-1 is in CrashLoopBackOff: OOMKilled, exit 137, restarted 3 times" \
        in " ".join(done.stdout.split("\n")[1:3]).replace("\n", " "), done.stdout


def test_a_pending_pod_that_starts_gets_its_agent_and_the_job_forms(never_formed):
    """A live view lists the pods again: the pod the scheduler finally places gets its agent, the
    job forms, and the verdict follows (this starts ft's last pod: the module's last use of it)."""
    never_formed.set_status("ft-worker-1", k8s_pods.pending_status())
    proc = subprocess.Popen(never_formed.on_login([TRAINWATCH, "watch", "--k8s", "pytorchjob/ft", "--json",
                                                   "--interval", "2", "--hang-after", "600",
                                                   "--out", str(never_formed.dir / "ft-watch")]),
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True,
                            preexec_fn=default_signals)
    events: list[dict] = []

    def until(verdict: str, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while not any(e.get("event") == "verdict" and e.get("verdict") == verdict for e in events):
            line = proc.stdout.readline()
            assert line or proc.poll() is None, events
            if line.startswith("{"):
                events.append(json.loads(line))
            assert time.monotonic() < deadline, events

    try:
        until("rendezvous", 60)
        port = _port(never_formed, "ft-master-0")
        work = never_formed.dir / "ft"
        never_formed.add_pod("ft-worker-1", job="ft", replica=("worker", 1), node="gpu-node-3",
                             env=never_formed.pytorchjob_env("ft", 2, 3, 2, int(port)), workdir=work,
                             command=k8s_pods.planted_command(work, "healthy", 200))
        until("healthy", 120)  # the job formed: its ranks train
        space = os.readlink(f"/proc/{never_formed.pods['ft-worker-1'].init}/ns/pid")
        wait_until(lambda: any(_pid_namespace(pid) == space for pid in _agents(never_formed)), 60,
                   "the watch's agent in the pod that started")
    finally:
        os.killpg(proc.pid, signal.SIGINT)
        proc.wait(timeout=30)
    verdicts = [e["verdict"] for e in events if e["event"] == "verdict"]
    assert verdicts[0] == "rendezvous" and "healthy" in verdicts, events  # (its new ranks' first look: unknown)


def test_a_healthy_job_in_pods_is_healthy(cluster):
    start_job(cluster, "ok", "healthy", ["gpu-node-4", "gpu-node-5"], nproc=1, deadline=120)
    wait_until(lambda: all(cluster.log(p).count("scenario healthy") >= 1 for p in ("ok-master-0", "ok-worker-0")),
               90, "the healthy job's ranks")
    data = judged(on_login(cluster, "snapshot", "--k8s", "pytorchjob/ok", "--window", "2", "--json"))
    assert data["verdict"]["kind"] == "healthy" and "2 ranks making progress" in data["verdict"]["summary"]
    data = judged(in_pod(cluster, "ok-worker-0", f"{TRAINWATCH} snapshot --k8s pytorchjob/ok --window 2 --json"))
    assert data["verdict"]["kind"] == "healthy", data["verdict"]
    assert [r["host"] for r in data["ranks"]] == ["ok-master-0", "ok-worker-0"]


def _port(cluster, pod: str = "llm-master-0") -> str:
    return next(e["value"] for e in cluster.pod(pod)["spec"]["containers"][0]["env"] if e["name"] == "MASTER_PORT")


def _agents(cluster) -> list[str]:
    """trainwatch agents still running in any pod."""
    done = subprocess.run(["pgrep", "-f", "trainwatch agent"], capture_output=True, text=True, timeout=10)
    return done.stdout.split()


def _pid_namespace(pid: str) -> str | None:
    try:
        return os.readlink(f"/proc/{pid}/ns/pid")
    except OSError:
        return None


def _in_pod(pid: int) -> bool:
    text = Path(f"/proc/{pid}/status").read_text()
    return len(next(line for line in text.splitlines() if line.startswith("NSpid:")).split()) > 2


def _listening(cluster, pod: str) -> bool:
    port = next(e["value"] for e in cluster.pod(pod)["spec"]["containers"][0]["env"] if e["name"] == "MASTER_PORT")
    done = subprocess.run(["ss", "-ltn", f"sport = :{port}"], capture_output=True, text=True, timeout=10)
    return f":{port}" in done.stdout
