"""Test helpers for the real SLURM of tests/infra/slurm_up.sh: two nodes (tw1, tw2) on this machine.

Each node's slurmd runs in its own PID, UTS and mount namespace, so a command run "on a node"
(:func:`on_node`, through ``nsenter``) sees only that node's processes and hostname, as on a
real cluster; the nodes share the machine's network (loopback).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from pathlib import Path

SLURM_UP = Path(__file__).resolve().parent / "infra" / "slurm_up.sh"
RUN_DIR = Path("/run/trainwatch-slurm")
NODES = ("tw1", "tw2")
TOOLS = ("munged", "slurmctld", "slurmd", "sbatch", "srun", "squeue", "scancel", "nsenter", "unshare")


def in_ci() -> bool:
    return os.environ.get("CI", "").lower() in ("1", "true", "yes")


def unavailable_reason() -> str | None:
    """Why the real-SLURM tests cannot run here (None: they can)."""
    missing = [t for t in TOOLS if shutil.which(t) is None and not os.access(f"/usr/sbin/{t}", os.X_OK)]
    if missing:
        return f"needs SLURM and munge ({', '.join(missing)} missing): apt-get install -y slurm-wlm munge"
    if os.geteuid() != 0:
        return "the SLURM tests run as root (munged, slurmd, namespaces)"
    return None


def up(timeout: float = 120.0) -> None:
    """Start (or check) the cluster; raises with its output when it does not come up. One caller at a
    time on this machine (pytest-xdist workers each ask)."""
    import fcntl

    RUN_DIR.mkdir(parents=True, exist_ok=True)
    with open(RUN_DIR / "up.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        done = subprocess.run([str(SLURM_UP)], capture_output=True, text=True, timeout=timeout, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"{SLURM_UP} failed ({done.returncode}):\n{done.stdout}{done.stderr}")


def node_pid(node: str) -> int:
    """The slurmd of ``node`` as this machine sees it: the namespace's first process."""
    unshare = int((RUN_DIR / f"slurmd-{node}.unshare.pid").read_text())
    children = Path(f"/proc/{unshare}/task/{unshare}/children").read_text().split()
    assert children, f"slurmd of {node} is not running"
    return int(children[0])


def on_node(node: str, argv: list[str], cwd: str | None = None) -> list[str]:
    """``argv`` run in ``node``'s namespaces: its hostname, its processes, its /proc."""
    return ["nsenter", "-t", str(node_pid(node)), "-m", "-u", "-p", f"--wd={cwd or os.getcwd()}", *argv]


def squeue(*args: str) -> list[str]:
    done = subprocess.run(["squeue", "-h", *args], capture_output=True, text=True, timeout=20, check=True)
    return done.stdout.split()


def job_steps(job_id: str) -> list[str]:
    """Step ids of the job (``squeue -s``): ``J.batch``, ``J.0``, and any trainwatch left behind."""
    return sorted(squeue("-s", "-j", job_id, "-o", "%i"))


def job_state(job_id: str) -> str | None:
    states = squeue("-j", job_id, "-o", "%T")
    return states[0] if states else None


def pids_on_node(node: str, pattern: str) -> list[int]:
    """PIDs (in the node's own numbering) of processes whose command line matches ``pattern``."""
    done = subprocess.run(on_node(node, ["pgrep", "-f", pattern]), capture_output=True, text=True,
                          timeout=20, check=False)
    return sorted(int(p) for p in done.stdout.split())


def cancel(job_id: str, timeout: float = 30.0) -> None:
    """scancel, and wait until the job has left the queue and its processes are gone."""
    subprocess.run(["scancel", job_id], capture_output=True, timeout=20, check=False)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and job_state(job_id) is not None:
        time.sleep(0.3)
