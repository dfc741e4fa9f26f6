"""A Ray Train run across two real hosts (tests/two_hosts.py), found from the driver's node with --ray auto.

A Ray cluster is started the way clusters are (`ray start --head` on node1, `ray start --address`
on node2, each in its own PID/UTS/mount/network namespace); a `TorchTrainer` with 4 gloo workers
runs on it, two on each node. Ray numbers the ranks and places them: which ranks land on node2 is
Ray's choice, read here from its own records. Then the last worker on node2 stalls in its own code
while the other three wait in DDP's all_reduce. trainwatch runs on node1, given the driver's PID
(and a worker's: any PID of the job finds it whole).
Then, on the same cluster, a worker group of plain Ray actors (no Ray Train): 4 gloo actors, rank 0
pinned to node1, the rest where Ray puts them; rank 3 stops in its own code.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from real_jobs import FRAMEWORK_JOBS, kill_tree
from sshd import remote_trainwatch
import two_hosts

pytest.importorskip("ray.train.torch")  # Ray Train; the plain actors need only ray
pytestmark = [pytest.mark.job, pytest.mark.slow]

TRAINWATCH = str(Path(sys.executable).parent / "trainwatch")
RAY = str(Path(sys.executable).parent / "ray")
RAY_ENV = ["env", "RAY_DISABLE_USAGE_STATS=1", "RAY_AUTH_MODE=disabled", "RAY_DEDUP_LOGS=0",
           f"GLOO_SOCKET_IFNAME={two_hosts.IFNAME}", "OMP_NUM_THREADS=1", "PYTHONUNBUFFERED=1"]
HEAD = f"{two_hosts.ADDRS['node1']}:6379"


class RayHosts:
    """Two hosts with Ray on both, and one training run on them at a time (each a driver on node1)."""

    def __init__(self, hosts, workdir: Path) -> None:
        self.hosts, self.root = hosts, workdir
        self.driver_proc: subprocess.Popen | None = None

    def __getattr__(self, name: str):  # noqa: ANN204 (the hosts' own: on(), ssh_config)
        return getattr(self.hosts, name)

    def run(self, script: str, ready, *env: str) -> None:
        """Start ``script`` from tests/jobs_frameworks/ as a driver on node1 (the previous run stopped
        first: the cluster's 4 CPUs hold one run's 4 workers) and wait until ``ready(log text)``."""
        self.stop()
        self.workdir = self.root / Path(script).stem
        self.workdir.mkdir()
        for helper in FRAMEWORK_JOBS.glob("_*.py"):
            shutil.copy(helper, self.workdir / helper.name)
        shutil.copy(FRAMEWORK_JOBS / script, self.workdir)
        self.log = self.workdir / "job.log"
        with open(self.log, "wb") as out:
            self.driver_proc = subprocess.Popen(
                self.hosts.on("node1", [*RAY_ENV, f"RAY_ADDRESS={HEAD}", "TW_RAY_WORKERS=4", *env, sys.executable,
                                        script, "--deadline", "150"], cwd=str(self.workdir)),
                stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
        deadline = time.monotonic() + 120
        while not ready(self.log.read_text(errors="replace")):
            assert self.driver_proc.poll() is None, f"the driver exited early:\n{self.log.read_text()[-3000:]}"
            assert time.monotonic() < deadline, f"the ranks did not start:\n{self.log.read_text()[-3000:]}"
            time.sleep(0.5)
        self.driver = int((self.workdir / "driver.pid").read_text())  # as node1's PID namespace sees it

    def stall(self, timeout: float) -> None:
        """Tell the run's last worker to stop in its own code, and wait until it says it has."""
        (self.workdir / "stall-now").touch()
        deadline = time.monotonic() + timeout
        while "straggling" not in self.log.read_text(errors="replace"):
            assert time.monotonic() < deadline, self.log.read_text()[-3000:]
            time.sleep(0.3)
        time.sleep(1.0)

    def stop(self) -> None:
        if self.driver_proc is not None:
            kill_tree(self.driver_proc.pid)
            self.driver_proc.wait(timeout=10)
            self.driver_proc = None
            time.sleep(2.0)  # Ray hands the workers' CPUs back once it sees them gone


