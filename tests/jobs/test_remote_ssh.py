"""End to end through a real OpenSSH server on loopback: a 2-node gloo world seen as one job.

Node 0 is read locally; node 1 (where the planted culprit, rank world-1, lives) is reached
with ssh. Both "nodes" share this machine's process table, so on the far side a small wrapper
pins trainwatch to node 1's launcher PID instead of ``--match ADDR:PORT`` (which on loopback
would match node 0's ranks too); ``--match-job-id`` is exercised over ssh separately.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import psutil
import pytest

from real_jobs import free_port
from sshd import Sshd, TwoNodeJob, unavailable_reason
from trainwatch.probes.errors import PARTIAL_EXIT
from trainwatch.probes.remote.reach import SshRemote

pytestmark = [pytest.mark.job, pytest.mark.slow,
              pytest.mark.skipif(unavailable_reason() is not None, reason=str(unavailable_reason()))]

CLI = [sys.executable, "-m", "trainwatch.tui.cli"]


@pytest.fixture(scope="module")
def sshd(tmp_path_factory):
    server = Sshd(tmp_path_factory.mktemp("sshd")).start()
    dead_port = free_port()  # nothing listens here: an unreachable node
    server.config.write_text(f"Host dead\n  Port {dead_port}\n  ConnectTimeout 3\n" + server.config.read_text())
    yield server
    server.stop()


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    job = TwoNodeJob(tmp_path_factory.mktemp("world"), "straggler", nproc_per_node=1, deadline=150).start()
    try:
        job.wait_for_ranks()
        yield job
    finally:
        job.stop()


def pinned_trainwatch(tmp: Path, pid: int) -> str:
    """A far-side trainwatch that finds node 1's job by its launcher PID instead of by --match."""
    wrapper = tmp / f"trainwatch-node-{pid}"
    wrapper.write_text(textwrap.dedent(f"""\
        #!{sys.executable}
        import os, sys
        args = sys.argv[1:]
        if args[:1] == ["agent"] and "--match" in args:
            at = args.index("--match")
            del args[at:at + 2]
            args.insert(1, "{pid}")
        os.environ["PATH"] = "{Path(sys.executable).parent}:" + os.environ.get("PATH", "/usr/bin:/bin")
        os.execv(sys.executable, [sys.executable, "-m", "trainwatch.tui.cli", *args])
        """))
    wrapper.chmod(0o755)
    return str(wrapper)


def snapshot_cli(world: TwoNodeJob, sshd: Sshd, hosts: str, trainwatch: str, timeout: float = 60,
                 extra: tuple[str, ...] = ()):
    cmd = [*CLI, "snapshot", str(world.pids[0]), "--json", "--window", "1", "--hosts", hosts,
           "--ssh-option", sshd.ssh_option, "--remote-trainwatch", trainwatch,
           "--remote-timeout", str(timeout), *extra]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout + 60)
    data = json.loads(done.stdout) if done.stdout.strip().startswith("{") else None
    return done, data


def test_one_view_of_both_nodes_names_the_remote_culprit(world, sshd, tmp_path):
    done, data = snapshot_cli(world, sshd, "node-b", pinned_trainwatch(tmp_path, world.pids[1]))
    assert done.returncode == 0, done.stderr
    assert data["source"] == "remote"
    hosts = {r["rank"]: r["host"] for r in data["ranks"]}
    assert set(hosts) == {0, 1}
    assert hosts[1] == "node-b" and hosts[0] != "node-b"
    assert data["verdict"]["culprits"] == [1], data["verdict"]
    assert data["verdict"]["kind"] == "straggler", data["verdict"]
    culprit_group = next(g for g in data["groups"] if g["culprit"])
    assert culprit_group["ranks"] == [1]
    assert [h["name"] for h in data["hosts"] if h["error"]] == []


def test_unreachable_node_is_named_and_the_rest_shown(world, sshd, tmp_path):
    done, data = snapshot_cli(world, sshd, "node-b,dead", pinned_trainwatch(tmp_path, world.pids[1]))
    assert done.returncode == PARTIAL_EXIT, done.stderr
    failed = {h["name"]: h["error"] for h in data["hosts"] if h["error"]}
    assert list(failed) == ["dead"] and failed["dead"].startswith("unreachable"), failed
    assert {r["rank"] for r in data["ranks"] if r["state"] != "missing"} == {0, 1}


def test_through_a_relay_the_remote_culprit_is_named_and_a_node_it_cannot_reach_too(world, sshd, tmp_path):
    """From --remote-relays-from hosts on, node-b relays: its own agent, and ssh on to "dead"."""
    done, data = snapshot_cli(world, sshd, "node-b,dead", pinned_trainwatch(tmp_path, world.pids[1]),
                              extra=("--remote-relays-from", "2"))
    assert done.returncode == PARTIAL_EXIT, done.stderr
    assert data["verdict"]["culprits"] == [1], data["verdict"]
    assert {r["rank"]: r["host"] for r in data["ranks"]}[1] == "node-b"
    failed = {h["name"]: h["error"] for h in data["hosts"] if h["error"]}
    assert list(failed) == ["dead"] and failed["dead"].startswith("agent stopped: unreachable"), failed
    assert "from relay node-b" in failed["dead"]


