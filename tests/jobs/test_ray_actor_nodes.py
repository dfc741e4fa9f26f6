"""A worker group of plain Ray actors across two real hosts (tests/two_hosts.py), found from the
driver's node with --ray auto: no Ray Train, so no controller log names the nodes; the store rank 0
serves on the driver's node sees the other node's ranks connect, and the agent on that node finds
them by their connection to the store's address.

A Ray cluster as in test_ray_nodes.py (`ray start --head` on node1, `ray start --address` on node2);
4 gloo actors, rank 0 pinned to node1, the rest where Ray puts them (2 CPUs a node: two on each).
Then rank 3 stops in its own code while the others wait in all_reduce.
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

pytest.importorskip("ray")
pytestmark = [pytest.mark.job, pytest.mark.slow]

TRAINWATCH = str(Path(sys.executable).parent / "trainwatch")
RAY = str(Path(sys.executable).parent / "ray")
RAY_ENV = ["env", "RAY_DISABLE_USAGE_STATS=1", "RAY_AUTH_MODE=disabled", "RAY_DEDUP_LOGS=0",
           f"GLOO_SOCKET_IFNAME={two_hosts.IFNAME}", "OMP_NUM_THREADS=1", "PYTHONUNBUFFERED=1"]
HEAD = f"{two_hosts.ADDRS['node1']}:6379"


@pytest.fixture(scope="module")
def ray_cluster(tmp_path_factory):
    reason = two_hosts.unavailable_reason()
    if reason:
        if two_hosts.in_ci():
            pytest.fail(f"CI: {reason}")
        pytest.skip(reason)
    workdir = tmp_path_factory.mktemp("rayactors")
    temps = {node: tempfile.mkdtemp(prefix=f"twra-{node}-", dir="/tmp") for node in two_hosts.ADDRS}
    driver = None
    with two_hosts.TwoHosts(workdir / "hosts") as hosts:
        try:
            for node, addr in two_hosts.ADDRS.items():
                where = ["--head", "--port", "6379", "--include-dashboard=false"] if node == "node1" else [
                    "--address", HEAD]
                done = subprocess.run(hosts.on(node, [*RAY_ENV, RAY, "start", *where, "--node-ip-address", addr,
                                                      "--num-cpus", "2", "--temp-dir", temps[node],
                                                      "--disable-usage-stats"]),
                                      capture_output=True, text=True, timeout=120)
                assert done.returncode == 0, f"ray start on {node}: {done.stderr[-2000:]}"
            for helper in FRAMEWORK_JOBS.glob("_*.py"):
                shutil.copy(helper, workdir / helper.name)
            shutil.copy(FRAMEWORK_JOBS / "ray_actor_group.py", workdir)
            log = workdir / "job.log"
            with open(log, "wb") as out:
                driver = subprocess.Popen(
                    hosts.on("node1", [*RAY_ENV, f"RAY_ADDRESS={HEAD}", "TW_RAY_WORKERS=4", sys.executable,
                                       "ray_actor_group.py", "--deadline", "150"], cwd=str(workdir)),
                    stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
            deadline = time.monotonic() + 120
            while "[rank 3] step 10" not in log.read_text(errors="replace"):
                assert driver.poll() is None, f"the driver exited early:\n{log.read_text()[-3000:]}"
                assert time.monotonic() < deadline, f"the ranks did not start:\n{log.read_text()[-3000:]}"
                time.sleep(0.5)
            hosts.workdir, hosts.log = workdir, log
            hosts.driver = int((workdir / "driver.pid").read_text())  # as node1's PID namespace sees it
            rows = [line.split() for line in (workdir / "ranks.txt").read_text().splitlines() if line.strip()]
            hosts.placed = {int(rank): host for rank, _, host in rows}
            yield hosts
        finally:
            if driver is not None:
                kill_tree(driver.pid)
                driver.wait(timeout=10)
    for temp in temps.values():
        shutil.rmtree(temp, ignore_errors=True)


def snapshot(hosts, *extra: str) -> dict:
    done = subprocess.run(hosts.on("node1", [TRAINWATCH, "snapshot", str(hosts.driver), "--json", *extra]),
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def test_ray_auto_finds_the_other_nodes_ranks_through_the_store(ray_cluster):
    hosts = ray_cluster
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

    (hosts.workdir / "stall-now").touch()
    deadline = time.monotonic() + 120
    while "straggling" not in hosts.log.read_text(errors="replace"):
        assert time.monotonic() < deadline, hosts.log.read_text()[-3000:]
        time.sleep(0.3)
    time.sleep(1.0)
    stuck = snapshot(hosts, *remote)
    assert (stuck["verdict"]["kind"], stuck["verdict"]["culprits"]) == ("straggler", [3]), stuck["verdict"]
    assert "evaluate_forever" in stuck["verdict"]["summary"], stuck["verdict"]
