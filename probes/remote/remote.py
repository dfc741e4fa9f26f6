"""Reach other nodes of a job: build ssh/srun/kubectl command lines, run them bounded, read the answer.

On each node ``trainwatch agent --match ADDR:PORT`` (``streams.py`` starts and reads it) finds
that node's ranks by job identity; this module builds the command lines, runs bounded calls (the
bundle fetch) and names failures. Every call has a timeout, and on timeout the whole process group
of the ssh/srun/kubectl child is killed.
"""

from __future__ import annotations

import json
import shlex
import shutil
import subprocess
import tarfile
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from ..process_group import kill_groups
from .node_spec import DEFAULT_PARALLEL, DEFAULT_TIMEOUT_S

STDERR_KEEP = 4000  # bytes of a node call's stderr kept for its error message


class Remote(Protocol):
    """One other node (or pod) and how to run a command there."""

    name: str  # how the user knows the node: host, SLURM node, pod

    def argv(self, trainwatch: str, args: list[str]) -> list[str]:
        """Local command line that runs ``trainwatch args...`` on the node."""

    def shell_argv(self, script: str) -> list[str]:
        """Local command line that runs a POSIX shell script on the node."""


@dataclass(frozen=True)
class SshRemote:
    """A node reached with OpenSSH; the user's ssh config and agent apply (no ``-F`` by default)."""

    name: str
    destination: str = ""  # user@host, host, or ssh://user@host:port; defaults to name
    options: tuple[str, ...] = ()  # extra ssh arguments, e.g. ("-o", "Port=2222")
    connect_timeout: int = 10
    ssh: str = "ssh"

    def _base(self) -> list[str]:
        return [self.ssh, "-o", "BatchMode=yes", "-o", f"ConnectTimeout={self.connect_timeout}",
                *self.options, "--", self.destination or self.name]

    def argv(self, trainwatch: str, args: list[str]) -> list[str]:
        # ssh hands one string to the remote shell: trainwatch may be "env PATH=... trainwatch".
        return [*self._base(), f"{trainwatch} {shlex.join(args)}"]

    def shell_argv(self, script: str) -> list[str]:
        return [*self._base(), f"sh -c {shlex.quote(script)}"]

    def stream_argv(self, trainwatch: str, args: list[str]) -> list[str]:
        """A long-running command whose stdin stays connected (ssh forwards it by default)."""
        return self.argv(trainwatch, args)


@dataclass(frozen=True)
class SlurmRemote:
    """A node of a SLURM allocation, reached with a step that overlaps the running job."""

    name: str  # node name
    job_id: str
    srun: str = "srun"

    def _base(self) -> list[str]:
        return [self.srun, "--overlap", f"--jobid={self.job_id}", f"--nodelist={self.name}",
                "-N1", "-n1", "--quiet"]

    def argv(self, trainwatch: str, args: list[str]) -> list[str]:
        return [*self._base(), *shlex.split(trainwatch), *args]

    def shell_argv(self, script: str) -> list[str]:
        return [*self._base(), "sh", "-c", script]


def slurm_step_argv(job_id: str, nodes: list[str], trainwatch: str, args: list[str], srun: str = "srun") -> list[str]:
    """One step over ``nodes`` of job ``job_id``, one task per node, each output line labelled with
    its task number (``3: ...``); stdin is broadcast to every task (srun's default, said explicitly).
    ``--overlap`` shares the job's resources instead of waiting for them; a task that exits never
    ends the others (``--kill-on-bad-exit=0``)."""
    return [srun, "--overlap", f"--jobid={job_id}", f"--nodes={len(nodes)}", f"--ntasks={len(nodes)}",
            "--ntasks-per-node=1", f"--nodelist={','.join(nodes)}", "--label", "--input=all",
            "--kill-on-bad-exit=0", "--quiet", *shlex.split(trainwatch), *args]


@dataclass(frozen=True)
class KubeRemote:
    """A pod reached with ``kubectl exec``."""

    name: str  # pod name
    namespace: str | None = None
    container: str | None = None
    kubectl: str = "kubectl"

    def _base(self) -> list[str]:
        cmd = [self.kubectl, "exec"]
        if self.namespace:
            cmd += ["-n", self.namespace]
        if self.container:
            cmd += ["-c", self.container]
        return [*cmd, self.name, "--"]

    def argv(self, trainwatch: str, args: list[str]) -> list[str]:
        return [*self._base(), *shlex.split(trainwatch), *args]

    def shell_argv(self, script: str) -> list[str]:
        return [*self._base(), "sh", "-c", script]

    def stream_argv(self, trainwatch: str, args: list[str]) -> list[str]:
        """``kubectl exec -i``: the agent's stdin stays open while the viewer runs (EOF stops it)."""
        base = self._base()
        return [base[0], base[1], "-i", *base[2:], *shlex.split(trainwatch), *args]


