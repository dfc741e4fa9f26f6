"""Test helpers: two real "hosts" on this machine, each with its own PID, UTS, mount and network namespace.

``TwoHosts`` makes node1 and node2: each one a namespace (``unshare``) whose first process holds it,
its own hostname and /proc, and one end of a veth pair: node1 is 10.213.0.1/30 and node2 is
10.213.0.2/30. That /30 exists only between the two namespaces (no route, no other interface but
their own loopback), so no traffic leaves them. Each node runs its own sshd (root, key-based).
``stop()`` kills each namespace's first process, which ends everything in it and the veth with it.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

from sshd import find_sshd

ADDRS = {"node1": "10.213.0.1", "node2": "10.213.0.2"}
PREFIX = 30
IFNAME = "tw0"  # each node's end of the veth, renamed inside its namespace (GLOO_SOCKET_IFNAME)
SLURM_TOOLS = ("munged", "slurmctld", "slurmd", "sbatch", "srun", "squeue", "scancel", "sinfo")
TOOLS = ("unshare", "nsenter", "ip", "ssh", "ssh-keygen")


def in_ci() -> bool:
    return os.environ.get("CI", "").lower() in ("1", "true", "yes")


def unavailable_reason() -> str | None:
    """Why the two-host tests cannot run here (None: they can)."""
    missing = [t for t in TOOLS if shutil.which(t) is None]
    if missing:
        return f"needs {', '.join(missing)} (apt-get install -y util-linux iproute2 openssh-client)"
    if not find_sshd():
        return "OpenSSH server not installed (apt-get install -y openssh-server)"
    if os.geteuid() != 0:
        return "the two-host test runs as root (namespaces, veth, sshd)"
    return None


def _run(argv: list[str], timeout: float = 20) -> subprocess.CompletedProcess:
    done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} failed ({done.returncode}): {done.stderr.strip()}")
    return done


class TwoHosts:
    def __init__(self, workdir: Path) -> None:
        self.dir = Path(workdir)
        self.dir.mkdir(parents=True, exist_ok=True)
        tag = f"{os.getpid() % 100000}"
        self.veth = {"node1": f"tw{tag}a", "node2": f"tw{tag}b"}  # unique on this machine while they live
        self.holders: dict[str, subprocess.Popen] = {}
        self.init_pid: dict[str, int] = {}
        self.ssh_config = self.dir / "ssh_config"
        self.slurm_conf: Path | None = None
        self.sshd_logs = {n: self.dir / f"sshd-{n}.log" for n in ADDRS}

    # --- namespaces ---------------------------------------------------------------------------

    def start(self) -> "TwoHosts":
        try:
            for node in ADDRS:
                self._namespace(node)
            self._link()
            self._sshd()
        except BaseException:
            self.stop()
            raise
        return self

    def _namespace(self, node: str) -> None:
        # --kill-child: if unshare dies, so does the namespace's first process (and all in it).
        holder = subprocess.Popen(
            ["unshare", "--pid", "--uts", "--net", "--mount", "--fork", "--mount-proc", "--kill-child",
             # The namespace's first process: a shell that waits, so it reaps orphans as init must.
             "sh", "-c", f"hostname {node} && ip link set lo up && sleep 100000 & wait"],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
            start_new_session=True)
        self.holders[node] = holder
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            children = Path(f"/proc/{holder.pid}/task/{holder.pid}/children")
            pids = children.read_text().split() if children.exists() else []
            if pids and _children(int(pids[0])):  # set up: sleep started
                self.init_pid[node] = int(pids[0])
                return
            if holder.poll() is not None:
                raise RuntimeError(f"unshare for {node} failed: {holder.stderr.read().decode(errors='replace')}")
            time.sleep(0.05)
        raise TimeoutError(f"namespace of {node} did not come up")

    def _link(self) -> None:
        a, b = self.veth["node1"], self.veth["node2"]
        _run(["ip", "link", "add", a, "type", "veth", "peer", "name", b])
        for node, dev in self.veth.items():
            _run(["ip", "link", "set", dev, "netns", str(self.init_pid[node])])
            _run(self.on(node, ["ip", "link", "set", dev, "name", IFNAME]))
            _run(self.on(node, ["ip", "addr", "add", f"{ADDRS[node]}/{PREFIX}", "dev", IFNAME]))
            _run(self.on(node, ["ip", "link", "set", IFNAME, "up"]))

    def on(self, node: str, argv: list[str], cwd: str | None = None) -> list[str]:
        """``argv`` run on ``node``: in its namespaces, with this venv's tools first on PATH."""
        path = f"{Path(sys.executable).parent}:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
        env = [f"PATH={path}"] + ([f"SLURM_CONF={self.slurm_conf}"] if self.slurm_conf else [])
        return ["nsenter", "-t", str(self.init_pid[node]), "-m", "-u", "-p", "-n",
                f"--wd={cwd or os.getcwd()}", "env", *env, *argv]

    # --- sshd on each node --------------------------------------------------------------------

    def _keygen(self, path: Path) -> None:
        _run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(path)], timeout=30)

    def _sshd(self) -> None:
        client_key = self.dir / "client_key"
        self._keygen(client_key)
        authorized = self.dir / "authorized_keys"
        shutil.copy(client_key.with_suffix(".pub"), authorized)
        authorized.chmod(0o600)
        Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)  # privilege separation dir
        hosts = ""
        for node, addr in ADDRS.items():
            host_key = self.dir / f"host_key_{node}"
            self._keygen(host_key)
            config = self.dir / f"sshd_config_{node}"
            config.write_text(
                f"Port 22\nListenAddress {addr}\nHostKey {host_key}\nAuthorizedKeysFile {authorized}\n"
                f"PidFile {self.dir / f'sshd-{node}.pid'}\nUsePAM no\nPermitRootLogin prohibit-password\n"
                "PubkeyAuthentication yes\nPasswordAuthentication no\nKbdInteractiveAuthentication no\n"
                "StrictModes no\nPrintMotd no\nLogLevel ERROR\nMaxStartups 50\nMaxSessions 50\n")
            with open(self.sshd_logs[node], "wb") as log:
                # Started in the node's namespaces, sshd dies with them.
                subprocess.Popen(self.on(node, [find_sshd() or "sshd", "-D", "-e", "-f", str(config)]),
                                 stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                 start_new_session=True)
            hosts += f"Host {node}\n  HostName {addr}\n"
        self.ssh_config.write_text(
            hosts + f"Host *\n  User root\n  IdentityFile {client_key}\n  IdentitiesOnly yes\n"
            "  IdentityAgent none\n  StrictHostKeyChecking no\n  UserKnownHostsFile /dev/null\n"
            "  LogLevel ERROR\n  ConnectTimeout 5\n")
        for src, dst in (("node1", "node2"), ("node2", "node1")):
            self._wait_ssh(src, dst)

    def _wait_ssh(self, src: str, dst: str, timeout: float = 20.0) -> None:
        deadline = time.monotonic() + timeout
        done = None
        while time.monotonic() < deadline:
            done = subprocess.run(self.on(src, ["ssh", "-F", str(self.ssh_config), "-o", "BatchMode=yes",
                                                dst, "hostname"]),
                                  capture_output=True, text=True, timeout=20, check=False)
            if done.returncode == 0 and done.stdout.strip() == dst:
                return
            time.sleep(0.2)
        raise TimeoutError(f"ssh {src} -> {dst} did not work in {timeout:g}s: "
                           f"{done.stderr if done else ''}{self.sshd_logs[dst].read_text()[-1500:]}")

    # --- SLURM across the two nodes ------------------------------------------------------------

    def start_slurm(self, timeout: float = 60.0) -> None:
        """slurmctld on node1 and a slurmd on each node, over the veth; munged is the machine's own
        (tests/infra/slurm_up.sh starts it; its socket is a file, reachable from every namespace)."""
        state = self.dir / "slurm"
        for sub in ("ctld", "node1", "node2", "log"):
            (state / sub).mkdir(parents=True, exist_ok=True)
        conf = state / "slurm.conf"
        cpus = os.cpu_count() or 1
        conf.write_text(
            f"ClusterName=twohosts\nSlurmctldHost=node1({ADDRS['node1']})\nSlurmUser=root\n"
            "AuthType=auth/munge\nCredType=cred/munge\nMpiDefault=none\nProctrackType=proctrack/linuxproc\n"
            "TaskPlugin=task/none\nJobAcctGatherType=jobacct_gather/none\n"
            "AccountingStorageType=accounting_storage/none\nSelectType=select/cons_tres\n"
            "SelectTypeParameters=CR_Core\nReturnToService=2\nInactiveLimit=0\nKillWait=5\n"
            f"StateSaveLocation={state / 'ctld'}\nSlurmdSpoolDir={state}/%n\n"
            f"SlurmctldPidFile={state / 'slurmctld.pid'}\nSlurmdPidFile={state}/slurmd-%n.pid\n"
            f"SlurmctldLogFile={state / 'log' / 'slurmctld.log'}\nSlurmdLogFile={state}/log/slurmd-%n.log\n"
            + "".join(f"NodeName={n} NodeAddr={a} CPUs={cpus} State=UNKNOWN\n" for n, a in ADDRS.items())
            + "PartitionName=two Nodes=node1,node2 Default=YES MaxTime=INFINITE State=UP OverSubscribe=FORCE\n")
        self.slurm_conf = conf
        # In the nodes' namespaces, the daemons die with them.
        daemons = [("node1", ["slurmctld", "-D", "-i", "-f", str(conf)])]
        daemons += [(n, ["slurmd", "-D", "-N", n, "-f", str(conf)]) for n in ADDRS]
        for node, argv in daemons:
            with open(state / "log" / f"{argv[0]}-{node}.out", "wb") as log:
                subprocess.Popen(self.on(node, argv), stdin=subprocess.DEVNULL, stdout=log,
                                 stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.monotonic() + timeout
        states = ""
        while time.monotonic() < deadline:
            done = subprocess.run(self.on("node1", ["sinfo", "-h", "-N", "-o", "%N %t"]), capture_output=True,
                                  text=True, timeout=20, check=False)
            states = done.stdout + done.stderr
            if sum(1 for line in done.stdout.splitlines() if line.split()[1:] == ["idle"]) == len(ADDRS):
                return
            time.sleep(0.5)
        logs = "".join(p.read_text(errors="replace")[-1000:] for p in (state / "log").iterdir())
        raise TimeoutError(f"SLURM on the two nodes did not come up idle in {timeout:g}s: {states}\n{logs}")

    # --- teardown -----------------------------------------------------------------------------

    def stop(self) -> None:
        """Kill each namespace (its first process takes everything in it along), then any veth left."""
        for pid in self.init_pid.values():
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        for holder in self.holders.values():
            try:
                holder.wait(timeout=10)
            except subprocess.TimeoutExpired:
                holder.kill()
                holder.wait(timeout=10)
        for dev in self.veth.values():  # gone with its namespace; still here only if never moved
            if Path(f"/sys/class/net/{dev}").exists():
                subprocess.run(["ip", "link", "del", dev], capture_output=True, timeout=10, check=False)

    def __enter__(self) -> "TwoHosts":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _children(pid: int) -> list[str]:
    try:
        return Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
    except OSError:
        return []
