"""Test helpers for jobs that span nodes: a throwaway OpenSSH server on loopback and a 2-node world.

The server runs in the foreground (``sshd -D -e``) on a free port with a host key and a client
key made for this run; clients use a generated ``ssh_config`` (``-F``) so the user's own
config, agent and known_hosts are never touched. Everything is killed in ``stop()``.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path


from real_jobs import PLANTED, TORCHRUN, OwnedTree, free_port, kill_tree

SSHD_PATHS = ("/usr/sbin/sshd", "/usr/local/sbin/sshd")


def find_sshd() -> str | None:
    return next((p for p in SSHD_PATHS if os.access(p, os.X_OK)), None) or shutil.which("sshd")


def unavailable_reason() -> str | None:
    """Why the real-ssh tests cannot run here (None: they can)."""
    if not find_sshd():
        return "OpenSSH server not installed (apt-get install -y openssh-server)"
    if not shutil.which("ssh") or not shutil.which("ssh-keygen"):
        return "OpenSSH client (ssh, ssh-keygen) not installed"
    if os.geteuid() != 0:
        return "sshd tests run as root (sshd needs its privilege separation setup)"
    return None


def remote_trainwatch() -> str:
    """How the far side runs this checkout's trainwatch: this venv's python, with its tools on PATH."""
    bindir = Path(sys.executable).parent
    return f"env PATH={bindir}:/usr/local/bin:/usr/bin:/bin {sys.executable} -m trainwatch.tui.cli"


class Sshd(OwnedTree):
    def __init__(self, workdir: Path) -> None:
        self.dir = Path(workdir)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.port = free_port()
        self.proc: subprocess.Popen | None = None
        self.config = self.dir / "ssh_config"
        self.log = self.dir / "sshd.log"

    def _keygen(self, path: Path) -> None:
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(path)], check=True,
                       stdin=subprocess.DEVNULL, timeout=30)

    def start(self) -> "Sshd":
        host_key, client_key = self.dir / "host_key", self.dir / "client_key"
        self._keygen(host_key)
        self._keygen(client_key)
        authorized = self.dir / "authorized_keys"
        shutil.copy(client_key.with_suffix(".pub"), authorized)
        authorized.chmod(0o600)
        Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)  # privilege separation dir
        server_config = self.dir / "sshd_config"
        server_config.write_text(
            f"Port {self.port}\nListenAddress 127.0.0.1\nHostKey {host_key}\n"
            f"AuthorizedKeysFile {authorized}\nPidFile {self.dir / 'sshd.pid'}\n"
            "UsePAM no\nPermitRootLogin prohibit-password\nPubkeyAuthentication yes\n"
            "PasswordAuthentication no\nKbdInteractiveAuthentication no\nStrictModes no\n"
            "PrintMotd no\nLogLevel ERROR\nMaxStartups 50\nMaxSessions 50\n"
        )
        self.config.write_text(
            f"Host *\n  HostName 127.0.0.1\n  Port {self.port}\n  User {_user()}\n"
            f"  IdentityFile {client_key}\n  IdentitiesOnly yes\n  IdentityAgent none\n"
            "  StrictHostKeyChecking no\n  UserKnownHostsFile /dev/null\n  LogLevel ERROR\n"
        )
        sshd = find_sshd()
        assert sshd, unavailable_reason()
        with open(self.log, "wb") as log:
            self.proc = subprocess.Popen([sshd, "-D", "-e", "-f", str(server_config)], stdout=log,
                                         stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                         start_new_session=True)
        self._wait_ready()
        return self

    def _wait_ready(self, timeout: float = 15.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc is not None and self.proc.poll() is not None:
                raise RuntimeError(f"sshd exited ({self.proc.returncode}): {self.log.read_text()[-2000:]}")
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=1) as sock:
                    if sock.recv(64).startswith(b"SSH-"):
                        return
            except OSError:
                time.sleep(0.1)
        raise TimeoutError(f"sshd did not listen in {timeout}s: {self.log.read_text()[-2000:]}")

    @property
    def ssh_option(self) -> str:
        """The value for ``--ssh-option``."""
        return f"-F {self.config}"



def _user() -> str:
    import pwd
    return pwd.getpwuid(os.geteuid()).pw_name


class TwoNodeJob:
    """One gloo world of two torchrun "nodes" on this machine (static rendezvous on loopback).

    ``tui/planted.py`` puts the culprit on rank world-1, which lives on node 1.
    """

    def __init__(self, workdir: Path, scenario: str, nproc_per_node: int = 1, deadline: float = 60.0,
                 step_s: float = 0.05, nprocs: tuple[int, int] | None = None,
                 extra_env: dict[str, str] | None = None) -> None:
        """``nprocs``: ranks on node 0 and node 1 when they differ (torchrun allows it)."""
        self.workdir = Path(workdir)
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.script = self.workdir / "train.py"
        shutil.copy(PLANTED, self.script)
        self.port = free_port()
        self.nprocs = nprocs or (nproc_per_node, nproc_per_node)
        self.nproc = nproc_per_node
        self.env = {**os.environ, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1", **(extra_env or {})}
        self.cmds = [
            [*TORCHRUN, "--nnodes=2", f"--node-rank={node}", "--master-addr", "127.0.0.1",
             "--master-port", str(self.port), "--nproc-per-node", str(self.nprocs[node]),
             str(self.script), "--scenario", scenario, "--deadline", str(deadline), "--step-s", str(step_s)]
            for node in (0, 1)
        ]
        self.logs = [self.workdir / f"node{node}.log" for node in (0, 1)]
        self.procs: list[subprocess.Popen] = []

    def start(self) -> "TwoNodeJob":
        for cmd, log_path in zip(self.cmds, self.logs):
            with open(log_path, "wb") as log:
                self.procs.append(subprocess.Popen(cmd, cwd=self.workdir, env=self.env, stdout=log,
                                                   stderr=subprocess.STDOUT, start_new_session=True))
        return self

    @property
    def pids(self) -> list[int]:
        """The torchrun PID of each node."""
        return [p.pid for p in self.procs]

    def wait_for_ranks(self, timeout: float = 90.0, settle: float = 1.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            texts = [p.read_text(errors="replace") if p.exists() else "" for p in self.logs]
            if all(t.count("scenario ") >= n for t, n in zip(texts, self.nprocs)):
                time.sleep(settle)
                return
            for proc, text in zip(self.procs, texts):
                if proc.poll() is not None:
                    raise RuntimeError(f"node exited early ({proc.returncode}):\n{text[-3000:]}")
            time.sleep(0.2)
        raise TimeoutError("ranks did not start:\n" + "\n".join(p.read_text(errors="replace")[-1500:]
                                                                 for p in self.logs if p.exists()))

    def stop(self) -> None:
        # torchrun puts each rank in its own session: kill the tree, not just the group.
        for proc in self.procs:
            kill_tree(proc.pid)
        for proc in self.procs:
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                pass

    def __enter__(self) -> "TwoNodeJob":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
