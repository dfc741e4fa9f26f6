"""Live views of a job on many nodes: one streaming agent per node, started once, read as it writes.

``StreamSource`` starts ``trainwatch agent`` on the other nodes: ONE ``srun`` step for all nodes
of a SLURM job (lines labelled with the task number), one ssh per host, one ``kubectl exec -i``
per pod. One thread reads every stream (epoll) and decodes the compact lines as they come; a
supervisor thread starts agents (at most ``parallel`` connecting at once), restarts one that
dies (with back-off) and names its nodes meanwhile. ``poll()`` merges the latest answer of
every node with this node's own snapshot and judges the whole job once. ``close()`` kills every
agent's process group; the agents also stop by themselves when their stdin closes.
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import re
import resource
import selectors
import shutil
import tarfile
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from ..errors import TrainwatchError
from ..gc_pause import gc_paused
from ..judge.judgement import JudgeMemory
from ..process_group import kill_groups
from ..snapshot import Job, Snapshot, SnapshotError
from .bundles import safe_dirname, unpack_bundle
from .calls import STDERR_KEEP, Result, classify_failure
from .launches import Launch, agent_args, direct_launch, plan_launches, popen_agent
from .merge import NodeView, merge_nodes
from .node_evidence import NodeEvidence
from .node_spec import DEFAULT_TIMEOUT_S, RELAY_FROM, RESTART_MAX_S, RESTART_MIN_S
from .pods import Pod
from .reach import KubeRemote, Remote
from .wire import SRUN_PIECE, NodeAnswer, decode_node
from ..record import Record

LABEL = re.compile(rb"^\s*(\d+): ?(.*)$", re.S)
SRUN_TASK = re.compile(r"task (\d+): (.+)$")
STREAM_START_PARALLEL = 128  # agents connecting at once (a start is short; the agent then stays)
# The first answers are called for this long after a window has passed since the agents were
# launched: an agent still in its first window (started late: a relay's hop, a slow node) then
# answers once it has watched half of it (live.MIN_FIRST_LOOK), with the others, not a window later.
FIRST_CALL_S = 1.0
FIRST_CALL = b'{"answer": "first"}\n'
REUSE_S = 300.0  # an answer older than this is no longer shown
PODS_EVERY_S = 10.0  # live views list a --k8s job's pods again this often (a Pending pod that starts, one that dies)
SHORT_LOOK = 0.95  # a first answer that watched less than this share of the window is named


@dataclass(repr=False)
class NodeState(Record):
    """What the viewer knows of one node."""

    name: str
    answer: NodeAnswer | None = None  # the latest snapshot
    answered_at: float | None = None  # monotonic
    error: str | None = None  # why the node has no (fresh) answer
    error_at: float | None = None
    bytes: int = 0
    lines: int = 0


@dataclass(repr=False)
class Incoming(Record):
    """One node's bundle while its parts arrive."""

    path: Path
    parts: int = 0
    done: bool = False
    error: str | None = None


@dataclass(repr=False)
class Running(Record):
    """A launch while its process runs."""

    launch: Launch
    index: int
    proc: Any
    started: float
    buffers: dict[int, bytearray] = field(default_factory=dict)
    stderr: bytearray = field(default_factory=bytearray)
    heard: set[str] = field(default_factory=set)  # nodes that wrote at least one line
    pieces: dict[int, bytes] = field(default_factory=dict)  # per srun task, a long line's pieces so far
    open_fds: int = 2
    exited_at: float | None = None