@pytest.fixture(scope="module")
def ray_hosts(tmp_path_factory):
    """Two hosts, Ray on both (each node its own temp dir: Ray's sockets live there, and a short path
    keeps them under the 107-byte limit); all of it dies with the namespaces. One cluster for every
    run of this module: a Ray Train run, then a worker group of plain Ray actors."""
    reason = two_hosts.unavailable_reason()
    if reason:
        if two_hosts.in_ci():
            pytest.fail(f"CI: {reason}")
        pytest.skip(reason)
    workdir = tmp_path_factory.mktemp("raynodes")
    temps = {node: tempfile.mkdtemp(prefix=f"twray-{node}-", dir="/tmp") for node in two_hosts.ADDRS}
    with two_hosts.TwoHosts(workdir / "hosts") as hosts:
        cluster = RayHosts(hosts, workdir)
        try:
            for node, addr in two_hosts.ADDRS.items():
                where = ["--head", "--port", "6379", "--include-dashboard=false"] if node == "node1" else [
                    "--address", HEAD]
                done = subprocess.run(hosts.on(node, [*RAY_ENV, RAY, "start", *where, "--node-ip-address", addr,
                                                      "--num-cpus", "2", "--temp-dir", temps[node],
                                                      "--disable-usage-stats"]),
                                      capture_output=True, text=True, timeout=120)
                assert done.returncode == 0, f"ray start on {node}: {done.stderr[-2000:]}"
            yield cluster
        finally:
            cluster.stop()
    for temp in temps.values():
        shutil.rmtree(temp, ignore_errors=True)


@pytest.fixture(scope="module")
def ray_cluster(ray_hosts):
    """A Ray Train run (4 gloo workers, two on each node) on the module's cluster."""
    ray_hosts.run("ray_train_straggler.py", lambda text: text.count("step 10\n") >= 4,
                  f"TW_STALL_IP={two_hosts.ADDRS['node2']}")
    return ray_hosts


@pytest.fixture(scope="module")
def actor_cluster(ray_hosts):
    """A worker group of 4 plain Ray actors (rank 0 pinned to node1) on the module's cluster."""
    ray_hosts.run("ray_actor_group.py", lambda text: "[rank 3] step 10" in text)
    rows = [line.split() for line in (ray_hosts.workdir / "ranks.txt").read_text().splitlines() if line.strip()]
    ray_hosts.placed = {int(rank): host for rank, _, host in rows}
    return ray_hosts


def snapshot(hosts, *extra: str, pid: int | None = None) -> dict:
    done = subprocess.run(hosts.on("node1", [TRAINWATCH, "snapshot", str(pid or hosts.driver), "--json", *extra]),
                          capture_output=True, text=True, timeout=90)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def workers(hosts, node: str) -> list[int]:
    """The Ray Train workers on ``node``, as its PID namespace numbers them."""
    found = subprocess.run(hosts.on(node, ["pgrep", "-f", "^ray::RayTrainWorker"]), capture_output=True, text=True,
                           timeout=20).stdout.split()
    return sorted(map(int, found))


def on_node2(found: dict) -> list[int]:
    return sorted(r["rank"] for r in found["ranks"] if r["host"] == "node2")