@dataclass(frozen=True)
class Pod:
    name: str
    phase: str
    node: str | None = None
    ip: str | None = None


def kubectl_get_pods_argv(selector: str, namespace: str | None = None, kubectl: str = "kubectl") -> list[str]:
    cmd = [kubectl, "get", "pods", "-l", selector, "-o", "json"]
    return cmd + (["-n", namespace] if namespace else [])


def parse_pods(text: str) -> list[Pod]:
    """Pods from ``kubectl get pods -o json`` (a List, or a single Pod object)."""
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(f"kubectl did not print JSON: {exc}") from exc
    items = data.get("items", [data] if data.get("kind") == "Pod" else []) if isinstance(data, dict) else []
    pods = []
    for item in items:
        meta, spec, status = item.get("metadata", {}), item.get("spec", {}), item.get("status", {})
        if meta.get("name"):
            pods.append(Pod(name=meta["name"], phase=status.get("phase", "Unknown"),
                            node=spec.get("nodeName"), ip=status.get("podIP")))
    return pods


@dataclass
class Result:
    """What a remote command did."""

    returncode: int | None  # None when killed on timeout
    stdout: bytes = b""
    stderr: str = ""
    timed_out: bool = False
    elapsed_s: float = 0.0
    start_error: str | None = None  # the local ssh/srun/kubectl could not start


class Runner:
    """Runs remote commands with a timeout and can kill every one still running (``close``)."""

    def __init__(self) -> None:
        self._live: set[subprocess.Popen] = set()
        self._lock = threading.Lock()
        self.closed = False

    def run(self, argv: list[str], timeout: float, stdout_path: str | None = None) -> Result:
        """Run ``argv`` in its own session; on timeout kill the group (TERM, then KILL)."""
        started = time.monotonic()
        out = open(stdout_path, "wb") if stdout_path else subprocess.PIPE
        try:
            proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.PIPE,
                                    start_new_session=True)
        except OSError as exc:
            if stdout_path:
                out.close()
            return Result(None, start_error=f"cannot run {argv[0]}: {exc.strerror or exc}")
        with self._lock:
            if self.closed:
                kill_groups([proc])
            self._live.add(proc)
        try:
            stdout, stderr = proc.communicate(timeout=timeout)
            timed_out = False
        except subprocess.TimeoutExpired:
            kill_groups([proc])
            stdout, stderr = proc.communicate()
            timed_out = True
        finally:
            with self._lock:
                self._live.discard(proc)
            if stdout_path:
                out.close()
        return Result(None if timed_out else proc.returncode, stdout or b"",
                      (stderr or b"").decode(errors="replace")[-STDERR_KEEP:], timed_out,
                      time.monotonic() - started)

    def close(self) -> None:
        with self._lock:
            self.closed = True
            live = list(self._live)
        for proc in live:
            kill_groups([proc])


def _last_message(stderr: str) -> str:
    """The most telling stderr line: trainwatch's own message, else the last non-empty line."""
    lines = [line.strip() for line in stderr.splitlines() if line.strip()]
    ours = [line for line in lines if line.startswith("trainwatch:")]
    if ours:
        return ours[-1].removeprefix("trainwatch:").strip()
    return lines[-1] if lines else ""


_NOT_INSTALLED = ("command not found", "executable file not found", "execve()", "not found in $path")


def classify_failure(remote: Remote, result: Result, timeout: float) -> str:
    """One short reason a person can act on, naming the cause."""
    if result.start_error:
        return result.start_error
    if result.timed_out:
        return f"timeout: no answer in {timeout:g}s"
    rc, message = result.returncode, _last_message(result.stderr)
    low = result.stderr.lower()
    detail = f" ({message})" if message else ""
    if isinstance(remote, SshRemote) and rc == 255:
        if "permission denied" in low:
            return f"permission denied by ssh{detail}"
        if "host key verification failed" in low:
            return f"unreachable: host key verification failed{detail}"
        return f"unreachable{detail}"
    if rc == 127 or any(marker in low for marker in _NOT_INSTALLED) or (
            "no such file or directory" in low and "trainwatch:" not in low):
        return f"trainwatch not installed there (or not on PATH; see --remote-trainwatch){detail}"
    if rc == 126:
        return f"permission denied running trainwatch there{detail}"
    if rc in (3, 4):  # NoSuchProcess / NotAJob from the remote trainwatch
        return f"no job found there{detail}"
    if rc == 5:
        return f"permission denied{detail}"
    if rc == 6:
        return f"probe tool missing there{detail}"
    return f"failed with exit status {rc}{detail}"


