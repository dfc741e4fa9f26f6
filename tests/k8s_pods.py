"""Test helpers: a Kubernetes "cluster" on this machine for the real ``kubectl``.

No Kubernetes server can run here. ``Cluster`` starts the API server stand-in of tests/k8s_api.py
(TLS on loopback, and on a veth to the login box) and makes pods the way a node's kubelet does:
each pod its own PID, mount and UTS namespace (``unshare``), its host name its node's (the pods are
``hostNetwork``, as GPU training pods usually are), an /etc/hosts of its own naming the job's master
service, and its container started in those namespaces with the environment a Kubeflow PyTorchJob
gives it (``MASTER_ADDR``, ``WORLD_SIZE``, ``RANK``, ``PET_NPROC_PER_NODE``, ``PET_NODE_RANK``, …).
A pod that is Pending, crash-looping or evicted is only what the API server says of it: no process.
The login box is a namespace of its own (PID, network, mount, UTS) that reaches the API server over
a veth and nothing else: no process of the job is visible from it, no socket of the job reachable.
``stop()`` kills every namespace's first process (all in it die with it), the API server, the veth.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

from k8s_api import make_certs
from real_jobs import PLANTED, _elastic_dirs, default_signals, free_port, kill_tree

HERE = Path(__file__).resolve().parent
VENV_BIN = str(Path(sys.executable).parent)
SYSTEM_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
LOGIN_ADDR, API_ADDR = "10.214.0.2", "10.214.0.1"  # the login box and the API server, on their veth
JOB_LABEL = "training.kubeflow.org/job-name"
ADMIN, VIEWER, NO_EXEC, NOBODY = "admin-token", "viewer-token", "no-exec-token", "sa-default-token"
USERS = {
    ADMIN: {"name": "kubernetes-admin", "allow": [["*", "*"]]},
    # what docs/multi-node.md's Role grants: list and get pods, create pods/exec
    VIEWER: {"name": "system:serviceaccount:ml:trainwatch",
             "allow": [["list", "pods"], ["get", "pods"], ["create", "pods/exec"]]},
    NO_EXEC: {"name": "system:serviceaccount:ml:reader", "allow": [["list", "pods"], ["get", "pods"]]},
    NOBODY: {"name": "system:serviceaccount:ml:default", "allow": []},
}


def unavailable_reason() -> str | None:
    missing = [t for t in ("unshare", "nsenter", "ip", "kubectl", "openssl") if shutil.which(t) is None]
    if missing:
        return f"needs {', '.join(missing)}"
    if os.geteuid() != 0:
        return "the Kubernetes tests run as root (namespaces, veth)"
    return None


def in_ci() -> bool:
    return os.environ.get("CI", "").lower() in ("1", "true", "yes")


def _run(argv: list[str], timeout: float = 20) -> str:
    done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} failed ({done.returncode}): {done.stderr.strip()}")
    return done.stdout


class Namespace:
    """A process holding new namespaces (its first process a shell that reaps orphans, as init must)."""

    def __init__(self, kinds: list[str], hostname: str, setup: str = "") -> None:
        script = f"hostname {hostname}; {setup} sleep 100000 & wait"
        self.holder = subprocess.Popen(["unshare", *kinds, "--fork", "--mount-proc", "--kill-child",
                                        "sh", "-c", script], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                       stderr=subprocess.PIPE, start_new_session=True, preexec_fn=default_signals)
        self.init = self._wait_init()

    def _wait_init(self) -> int:
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline:
            children = Path(f"/proc/{self.holder.pid}/task/{self.holder.pid}/children")
            pids = children.read_text().split() if children.exists() else []
            if pids and Path(f"/proc/{pids[0]}/task/{pids[0]}/children").read_text().split():
                return int(pids[0])  # the shell, its sleep started: set up
            if self.holder.poll() is not None:
                raise RuntimeError(f"unshare failed: {self.holder.stderr.read().decode(errors='replace')}")
            time.sleep(0.05)
        raise TimeoutError("namespace did not come up")

    def enter(self, argv: list[str], env: dict[str, str], cwd: str = "/", net: bool = False) -> list[str]:
        flags = ["-m", "-u", "-p"] + (["-n"] if net else [])
        return ["nsenter", "-t", str(self.init), *flags, f"--wd={cwd}", "env", "-i",
                *(f"{k}={v}" for k, v in env.items()), *argv]

    def stop(self) -> None:
        """SIGKILL to the namespace's first process ends every process in its PID namespace at once
        (the kernel's rule for a namespace's init); unshare (--kill-child) goes with it."""
        if self.holder.poll() is None:
            try:
                os.kill(self.init, signal.SIGKILL)
            except ProcessLookupError:
                pass  # already gone
            try:
                self.holder.wait(timeout=10)
            except subprocess.TimeoutExpired:
                kill_tree(self.holder.pid)
                self.holder.wait(timeout=10)


class Cluster:
    """The API server stand-in, the pods of one job (namespace ``ml``) and a login box."""

    def __init__(self, workdir: Path, namespace: str = "ml") -> None:
        self.dir = Path(workdir)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.namespace = namespace
        self.port = free_port()
        self.state_file = self.dir / "state.json"
        self.state: dict = {"users": USERS, "pods": []}
        self.pods: dict[str, Namespace] = {}
        self.containers: dict[str, subprocess.Popen] = {}
        self.api: subprocess.Popen | None = None
        self.login: Namespace | None = None
        tag = f"{os.getpid() % 100000}"
        self.veth = (f"twk{tag}a", f"twk{tag}b")

    # -- the API server and who may talk to it ---------------------------------------------------
    def start(self, login_box: bool = False) -> Cluster:
        try:
            self.ca, cert, key = make_certs(self.dir / "certs", ["127.0.0.1", API_ADDR])
            if login_box:
                self._login_box()
            self._save()
            listen = ["--listen", f"127.0.0.1:{self.port}"] + (["--listen", f"{API_ADDR}:{self.port}"]
                                                                if login_box else [])
            with open(self.dir / "api.log", "wb") as log:
                self.api = subprocess.Popen([sys.executable, str(HERE / "k8s_api.py"), "--state", str(self.state_file),
                                             *listen, "--cert", str(cert), "--key", str(key)],
                                            stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                            start_new_session=True, preexec_fn=default_signals)
            deadline = time.monotonic() + 20
            while "serving" not in (self.dir / "api.log").read_text():
                assert self.api.poll() is None, (self.dir / "api.log").read_text()
                assert time.monotonic() < deadline, "the API server stand-in did not start"
                time.sleep(0.05)
        except BaseException:
            self.stop()
            raise
        return self

    def kubeconfig(self, token: str = ADMIN, server: str = "127.0.0.1", name: str | None = None) -> Path:
        """A kubeconfig for the user of ``token``, its context's namespace the job's."""
        path = self.dir / (name or f"kubeconfig-{token}-{server}")
        path.write_text(json.dumps({
            "apiVersion": "v1", "kind": "Config", "current-context": "test",
            "clusters": [{"name": "test", "cluster": {"server": f"https://{server}:{self.port}",
                                                      "certificate-authority": str(self.ca)}}],
            "users": [{"name": "u", "user": {"token": token}}],
            "contexts": [{"name": "test", "context": {"cluster": "test", "user": "u",
                                                       "namespace": self.namespace}}]}))
        return path

    def kube_env(self, token: str = ADMIN, server: str = "127.0.0.1") -> dict[str, str]:
        """What kubectl needs in an environment of its own (its discovery cache in the test's folder)."""
        cache = self.dir / f"kubecache-{token}"
        return {"KUBECONFIG": str(self.kubeconfig(token, server)), "KUBECACHEDIR": str(cache)}

    def _save(self) -> None:
        tmp = self.state_file.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.state))
        os.replace(tmp, self.state_file)

    def _login_box(self) -> None:
        self.login = Namespace(["--pid", "--net", "--mount", "--uts"], "login-0", "ip link set lo up;")
        a, b = self.veth
        _run(["ip", "link", "add", a, "type", "veth", "peer", "name", b])
        _run(["ip", "addr", "add", f"{API_ADDR}/30", "dev", a])
        _run(["ip", "link", "set", a, "up"])
        _run(["ip", "link", "set", b, "netns", str(self.login.init)])
        for argv in (["ip", "link", "set", b, "name", "eth0"], ["ip", "addr", "add", f"{LOGIN_ADDR}/30", "dev", "eth0"],
                     ["ip", "link", "set", "eth0", "up"]):
            _run(self.login.enter(argv, {"PATH": SYSTEM_PATH}, net=True))

    def on_login(self, argv: list[str], token: str = ADMIN, cwd: str | None = None) -> list[str]:
        """``argv`` run on the login box: its own namespaces, kubectl and this venv's trainwatch."""
        assert self.login is not None
        env = {"PATH": f"{VENV_BIN}:{SYSTEM_PATH}", "HOME": str(self.dir), "LANG": "C.UTF-8", "COLUMNS": "120",
               **self.kube_env(token, API_ADDR)}
        return self.login.enter(argv, env, cwd=cwd or str(self.dir), net=True)

    # -- pods ------------------------------------------------------------------------------------
    def pytorchjob_env(self, job: str, node_rank: int, nnodes: int, nproc: int, port: int) -> dict[str, str]:
        """The environment Kubeflow's training-operator gives a PyTorchJob's containers."""
        return {"MASTER_ADDR": f"{job}-master-0", "MASTER_PORT": str(port), "PET_MASTER_ADDR": f"{job}-master-0",
                "PET_MASTER_PORT": str(port), "WORLD_SIZE": str(nnodes * nproc), "RANK": str(node_rank),
                "PET_NPROC_PER_NODE": str(nproc), "PET_NODE_RANK": str(node_rank), "PET_NNODES": str(nnodes),
                "PYTHONUNBUFFERED": "0"}

    def add_pod(self, name: str, *, job: str, replica: tuple[str, int], env: dict[str, str], node: str,
                command: list[str] | None = None, status: dict | None = None, trainwatch: bool = True,
                workdir: Path | None = None, account: str = VIEWER) -> None:
        """One pod of a PyTorchJob: with ``command``, a running pod whose container runs it (in the pod's
        namespaces, its host name ``node``'s: hostNetwork); without, only what ``status`` says of it."""
        kind, index = replica
        labels = {JOB_LABEL: job, "training.kubeflow.org/replica-type": kind,
                  "training.kubeflow.org/replica-index": str(index),
                  "training.kubeflow.org/operator-name": "pytorchjob-controller"}
        if kind == "master":
            labels["training.kubeflow.org/job-role"] = "master"
        path = f"{VENV_BIN}:{SYSTEM_PATH}" if trainwatch else SYSTEM_PATH
        declared_env = [{"name": k, "value": v} for k, v in env.items()]
        pod = {"apiVersion": "v1", "kind": "Pod",
               "metadata": {"name": name, "namespace": self.namespace, "labels": labels,
                            "uid": f"0000{abs(hash(name)) % 10**8:08d}-0000-4000-8000-{index:012d}"},
               "spec": {"hostNetwork": True, "containers": [{"name": "pytorch", "image": "trainwatch-test:latest",
                                                           "command": command or ["torchrun"], "env": declared_env}]},
               "status": status or {"phase": "Pending"}, "_path": path,
               # the pod's service account, as kubectl inside it finds it (here: a kubeconfig in its environment)
               "_env": self.kube_env(account)}
        if command is not None:
            hosts = self.dir / f"hosts-{name}"
            hosts.write_text(f"127.0.0.1 localhost {node} {job}-master-0 {name}\n")
            space = Namespace(["--pid", "--mount", "--uts"], node, f"mount --bind {hosts} /etc/hosts;")
            self.pods[name] = space
            run_env = {"PATH": path, "HOSTNAME": node, "HOME": "/root", "OMP_NUM_THREADS": "1", **env}
            cwd = str(workdir or self.dir)
            with open(self.dir / f"{name}.log", "wb") as log:
                self.containers[name] = subprocess.Popen(space.enter(command, run_env, cwd=cwd), stdout=log,
                                                         stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                                         start_new_session=True, preexec_fn=default_signals)
            pod["spec"]["nodeName"] = node
            pod["status"] = status or running_status(node)
            pod.update({"_init": space.init, "_hostname": node, "_workdir": cwd})
        self.state["pods"] = [p for p in self.state["pods"] if p["metadata"]["name"] != name] + [pod]
        self._save()

    def set_status(self, name: str, status: dict) -> None:
        self.change(name, status=status)

    def change(self, name: str, **fields) -> None:
        """Set fields of a pod as the API server reports it (``status``, ``_path``: its containers'
        PATH, ``_env``: what exec adds to its environment)."""
        for pod in self.state["pods"]:
            if pod["metadata"]["name"] == name:
                pod.update(fields)
        self._save()

    def pod(self, name: str) -> dict:
        return next(p for p in self.state["pods"] if p["metadata"]["name"] == name)

    def exec_argv(self, pod: str, argv: list[str], token: str = ADMIN) -> list[str]:
        """``kubectl exec POD -- argv`` as a person with ``token`` runs it on this machine (outside every pod)."""
        env = {"PATH": f"{VENV_BIN}:{SYSTEM_PATH}", "HOME": str(self.dir), **self.kube_env(token)}
        return ["env", "-i", *(f"{k}={v}" for k, v in env.items()), "kubectl", "exec", pod, "--", *argv]

    def log(self, name: str) -> str:
        return (self.dir / f"{name}.log").read_text(errors="replace")

    def stop_pod(self, name: str) -> None:
        """The pod's namespace ends (its container with it: every process of a pod is in its PID
        namespace); then the nsenter that started the container is reaped."""
        proc = self.containers.get(name)
        elastic = _elastic_dirs(proc.pid) if proc is not None else set()  # torchrun never removes them
        space = self.pods.pop(name, None)
        if space is not None:
            space.stop()
        for folder in elastic:
            shutil.rmtree(folder, ignore_errors=True)
        proc = self.containers.pop(name, None)
        if proc is not None:
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                kill_tree(proc.pid)
                proc.wait(timeout=10)

    def stop(self) -> None:
        for name in list(self.pods):
            self.stop_pod(name)
        if self.login is not None:
            self.login.stop()  # its end of the veth goes with its network namespace, and the pair with it
            self.login = None
        subprocess.run(["ip", "link", "del", self.veth[0]], capture_output=True, timeout=10, check=False)
        if self.api is not None and self.api.poll() is None:
            os.killpg(self.api.pid, signal.SIGKILL)
            self.api.wait(timeout=10)

    def __enter__(self) -> Cluster:
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