def test_ray_auto_reads_the_nodes_ray_placed_the_run_on(ray_cluster):
    hosts = ray_cluster
    here = snapshot(hosts)
    assert here["job"]["launcher"] == "ray train", here["job"]  # its root: the raylet `ray start` began
    assert len(here["ranks"]) == 2 and {r["host"] for r in here["ranks"]} == {"node1"}, here["ranks"]
    assert any("rank numbers from Ray Train's worker logs" in n for n in here["notes"]), here["notes"]
    # the loop runs in Ray's TrainingThread: that is the thread judged; Ray's other helpers are no ranks
    assert all("train_loop" in (r["where"] or "") or r["phase"] != "unknown" for r in here["ranks"]), here["ranks"]
    assert sorted(r["pid"] for r in here["ranks"]) == workers(hosts, "node1"), here["ranks"]
    assert here["job"]["world_size"] == 4 and here["job"]["nnodes"] == 2, here["job"]
    placed = next(n for n in here["notes"] if n.startswith("Ray Train's worker group"))
    assert two_hosts.ADDRS["node2"] in placed, here["notes"]
    assert any("add --ray auto to see the others" in w for w in here["warnings"]), here["warnings"]

    remote = ["--ray", "auto", "--ssh-option", f"-F {hosts.ssh_config}", "--remote-trainwatch", remote_trainwatch()]
    healthy = snapshot(hosts, *remote)
    assert sorted(r["rank"] for r in healthy["ranks"]) == [0, 1, 2, 3], healthy["ranks"]
    assert len(on_node2(healthy)) == 2 and healthy["verdict"]["kind"] == "healthy", healthy["verdict"]
    assert [h["name"] for h in healthy["hosts"]] == ["node1", "node2"] and not any(h["error"] for h in healthy["hosts"])

    hosts.stall(timeout=60)
    stuck = snapshot(hosts, *remote)
    culprit = max(on_node2(stuck))  # the last worker on node2, whatever number Ray gave it
    assert (stuck["verdict"]["kind"], stuck["verdict"]["culprits"]) == ("straggler", [culprit]), stuck["verdict"]
    assert "evaluate_forever" in stuck["verdict"]["summary"], stuck["verdict"]
    assert "all_reduce" in stuck["verdict"]["summary"], stuck["verdict"]
    from_a_worker = snapshot(hosts, *remote, pid=workers(hosts, "node1")[0])  # any PID of the job will do
    assert (from_a_worker["verdict"]["kind"], from_a_worker["verdict"]["culprits"]) == ("straggler", [culprit])
    assert {r["rank"]: r["host"] for r in from_a_worker["ranks"]} == {r["rank"]: r["host"] for r in stuck["ranks"]}


def test_ray_auto_where_the_controller_log_is_not(ray_cluster):
    """On a worker-only node nothing names the other nodes: a clear refusal, not this node alone."""
    hosts = ray_cluster
    worker = workers(hosts, "node2")[0]
    done = subprocess.run(hosts.on("node2", [TRAINWATCH, "snapshot", str(worker), "--ray", "auto"]),
                          capture_output=True, text=True, timeout=60)
    assert done.returncode != 0 and "Traceback" not in done.stderr, done.stderr
    assert "does not hold the run's controller log" in done.stderr and "driver's node" in done.stderr, done.stderr


def test_ray_auto_finds_the_other_nodes_ranks_through_the_store(actor_cluster):
    """A worker group of plain Ray actors: no Ray Train, so no controller log names the nodes; the
    store rank 0 serves on the driver's node sees the other node's ranks connect, and the agent on
    that node finds them by their connection to the store's address."""
    hosts = actor_cluster
    local = sorted(rank for rank, host in hosts.placed.items() if host == "node1")
    here = snapshot(hosts)
    assert here["job"]["launcher"] == "ray actors" and here["job"]["world_size"] == 4, here["job"]
    assert sorted(r["rank"] for r in here["ranks"]) == local, (here["ranks"], hosts.placed)
    assert here["job"]["nnodes"] == 2 and here["job"]["rendezvous"]["served_here"] is True, here["job"]
    assert any(two_hosts.ADDRS["node2"] in n and "ranks on other nodes" in n for n in here["notes"]), here["notes"]

    remote = ["--ray", "auto", "--ssh-option", f"-F {hosts.ssh_config}", "--remote-trainwatch", remote_trainwatch()]
    healthy = snapshot(hosts, *remote)
    assert {r["rank"]: r["host"] for r in healthy["ranks"]} == hosts.placed, healthy["ranks"]
    assert healthy["verdict"]["kind"] == "healthy", healthy["verdict"]
    assert not any(h["error"] for h in healthy["hosts"]), healthy["hosts"]

    hosts.stall(timeout=120)
    stuck = snapshot(hosts, *remote)
    assert (stuck["verdict"]["kind"], stuck["verdict"]["culprits"]) == ("straggler", [3]), stuck["verdict"]
    assert "evaluate_forever" in stuck["verdict"]["summary"], stuck["verdict"]