class StreamSource(NodeEvidence):
    """Polls this node (``local_source``, may be None) and reads the other nodes' agents; one merged Snapshot."""

    def __init__(self, local_source: Any, remotes: Sequence[Remote], *, match: list[str],
                 trainwatch: str = "trainwatch", timeout: float = DEFAULT_TIMEOUT_S, interval: float = 2.0,
                 window: float | None = None, wait_s: float | None = None, parallel: int = STREAM_START_PARALLEL,
                 world_size: int | None = None, extra_args: Sequence[str] = (),
                 spawn: Any = None, once: bool = False, relay_from: int = RELAY_FROM,
                 pods: Sequence[Pod] = (), relist: Callable[[], list[Pod]] | None = None,
                 pod_remote: Callable[[Pod], Remote | None] | None = None, job: Job | None = None,
                 unreached: dict[str, str] | None = None) -> None:
        self.local = local_source
        # A --k8s job: its pods as last listed (their states join every merge), how to list them again
        # (live views), which pods' agents run (a pod's name, whatever host name its agent reports).
        self.pods = list(pods)
        self._relist, self._pod_remote = relist, pod_remote
        self._pods_at = time.monotonic()
        self._pods_error: str | None = None
        self._pod_names = {r.name for r in remotes if isinstance(r, KubeRemote)}
        self.bare_job = job
        self.match = list(match)
        self.trainwatch = trainwatch
        self.timeout = timeout
        self.interval = interval
        self.window = window if window is not None else getattr(local_source, "window", 2.0)
        # The first poll waits for every node's first answer (their window, a start, the network).
        self.first_wait_s = wait_s if wait_s is not None else self.window + timeout
        self.parallel = max(1, parallel)
        self.world_size = world_size
        self.memory = JudgeMemory()  # the merged view's own judgement across polls (since, tie-breaks)
        self.args = agent_args(self.match, window, interval, extra_args)
        self.remotes = list(remotes)
        self.launches = plan_launches(self.remotes, trainwatch, self.args, relay_from=relay_from, timeout=timeout)
        self.nodes = {r.name: NodeState(r.name) for r in self.remotes}
        # Nodes known unreadable before any agent (the pods of a selector Kubernetes would not list): named, never started.
        for name, error in (unreached or {}).items():
            self.nodes[name] = NodeState(name, error=error, error_at=time.monotonic())
        self._spawn = spawn or popen_agent
        self._lock = threading.Lock()
        self._answered = threading.Condition(self._lock)
        self._running: dict[int, Running] = {}  # launch index -> running process
        self._next_start: list[float] = [0.0] * len(self.launches)
        self._restarts: list[int] = [0] * len(self.launches)
        self._by_fd: dict[int, tuple[int, str]] = {}  # fd -> (launch index, "out"/"err")
        self._selector = selectors.DefaultSelector()
        self._wake_r, self._wake_w = os.pipe()
        self._selector.register(self._wake_r, selectors.EVENT_READ, None)
        self._closed = threading.Event()
        self._request = b""
        self._bundle: str | None = None  # the bundle request being answered
        self._incoming: dict[str, Incoming] = {}  # node -> its bundle so far
        self._culprits: frozenset[int] = frozenset()
        self._selected: frozenset[int] = frozenset()
        self._native: frozenset[int] = frozenset()
        # A one-shot command (snapshot, dump): every thread of every rank, not only the culprits'; and an
        # agent that stopped is not started again.
        self.once = once
        self._polls = 0
        _raise_fd_limit(3 * len(self.launches) + 64)
        self._launched = time.monotonic()
        self._called_first = False
        self._reader = threading.Thread(target=self._read_loop, name="tw-agent-reader", daemon=True)
        self._supervisor = threading.Thread(target=self._supervise, name="tw-agent-supervisor", daemon=True)
        self._reader.start()
        self._supervisor.start()
        if relist is not None and not once:
            threading.Thread(target=self._watch_pods, name="tw-pods", daemon=True).start()

    def __getattr__(self, name: str) -> Any:
        """Anything else (job, window, pid...) is the local source's."""
        local = self.__dict__.get("local")
        if local is None:
            raise AttributeError(name)
        return getattr(local, name)

    # -- a --k8s job's pods ---------------------------------------------------------------------
    def _watch_pods(self) -> None:
        """List the pods again every PODS_EVERY_S: a pod that starts gets an agent, one that stops
        running is no longer restarted, and the merge says what each is now (bounded kubectl calls)."""
        while not self._closed.wait(PODS_EVERY_S):
            assert self._relist is not None
            try:
                pods = self._relist()
            except TrainwatchError as exc:
                with self._lock:
                    self._pods_error = f"pods not listed again: {exc.message}"
                continue
            now = time.monotonic()
            with self._lock:
                self.pods, self._pods_error, self._pods_at = pods, None, now
                for pod in pods:
                    remote = self._pod_remote(pod) if self._pod_remote is not None else None
                    if remote is None or remote.name in self.nodes:
                        continue
                    self.remotes.append(remote)
                    self._pod_names.add(remote.name)
                    self.nodes[remote.name] = NodeState(remote.name)
                    self.launches.append(direct_launch(remote, self.trainwatch, self.args))
                    self._next_start.append(now)
                    self._restarts.append(0)

    def _pod_stopped(self, launch: Launch) -> bool:
        """A pod no longer running its job (it ended, or was deleted): its agent is not started again."""
        if launch.names[0] not in self._pod_names:
            return False
        pod = next((p for p in self.pods if p.name == launch.names[0]), None)
        return pod is None or not pod.running

    # -- the agents ----------------------------------------------------------------------------
    def _supervise(self) -> None:
        while not self._closed.wait(0.1):
            now = time.monotonic()
            with self._lock:
                connecting = sum(1 for run in self._running.values() if not run.heard)
                for index, launch in enumerate(self.launches):
                    run = self._running.get(index)
                    if run is not None:
                        if run.proc.poll() is not None:
                            run.exited_at = run.exited_at or now
                            # its output is read to the end first, unless a child it left holds the pipes
                            if run.open_fds == 0 or now - run.exited_at > 5.0:
                                self._ended(index, run, now)
                        elif now - run.started > self.timeout:
                            self._never_answered(run, now)
                    elif now >= self._next_start[index] and connecting < self.parallel and not self._pod_stopped(launch):
                        self._start(index, launch, now)
                        connecting += 1

    def _start(self, index: int, launch: Launch, now: float) -> None:
        try:
            proc = self._spawn(launch)
        except OSError as exc:
            self._fail(launch.names, f"cannot run {launch.argv[0]}: {exc.strerror or exc}", now)
            if self.once:
                self._next_start[index] = float("inf")
            else:
                self._backoff(index, now)
            return
        run = Running(launch, index, proc, now)
        self._running[index] = run
        for stream, kind in ((proc.stdout, "out"), (proc.stderr, "err")):
            fd = stream.fileno()
            os.set_blocking(fd, False)
            self._by_fd[fd] = (index, kind)
            run.buffers[fd] = bytearray()
            self._selector.register(fd, selectors.EVENT_READ, None)
        if self._request:
            self._send(run, self._request)
        if self._bundle is not None:  # started while bundles are collected: its nodes' are wanted too
            self._send(run, _bundle_request(self._bundle))
        if self._called_first and self._polls == 0:  # started after the call (one ssh per host, in waves)
            self._send(run, FIRST_CALL)
        os.write(self._wake_w, b"x")

    def _ended(self, index: int, run: Running, now: float) -> None:
        """The agent's process is gone: name its nodes, and start it again after a back-off. A relay
        never heard from (its own node down) gives way to one agent per node of its share."""
        del self._running[index]
        for fd in [fd for fd, (i, _) in self._by_fd.items() if i == index]:
            self._drop_fd(fd)
        code = run.proc.poll()
        result = Result(code, stderr=run.stderr.decode(errors="replace")[-STDERR_KEEP:])
        reason = classify_failure(run.launch.remote, result, self.timeout, self.trainwatch)
        if run.launch.relayed and not run.heard:
            self._fail(run.launch.names[:1], reason, now)
            self._without_relay(index, run.launch, reason, now)
        elif self.once:
            self._next_start[index] = float("inf")
            self._fail(run.launch.names, reason, now)
        else:
            delay = self._backoff(index, now)
            self._fail(run.launch.names, f"agent stopped: {reason} (starting it again in {delay:.0f}s)", now)
        for stream in (run.proc.stdin, run.proc.stdout, run.proc.stderr):
            with contextlib.suppress(OSError, AttributeError, ValueError):
                stream.close()

    def _without_relay(self, index: int, launch: Launch, reason: str, now: float) -> None:
        """The relay's own node in a launch of its own (after a back-off), each other node of its
        share in one of its own, started at once."""
        by_name = {r.name: r for r in self.remotes}
        self.launches[index] = direct_launch(launch.remote, self.trainwatch, self.args)
        if self.once:
            self._next_start[index] = float("inf")
        else:
            self._backoff(index, now)
        for name in launch.names[1:]:
            self.launches.append(direct_launch(by_name[name], self.trainwatch, self.args))
            self._next_start.append(now)
            self._restarts.append(0)

    def _backoff(self, index: int, now: float) -> float:
        delay = min(RESTART_MAX_S, RESTART_MIN_S * 2 ** self._restarts[index])
        self._restarts[index] += 1
        self._next_start[index] = now + delay
        return delay

    def _never_answered(self, run: Running, now: float) -> None:
        for name in run.launch.names:
            state = self.nodes[name]
            if name not in run.heard and state.error is None:
                state.error, state.error_at = f"timeout: no answer in {self.timeout:g}s", now
        self._answered.notify_all()

    def _fail(self, names: list[str], error: str, now: float) -> None:
        for name in names:
            state = self.nodes[name]
            state.error, state.error_at = error, now
        self._answered.notify_all()

    def _read_loop(self) -> None:
        while not self._closed.is_set():
            try:
                events = self._selector.select(timeout=0.5)
            except (OSError, ValueError) as exc:  # closed by close(); otherwise every node hears why
                if not self._closed.is_set():
                    with self._lock:
                        self._fail(list(self.nodes), f"reading the agents stopped: {exc}", time.monotonic())
                return
            with gc_paused():  # the answers that came together, decoded: many small acyclic objects
                for key, _ in events:
                    if key.fd == self._wake_r:
                        with contextlib.suppress(OSError):
                            os.read(self._wake_r, 4096)
                        continue
                    try:
                        self._read_fd(key.fd)
                    except Exception as exc:  # noqa: BLE001 - one bad stream must not stop reading the others
                        with self._lock:
                            self._lost_stream(key.fd, exc)
                            self._drop_fd(key.fd)

    def _read_fd(self, fd: int) -> None:
        try:
            chunk = os.read(fd, 1 << 16)
        except BlockingIOError:
            return  # woken for nothing: the next select says when there is more
        except OSError:
            chunk = b""
        with self._lock:
            index, kind = self._by_fd.get(fd, (None, ""))
            run = self._running.get(index) if index is not None else None
            if run is None:
                self._drop_fd(fd)
                return
            if not chunk:
                self._drop_fd(fd)
                run.open_fds -= 1
                return
            if kind == "err":
                self._stderr(run, chunk)
                return
            buffer = run.buffers.get(fd)
            if buffer is None:  # the fd number now belongs to another launch's other pipe
                self._drop_fd(fd)
                return
            buffer += chunk
            if b"\n" not in chunk:
                return
            *lines, rest = bytes(buffer).split(b"\n")
            run.buffers[fd] = bytearray(rest)
        for line in lines:  # decoded outside the lock: the UI's poll never waits on it
            self._line(run, line)

    def _lost_stream(self, fd: int, exc: Exception) -> None:
        """A stream that could not be read is dropped; its nodes say why (the supervisor restarts them)."""
        index, _kind = self._by_fd.get(fd, (None, ""))
        run = self._running.get(index) if index is not None else None
        for name in run.launch.names if run is not None else ():
            self.nodes[name].error = f"its stream could not be read: {type(exc).__name__}: {exc}"[:300]
            self.nodes[name].error_at = time.monotonic()

    def _drop_fd(self, fd: int) -> None:
        self._by_fd.pop(fd, None)
        with contextlib.suppress(KeyError, ValueError, OSError):
            self._selector.unregister(fd)

    def _stderr(self, run: Running, chunk: bytes) -> None:
        run.stderr += chunk
        del run.stderr[:-STDERR_KEEP]
        if run.launch.labelled:  # srun names a task that failed: "srun: error: n2: task 1: Exited with exit code 4"
            for line in chunk.decode(errors="replace").splitlines():
                match = SRUN_TASK.search(line)
                if match and int(match.group(1)) < len(run.launch.names):
                    name = run.launch.names[int(match.group(1))]
                    self.nodes[name].error, self.nodes[name].error_at = match.group(2), time.monotonic()

    def _line(self, run: Running, line: bytes) -> None:
        task_name = run.launch.names[0]
        if run.launch.labelled:
            match = LABEL.match(line)
            if not match:
                return
            task = int(match.group(1))
            if task >= len(run.launch.names):
                return
            piece = match.group(2)
            line = run.pieces.pop(task, b"") + piece
            if len(piece) == SRUN_PIECE:  # cut by srun: the line goes on in this task's next piece
                run.pieces[task] = line
                return
            task_name = run.launch.names[task]
        if not line.strip():
            return
        data: Any = None
        try:
            data = json.loads(line)
            if isinstance(data, dict) and "bundle" in data:
                self._bundle_line(run, data, task_name)
                return
            answer = None if isinstance(data, dict) and data.get("hello") else decode_node(data)
        except (ValueError, SnapshotError) as exc:
            answer = NodeAnswer(task_name, 0, error=f"answer is not a node answer: {exc}")
        node = data.get("node") if isinstance(data, dict) else None
        # srun's task order follows the cluster's node order: the agent's own node name wins.
        name = node if run.launch.labelled and node in self.nodes else task_name
        now = time.monotonic()
        with self._lock:
            state = self.nodes[name]
            run.heard.add(name)
            state.bytes += len(line)
            state.lines += 1
            if answer is not None and answer.snapshot is not None:
                state.answer, state.answered_at, state.error = answer, now, None
                self._restarts[run.index] = 0
            elif answer is not None:
                state.error, state.error_at = _node_error(answer), now
            self._answered.notify_all()

    def _bundle_line(self, run: Running, data: dict[str, Any], task_name: str) -> None:
        """A part of a node's bundle, or its end, for the bundle being collected."""
        node = data.get("node")
        name = node if node in run.launch.names else task_name
        with self._lock:
            incoming = self._incoming.get(name)
            if incoming is None or incoming.done or data.get("bundle") != self._bundle:
                return  # not asked for (an earlier request's late lines)
            run.heard.add(name)
            try:
                if data.get("end"):
                    incoming.done, incoming.error = True, data.get("error")
                    if incoming.error is None and data.get("parts") != incoming.parts:
                        incoming.error = f"{incoming.parts} of {data.get('parts')} parts arrived"
                    self._answered.notify_all()
                else:
                    with open(incoming.path, "ab") as out:
                        out.write(base64.b64decode(data.get("data", "")))
                    incoming.parts += 1
            except (OSError, ValueError) as exc:  # a full disk, a damaged part
                incoming.done, incoming.error = True, f"bundle could not be kept: {exc}"
                self._answered.notify_all()

    def collect_bundles(self, bundle_dir: Path, timeout: float | None = None) -> list[str]:
        """Every other node's bundle, asked of the agents already running (one request broadcast,
        the bundles come back on their streams) into ``<bundle_dir>/hosts/<node>/``; notes for the
        summary, naming each node that sent none and why."""
        timeout = timeout or self.timeout
        hosts = Path(bundle_dir) / "hosts"
        staging = Path(tempfile.mkdtemp(prefix=".incoming-", dir=bundle_dir))
        bundle = f"{os.getpid()}-{time.monotonic_ns()}"
        with self._lock:
            self._bundle = bundle
            self._incoming = {name: Incoming(staging / f"{safe_dirname(name)}.tar.gz") for name in self.nodes}
            for run in self._running.values():
                self._send(run, _bundle_request(bundle))
            deadline = time.monotonic() + timeout
            while not all(i.done or self._gone(name) for name, i in self._incoming.items()):
                left = deadline - time.monotonic()
                if left <= 0 or self._closed.is_set():
                    break
                self._answered.wait(min(left, 0.5))
            incoming, self._incoming, self._bundle = self._incoming, {}, None
        try:
            return [self._bundle_note(name, got, hosts / safe_dirname(name), timeout) for name, got in incoming.items()]
        finally:
            shutil.rmtree(staging, ignore_errors=True)

    def _gone(self, name: str) -> bool:
        """No agent answers for ``name`` now (none runs, or its relay says it stopped): its bundle
        will not come."""
        state = self.nodes[name]
        if state.error is not None and (state.answered_at is None or (state.error_at or 0) >= state.answered_at):
            return True
        return not any(name in run.launch.names for run in self._running.values())

    def _bundle_note(self, name: str, got: Incoming, dest: Path, timeout: float) -> str:
        if not got.done:
            why = self.nodes[name].error if self._gone(name) else f"timeout: not all of it in {timeout:g}s"
            return f"{name}: no bundle: {why or 'its agent is not running'}"
        if got.error is not None:
            return f"{name}: no bundle: {got.error}"
        try:
            unpack_bundle(got.path, dest)
        except (tarfile.TarError, OSError, EOFError) as exc:
            return f"{name}: bundle could not be unpacked: {exc}"
        return f"{name}: bundle in hosts/{dest.name}/"

    def _send(self, run: Running, data: bytes) -> None:
        stdin = getattr(run.proc, "stdin", None)
        if stdin is None:
            return
        try:
            os.set_blocking(stdin.fileno(), False)
            os.write(stdin.fileno(), data)
        except (OSError, ValueError):
            pass  # a full or closed pipe: the agent is busy or gone; the supervisor will see

    def request(self, full: frozenset[int], native: frozenset[int]) -> None:
        """Ask every agent for every thread of ``full`` and native frames of ``native`` (broadcast)."""
        wanted: Any = "all" if self.once else sorted(full)
        data = (json.dumps({"full": wanted, "native": sorted(native)}) + "\n").encode()
        with self._lock:
            if data == self._request:
                return
            self._request = data
            for run in self._running.values():
                self._send(run, data)

    def select(self, ranks: frozenset[int]) -> None:
        """The ranks a view shows in detail: their full stacks come from the next lines on."""
        self._selected = frozenset(ranks)
        self.request(self._culprits | self._selected | self._native, self._native)

    # -- polling ---------------------------------------------------------------------------------
    def poll(self, native_for: frozenset[int] = frozenset()) -> Snapshot:
        started = time.monotonic()
        self._native = frozenset(native_for)
        self.request(self._culprits | self._selected | native_for, native_for)
        views = [self._poll_local(native_for)] if self.local is not None else []
        if self._polls == 0:
            self._wait_first(started + self.first_wait_s)
            if self.once:
                self._wait_judged(started + self.first_wait_s)
        self._polls += 1
        now = time.monotonic()
        with self._lock:
            views += [self._view(state, now) for state in self.nodes.values()]
            pods = [p.state for p in self.pods]
            pods_error = self._pods_error
        if not any(v.snapshot is not None for v in views) and not (pods and self.bare_job is not None):
            reasons = "; ".join(f"{v.name}: {v.error}" for v in views[:5])
            raise TrainwatchError(f"no node of the job could be read ({reasons})")
        merged = merge_nodes(views, memory=self.memory, world_size=self.world_size, pods=pods, job=self.bare_job)
        if pods_error:
            merged = replace(merged, notes=(*merged.notes, pods_error))
        self._culprits = frozenset(merged.verdict.culprits)
        if self._polls == 1 and self._called_first:
            merged = replace(merged, notes=(*merged.notes, *self._short_looks(views)))
        return merged

    def _wait_first(self, deadline: float) -> None:
        call_at = self._launched + self.window + FIRST_CALL_S
        with self._lock:
            while not all(s.answer is not None or s.error is not None for s in self.nodes.values()):
                now = time.monotonic()
                if not self._called_first and now >= call_at:
                    self._called_first = True
                    for run in self._running.values():  # a relay passes it on to its agents
                        self._send(run, FIRST_CALL)
                left = deadline - now
                if left <= 0 or self._closed.is_set():
                    return
                wake = min(left, 0.5) if self._called_first else min(left, 0.5, max(0.01, call_at - now))
                self._answered.wait(wake)

    def _wait_judged(self, deadline: float) -> None:
        """A one-shot command's answer from a node that had not judged its ranks yet (its agent
        started late, on a loaded node or behind a slow ``kubectl exec``, and its first look was
        too short to tell stuck from running) is followed by its next line, which has: wait for it,
        as long as the first answers were waited for."""
        with self._lock:
            first = {name: state.answered_at for name, state in self.nodes.items()
                     if state.answer is not None and _unjudged(state.answer.snapshot)}
            while first:
                if time.monotonic() >= deadline or self._closed.is_set():
                    return
                first = {name: at for name, at in first.items()
                         if self.nodes[name].error is None and self.nodes[name].answered_at == at}
                self._answered.wait(min(0.5, max(0.01, deadline - time.monotonic())))

    def _short_looks(self, views: list[NodeView]) -> list[str]:
        """Which nodes' first answers, called for, watched less than the window."""
        short = sorted(v.snapshot.window_s for v in views
                       if v.snapshot is not None and v.snapshot.window_s < self.window * SHORT_LOOK)
        if not short:
            return []
        return [f"first answers called for {self.window + FIRST_CALL_S:g}s after the agents were started: "
                f"{len(short)} node(s) that started late had watched {short[0]:.1f}-{short[-1]:.1f}s "
                f"of the {self.window:g}s window"]

    def _view(self, state: NodeState, now: float) -> NodeView:
        answer = state.answer
        age = now - state.answered_at if state.answered_at is not None else None
        stale_after = max(3 * self.interval, self.window + 2 * self.interval)
        error_newer = state.error is not None and (state.answered_at is None or (state.error_at or 0) >= state.answered_at)
        pod = state.name in self._pod_names
        if answer is not None and age is not None and age <= REUSE_S:
            if error_newer:
                return NodeView(state.name, answer.snapshot, stale_s=age, note=state.error, pod=pod)
            return NodeView(state.name, answer.snapshot, stale_s=age if age > stale_after else None, pod=pod)
        if state.error:
            return NodeView(state.name, error=state.error, pod=pod)
        return NodeView(state.name, error="starting: no answer yet", pod=pod)

    def stats(self) -> dict[str, float]:
        """Bytes and lines received per node so far (benchmarks)."""
        with self._lock:
            states = list(self.nodes.values())
        lines = sum(s.lines for s in states)
        return {"nodes": len(states), "lines": lines, "bytes": sum(s.bytes for s in states),
                "answered": sum(1 for s in states if s.answer is not None)}

    def close(self) -> None:
        """Stop every agent (stdin closed, then its process group killed), the threads, the local source."""
        if self._closed.is_set():
            return
        self._closed.set()
        with self._lock:
            runs = list(self._running.values())
            self._running.clear()
        for run in runs:
            with contextlib.suppress(OSError, AttributeError, ValueError):
                run.proc.stdin.close()
        kill_groups([run.proc for run in runs])
        for run in runs:
            for stream in (run.proc.stdout, run.proc.stderr):
                with contextlib.suppress(OSError, AttributeError, ValueError):
                    stream.close()
        with contextlib.suppress(OSError):
            os.write(self._wake_w, b"x")
        self._reader.join(timeout=2)
        self._supervisor.join(timeout=2)
        with contextlib.suppress(OSError):
            self._selector.close()
            os.close(self._wake_r)
            os.close(self._wake_w)
        close = getattr(self.local, "close", None)
        if callable(close):
            close()


def _bundle_request(bundle: str) -> bytes:
    return (json.dumps({"bundle": bundle}) + "\n").encode()


def _unjudged(snapshot: Snapshot | None) -> bool:
    """A node's answer in which a live rank's progress was not judged yet (state unknown)."""
    return snapshot is not None and any(r.state == "unknown" and r.pid is not None for r in snapshot.ranks)


def _node_error(answer: NodeAnswer) -> str:
    if answer.code in (3, 4):
        return f"no job found there ({answer.error})"
    return answer.error or "error"


def _raise_fd_limit(needed: int) -> None:
    """Three pipes per agent: a thousand ssh agents need more than the usual soft limit of 1,024."""
    with contextlib.suppress(ValueError, OSError):
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        if soft != resource.RLIM_INFINITY and soft < needed:
            resource.setrlimit(resource.RLIMIT_NOFILE, (min(needed, hard), hard))