def running_status(node: str, restarts: int = 0) -> dict:
    return {"phase": "Running", "hostIP": "127.0.0.1", "podIP": "127.0.0.1",
            "conditions": [{"type": "PodScheduled", "status": "True"}, {"type": "Ready", "status": "True"}],
            "containerStatuses": [{"name": "pytorch", "ready": True, "restartCount": restarts,
                                   "state": {"running": {"startedAt": "2026-11-28T08:00:00Z"}}}]}


def pending_status(message: str = "0/8 nodes are available: 8 Insufficient nvidia.com/gpu.") -> dict:
    """A pod the scheduler could not place."""
    return {"phase": "Pending", "conditions": [{"type": "PodScheduled", "status": "False", "reason": "Unschedulable",
                                                "message": message}]}


def image_pull_status(image: str = "registry.example/llm:v2") -> dict:
    return {"phase": "Pending", "conditions": [{"type": "PodScheduled", "status": "True"}],
            "containerStatuses": [{"name": "pytorch", "ready": False, "restartCount": 0, "state": {"waiting": {
                "reason": "ImagePullBackOff", "message": f'Back-off pulling image "{image}"'}}}]}


def crash_loop_status(node: str, restarts: int = 3, reason: str = "OOMKilled", code: int = 137) -> dict:
    """A container that keeps dying (its last end: ``reason``, ``code``) and is waiting to start again."""
    return {"phase": "Running", "hostIP": "127.0.0.1", "podIP": "127.0.0.1",
            "conditions": [{"type": "PodScheduled", "status": "True"}, {"type": "Ready", "status": "False"}],
            "containerStatuses": [{"name": "pytorch", "ready": False, "restartCount": restarts, "state": {"waiting": {
                "reason": "CrashLoopBackOff",
                "message": "back-off 40s restarting failed container=pytorch pod=llm-worker-0"}},
                "lastState": {"terminated": {"reason": reason, "exitCode": code,
                                             "startedAt": "2026-11-28T08:00:00Z",
                                             "finishedAt": "2026-11-28T08:01:00Z"}}}]}


def planted_command(workdir: Path, scenario: str, deadline: float = 120, extra: tuple[str, ...] = ()) -> list[str]:
    """The container's command: torchrun, all its options from the PET_* environment (as a PyTorchJob
    runs it), on a copy of the planted job in the pod's working folder."""
    workdir.mkdir(parents=True, exist_ok=True)
    script = workdir / "train.py"
    if not script.exists():
        shutil.copy(PLANTED, script)
    return [sys.executable, "-m", "torch.distributed.run", str(script), "--scenario", scenario,
            "--deadline", str(deadline), *extra]