def test_a_relay_that_cannot_be_reached_gives_way_to_one_agent_per_node(world, sshd, tmp_path):
    done, data = snapshot_cli(world, sshd, "dead,node-b", pinned_trainwatch(tmp_path, world.pids[1]),
                              extra=("--remote-relays-from", "2"))
    assert done.returncode == PARTIAL_EXIT, done.stderr
    assert data["verdict"]["culprits"] == [1], data["verdict"]
    failed = {h["name"]: h["error"] for h in data["hosts"] if h["error"]}
    assert list(failed) == ["dead"] and failed["dead"].startswith("unreachable"), failed


def test_node_without_trainwatch_is_named_and_its_ranks_unknown(world, sshd):
    done, data = snapshot_cli(world, sshd, "node-b", "/nonexistent/trainwatch")
    assert done.returncode == PARTIAL_EXIT, done.stderr
    (failed,) = [h for h in data["hosts"] if h["error"]]
    assert failed["name"] == "node-b" and "trainwatch not installed" in failed["error"]
    states = {r["rank"]: (r["state"], r["host"]) for r in data["ranks"]}
    assert states[1] == ("unknown", "node-b") and states[0][0] not in ("missing", "unknown")
    # rank 0 waits in its collective; rank 1, unread, may be what it waits for: never "no local culprit"
    verdict = data["verdict"]
    assert verdict["kind"] == "straggler" and verdict["culprits"] == [1], verdict
    assert "rank 1 could not be read" in verdict["summary"] and "no local culprit" not in verdict["summary"]
    assert verdict["summary"].endswith("node not read: node-b")
    assert any("node-b" in n for n in data["notes"])


@pytest.mark.parametrize("relays_from", ["64", "2"], ids=["direct", "through-a-relay"])
def test_dump_brings_each_nodes_bundle_back_through_its_agent(world, sshd, tmp_path, relays_from):
    """`dump` asks the agents already running for their bundles: node-b's comes back on its stream
    (directly, or through a relay on node-b), and the node no agent could reach is named."""
    out = tmp_path / "out"
    cmd = [*CLI, "dump", str(world.pids[0]), "--out", str(out), "--window", "1", "--no-native",
           "--hosts", "node-b,dead", "--ssh-option", sshd.ssh_option, "--remote-relays-from", relays_from,
           "--remote-trainwatch", pinned_trainwatch(tmp_path, world.pids[1]), "--remote-timeout", "60"]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=150)
    assert done.returncode == PARTIAL_EXIT, done.stderr
    bundle = Path(done.stdout.strip().splitlines()[-1])
    assert "trainwatch: node-b: bundle in hosts/node-b/" in done.stderr, done.stderr
    assert "trainwatch: dead: no bundle: " in done.stderr and "unreachable" in done.stderr, done.stderr
    # node-b's own evidence: the culprit's stack, where it sleeps
    assert "train.py" in (bundle / "hosts" / "node-b" / "ranks" / "1" / "stacks.txt").read_text()
    assert sorted(os.listdir(bundle / "hosts")) == ["node-b"]
    assert not list(bundle.glob(".incoming-*"))  # the parts as they came are gone


@pytest.mark.parametrize("relay_from", [64, 1], ids=["direct", "through-a-relay"])
def test_live_agents_over_ssh_name_the_remote_culprit_and_leave_nothing(world, sshd, tmp_path, relay_from):
    """What attach and watch do: one persistent agent on node-b over real ssh
    (directly, or started by a relay on node-b: the relay and its agent both go when the view closes)."""
    from trainwatch.probes.live import LocalSource
    from trainwatch.probes.remote.streams import StreamSource

    begun = time.time() - 0.5  # create_time is rounded to clock ticks

    def ours() -> list[int]:
        """This test's agents: the wrapper below puts node-b's launcher PID in the agent's command line;
        an earlier test's agent may still be on its way out (it leaves within a grace of its stop)."""
        pinned = str(world.pids[1])
        return [p.pid for p in psutil.process_iter(["cmdline", "create_time"])
                if "agent" in (cmd := p.info["cmdline"] or []) and pinned in cmd and p.info["create_time"] >= begun]

    local = LocalSource(world.pids[0], window=1.0, gpu=False)
    remote = SshRemote("node-b", options=("-F", str(sshd.config)))
    source = StreamSource(local, [remote], match=["--match", f"127.0.0.1:{world.port}"],
                          trainwatch=pinned_trainwatch(tmp_path, world.pids[1]), interval=1.0, window=1.0,
                          timeout=60, world_size=2, relay_from=relay_from)
    try:
        assert [launch.relayed for launch in source.launches] == [relay_from == 1]
        merged = source.poll()
        for _ in range(20):
            if merged.verdict.kind == "straggler":
                break
            merged = source.poll()
        assert {r.rank: r.host for r in merged.ranks}[1] == "node-b"
        assert merged.verdict.kind == "straggler" and merged.verdict.culprits == (1,), merged.verdict
        assert not any(h.error for h in merged.hosts)
        agents = ours()
        assert len(agents) == 1  # one agent, started once, for every poll
        first_agent = agents[0]
        merged = source.poll()
        assert ours() == [first_agent]
        relays = [p.pid for p in psutil.process_iter(["cmdline"]) if "relay" in (p.info["cmdline"] or [])
                  and "--self" in p.info["cmdline"] and str(tmp_path) in " ".join(p.info["cmdline"])]
        assert len(relays) == (relay_from == 1)
    finally:
        source.close()
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline and any(psutil.pid_exists(p) for p in [first_agent, *relays]):
        time.sleep(0.1)
    for pid in [first_agent, *relays]:
        assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