def match_args(job: Any) -> list[str]:
    """How the probe on another node finds the same job: master address, else job id.

    ``job`` is a JobProcesses or a Job (both carry master_addr/master_port/job_id).
    """
    addr, port = getattr(job, "master_addr", None), getattr(job, "master_port", None)
    if addr and port:
        return ["--match", f"{addr}:{port}"]
    job_id = getattr(job, "job_id", None)
    if job_id and job_id != "none":  # torchrun's default rdzv id identifies nothing
        return ["--match-job-id", str(job_id)]
    raise ValueError("the job has neither MASTER_ADDR:MASTER_PORT nor a job id to find it on other nodes")


# --- evidence bundles from other nodes ------------------------------------------------------

def dump_script(trainwatch: str, match: list[str], extra: list[str] | None = None) -> str:
    """Shell run on a node: dump into a private temp dir, stream it back as tar.gz on stdout."""
    dump = f"{trainwatch} {shlex.join(['dump', *match, *(extra or [])])}"
    return (
        'd=$(mktemp -d "${TMPDIR:-/tmp}/trainwatch-dump.XXXXXX") || exit 1\n'
        "trap 'rm -rf \"$d\"' EXIT\n"
        f'{dump} --out "$d/bundle" >&2\n'
        "rc=$?\n"
        'if [ -e "$d/bundle" ]; then tar -C "$d" -czf - bundle || exit 70; fi\n'
        "exit $rc\n"
    )


def safe_dirname(name: str) -> str:
    """A host or pod name usable as one path component."""
    cleaned = "".join(c if c.isalnum() or c in "-_.@" else "_" for c in name).strip(".")
    return cleaned or "host"


def remote_dump(remote: Remote, runner: Runner, trainwatch: str, match: list[str], dest: Path,
                timeout: float, extra: list[str] | None = None) -> str | None:
    """Dump ``remote``'s ranks and unpack the bundle into ``dest``; returns a note on failure."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.NamedTemporaryFile(prefix="trainwatch-remote-", suffix=".tar.gz", dir=dest.parent,
                                     delete=False) as tmp:
        archive = Path(tmp.name)
    try:
        result = runner.run(remote.shell_argv(dump_script(trainwatch, match, extra)), timeout,
                            stdout_path=str(archive))
        size = archive.stat().st_size if archive.exists() else 0
        if size == 0:
            return f"{remote.name}: no bundle: {classify_failure(remote, result, timeout)}"
        try:
            _unpack(archive, dest)
        except (tarfile.TarError, OSError, EOFError) as exc:
            return f"{remote.name}: bundle could not be unpacked: {exc}"
        if result.returncode not in (0, None) or result.timed_out:
            return f"{remote.name}: bundle may be incomplete: {classify_failure(remote, result, timeout)}"
        return None
    finally:
        archive.unlink(missing_ok=True)


def _unpack(archive: Path, dest: Path) -> None:
    """Extract safely (no absolute paths, links or devices) and drop the single top folder."""
    staging = Path(tempfile.mkdtemp(prefix=".unpack-", dir=dest.parent))
    try:
        with tarfile.open(archive, "r:*") as tar:
            tar.extractall(staging, filter="data")
        top = [p for p in staging.iterdir()]
        root = top[0] if len(top) == 1 and top[0].is_dir() else staging
        inner = [p for p in root.iterdir()]
        if len(inner) == 1 and inner[0].is_dir():  # dump wrote a folder inside --out
            root = inner[0]
        dest.mkdir(parents=True, exist_ok=True)
        for item in root.iterdir():
            shutil.move(str(item), str(dest / item.name))
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def collect_remote_bundles(remotes: list[Remote], bundle_dir: Path, timeout: float = DEFAULT_TIMEOUT_S, *,
                           trainwatch: str = "trainwatch", match: list[str], parallel: int = DEFAULT_PARALLEL,
                           runner: Runner | None = None) -> list[str]:
    """Fetch every node's bundle into ``<bundle_dir>/hosts/<name>/`` in parallel; notes for the summary."""
    runner = runner or Runner()
    hosts = Path(bundle_dir) / "hosts"
    notes: list[str] = []
    if not remotes:
        return notes
    with ThreadPoolExecutor(max_workers=max(1, min(parallel, len(remotes)))) as pool:
        futures = {pool.submit(remote_dump, r, runner, trainwatch, match, hosts / safe_dirname(r.name), timeout): r
                   for r in remotes}
        for future in futures:
            note = future.result()
            notes.append(note or f"{futures[future].name}: bundle in hosts/{safe_dirname(futures[future].name)}/")
    return notes
