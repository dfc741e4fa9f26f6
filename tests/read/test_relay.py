"""The relay of a tree of agents: real child processes (stand-ins for agents), its labelled lines,
requests passed on, a child that stops named on its own label; and the viewer's plan of relays."""

from __future__ import annotations

import io
import json
import os
import sys
import threading
import time

from trainwatch.probes.remote.launches import plan_launches, relay_groups
from trainwatch.probes.remote.reach import SlurmRemote, SshRemote
from trainwatch.probes.remote.relay import Child, Relay
from trainwatch.probes.remote.wire import decode_line

# An agent stand-in: says hello, then echoes each request it reads as a line of its own.
ECHO = ("import json, sys\n"
        "print(json.dumps({'kind': 'trainwatch-node', 'v': 1, 'node': sys.argv[1], 'hello': True}), flush=True)\n"
        "for line in sys.stdin:\n"
        "    print(json.dumps({'node': sys.argv[1], 'asked': json.loads(line)}), flush=True)\n")


class Lines(io.RawIOBase):
    """The relay's stdout, as the viewer reads it: whole lines."""

    def __init__(self) -> None:
        self.data = bytearray()
        self.lock = threading.Lock()

    def writable(self) -> bool:
        return True

    def write(self, b) -> int:
        with self.lock:
            self.data += bytes(b)
        return len(b)

    def lines(self) -> list[str]:
        with self.lock:
            return bytes(self.data).decode().splitlines()


def wait_for(check, timeout: float = 10.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if (got := check()):
            return got
        time.sleep(0.05)
    raise AssertionError("timed out")


def test_a_relay_labels_each_agents_lines_passes_requests_on_and_names_an_agent_that_stops():
    children = [Child(0, "n0", [sys.executable, "-c", ECHO, "n0"], None),
                Child(1, "n1", [sys.executable, "-c", ECHO, "n1"], None),
                Child(2, "n2", [sys.executable, "-c", "import sys; sys.stderr.write('boom: no GPU\\n'); sys.exit(6)"],
                      None)]
    out = Lines()
    read_r, read_w = os.pipe()
    relay = Relay(children, out, timeout=5.0)
    runner = threading.Thread(target=relay.run, args=(os.fdopen(read_r, "rb", 0),), daemon=True)
    runner.start()
    try:
        wait_for(lambda: sum('"hello": true' in line for line in out.lines()) == 2)
        os.write(read_w, b'{"full": [3], "native": []}\n')
        asked = wait_for(lambda: sorted(line.split(": ", 1)[0] for line in out.lines() if "asked" in line)
                         if sum("asked" in line for line in out.lines()) == 2 else None)
        assert asked == ["0", "1"]  # both agents got the request, each line on its agent's label
        for line in out.lines():
            task, body = line.split(": ", 1)
            if "asked" in body:
                assert json.loads(body) == {"node": f"n{task}", "asked": {"full": [3], "native": []}}
        stopped = wait_for(lambda: [line for line in out.lines() if line.startswith("2: ")])
        answer = decode_line(stopped[0].split(": ", 1)[1])
        assert answer.node == "n2" and answer.snapshot is None
        assert answer.error.startswith("agent stopped: failed with exit status 6 (from relay n0; again in 2s)")
    finally:
        os.close(read_w)  # the viewer goes: the relay stops its agents and returns
        runner.join(10)
    assert not runner.is_alive()
    assert all(c.proc is None or c.proc.poll() is not None for c in children)


def test_from_relay_from_hosts_on_about_sqrt_n_relays_reach_them():
    hosts = [SshRemote(f"n{i:03d}", options=("-o", "Port=2222", "-F", "/etc/tw/ssh"))
             for i in range(100)]
    launches = plan_launches([*hosts, SlurmRemote("s1", "7")], "tw", ["agent", "--match", "a:1"], relay_from=64)
    relays = [launch for launch in launches if launch.relayed]
    assert len(relays) == 10 and all(len(launch.names) == 10 and launch.labelled for launch in relays)
    assert [launch.names for launch in launches if not launch.relayed] == [["s1"]]
    first = relays[0]
    remote_command = first.argv[-1]  # ssh's one string for the far shell
    assert remote_command.startswith("tw relay --self n000 --remote-trainwatch tw")
    assert "--node n001" in remote_command and "--node n009" in remote_command and "n010" not in remote_command
    assert "--ssh-arg=Port=2222" in remote_command and "--ssh-arg=/etc/tw/ssh" in remote_command  # yours, on the relay
    assert remote_command.endswith("-- agent --match a:1")
    assert first.argv[:2] == ["ssh", "-o"] and "n000" in first.argv  # the viewer's own ssh reaches the relay
    assert not any(launch.relayed for launch in plan_launches(hosts[:63], "tw", ["agent"], relay_from=64))
    assert not any(launch.relayed for launch in plan_launches(hosts, "tw", ["agent"], relay_from=0))
    assert [len(g) for g in relay_groups(hosts[:5])] == [3, 2]


def test_a_relay_told_to_stop_stops_its_agents_too(tmp_path):
    """SIGTERM (the viewer's ssh going away) ends the relay and, through their stdin and their
    process groups, the agents it started."""
    import signal
    import subprocess

    import psutil

    agent = tmp_path / "tw"
    agent.write_text(f"#!{sys.executable}\n" + ECHO.replace("sys.argv[1]", "'n0'"))
    agent.chmod(0o755)
    relay = subprocess.Popen([sys.executable, "-m", "trainwatch.tui.cli", "relay", "--self", "n0",
                              "--remote-trainwatch", str(agent), "--", "agent", "--match", "a:1"],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, start_new_session=True)
    try:
        first = relay.stdout.readline().decode()
        assert first.startswith("0: ") and '"hello": true' in first
        agents = [p for p in psutil.Process(relay.pid).children(recursive=True)]
        assert agents
        relay.send_signal(signal.SIGTERM)
        assert relay.wait(timeout=10) == 0
        psutil.wait_procs(agents, timeout=10)
        assert not [p for p in agents if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]
    finally:
        if relay.poll() is None:
            os.killpg(relay.pid, signal.SIGKILL)
            relay.wait()
