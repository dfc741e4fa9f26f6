"""The snapshot: the one typed, immutable, JSON-serializable boundary between probes and views.

Probes produce a :class:`Snapshot`; the TUI, ``--json``, evidence bundles and remote nodes
consume it. Values a probe could not read are ``None`` (JSON ``null``, shown as ``n/a``),
never exceptions. Frames are listed innermost first, as py-spy prints them.
"""

from __future__ import annotations

import dataclasses
import json
import types
import typing
from dataclasses import dataclass, field
from typing import Any, Literal

from .record import Record

SCHEMA_VERSION = 1

# The vocabulary: every phase, state and verdict kind that a probe produces or a view shows.
# gpu_wait: the host blocks on its GPU (stream/context/event synchronize, .item(), device-to-host copy),
# or on a torch Future of asynchronous work.
# exiting: the main thread is in interpreter shutdown (threading._shutdown, atexit).
# subprocess: it waits for a child process it started; io: it is blocked reading or writing a file,
# FIFO, pipe or socket (the kernel's view says which); native: it is in a C call that holds the GIL.
Phase = Literal["collective", "gpu_wait", "dataloader", "init", "checkpoint", "lock", "sleep", "subprocess", "io",
                "native", "compute", "exiting", "unknown"]
State = Literal["running", "stuck", "exited", "missing", "unknown"]
# A group is ranks in one place: a phase, or (ranks no longer running) how they ended.
GroupPhase = Literal[Phase, "missing", "exited"]
VerdictKind = Literal["healthy", "straggler", "mismatch", "hang", "rendezvous", "crashed", "unknown"]
PHASES: tuple[Phase, ...] = typing.get_args(Phase)
STATES: tuple[State, ...] = typing.get_args(State)
GROUP_PHASES: tuple[GroupPhase, ...] = tuple(dict.fromkeys(typing.get_args(GroupPhase)))
VERDICTS: tuple[VerdictKind, ...] = typing.get_args(VerdictKind)
# A rank in one of these waits for something else (the views colour them alike; which of them may
# burn CPU without progressing is judge/progress.py's SPINNING_WAITS).
WAITING_PHASES: frozenset[Phase] = frozenset({"collective", "gpu_wait", "dataloader", "init", "lock", "sleep",
                                                "subprocess", "io", "native", "exiting"})
# Verdicts that `watch` dumps evidence for once they persist; with "crashed", the problems.
HANG_VERDICTS: frozenset[VerdictKind] = frozenset({"hang", "straggler", "mismatch", "rendezvous"})
CRASH_VERDICTS: frozenset[VerdictKind] = frozenset({"crashed"})
PROBLEM_VERDICTS: frozenset[VerdictKind] = HANG_VERDICTS | CRASH_VERDICTS
HEALTHY_VERDICTS: frozenset[VerdictKind] = frozenset({"healthy"})
# Verdicts that say nothing is wrong, or nothing could be judged: never a reason to act.
UNJUDGED_VERDICTS: frozenset[VerdictKind] = HEALTHY_VERDICTS | {"unknown"}
RAY_TRAIN = "ray train"  # Job.launcher of a Ray Train run (its ranks are Ray actors, placed by Ray)
RAY_ACTORS = "ray actors"  # Job.launcher of a worker group of plain Ray actors, found through its store


@dataclass(frozen=True, repr=False)
class Frame(Record):
    """One frame of a thread's stack: Python, or native (a shared object's symbol)."""

    function: str
    file: str
    line: int | None = None
    native: bool = False

    def label(self) -> str:
        """``file:line function`` with the file as its base name, e.g. ``train.py:88 step``."""
        short = self.file.replace("\\", "/").rsplit("/", 1)[-1]
        return f"{short}:{self.line} {self.function}" if self.line else f"{short} {self.function}"


@dataclass(frozen=True, repr=False)
class ThreadStack(Record):
    """One thread of a rank, its frames innermost first."""

    name: str
    tid: int | None = None
    frames: tuple[Frame, ...] = ()
    active: bool | None = None  # on CPU when sampled (py-spy's idle detection)
    owns_gil: bool | None = None
    is_main: bool = False


@dataclass(frozen=True, repr=False)
class LibraryError(Record):
    """What a collective library said as it failed a rank (``read/logs/library_words.py``): its own
    words, and what they tell of the collective that failed. ``mismatch``: the library says the
    ranks' calls disagree (gloo's size check, c10d's fingerprints). ``calls``: the ranks'
    collectives the text names (c10d's fingerprints of both sides, NCCL's ``WorkNCCL(...)``), one
    row per rank in a group of their own (their numbering is the library's, not the Flight Recorder's)."""

    library: str  # gloo, c10d, NCCL
    words: str  # the library's own words, as it wrote them
    mismatch: bool = False
    received_bytes: int | None = None  # gloo: a peer's data of this many bytes arrived …
    expected_bytes: int | None = None  # … where this rank's own call expected this many
    calls: tuple[RankCollective, ...] = ()


@dataclass(frozen=True, repr=False)
class ExitInfo(Record):
    """How a rank's process ended: its status or signal, and what it said on the way out."""

    code: int | None = None  # exit status of a normal exit
    signal: str | None = None  # e.g. "SIGSEGV" when killed by a signal
    at: float | None = None  # unix time the exit was seen
    first: bool = False  # the first rank of the job to die
    reason: str | None = None  # classified fatal message, e.g. "CUDA device-side assert"
    frame: str | None = None  # Python frame it died in (faulthandler), when known
    message: str | None = None  # the fatal line from the rank's log, e.g. "torch.AcceleratorError: CUDA error: ..."
    source: str | None = None  # who told how it ended: zombie, kernel exit event, launcher log, ... (None: not said)
    last_seen: float | None = None  # unix time it was last seen alive (a death not witnessed lies after it)
    library: LibraryError | None = None  # what a collective library said as it failed the rank


# Syscalls on files (a path or a file descriptor): a rank stuck in one waits on its storage.
FILE_SYSCALLS = frozenset({
    "open", "openat", "openat2", "creat", "stat", "lstat", "newfstatat", "statx", "fstat", "access", "statfs",
    "fstatfs", "read", "pread64", "readv", "write", "pwrite64", "writev", "close", "fsync", "fdatasync", "sync",
    "sync_file_range", "truncate", "ftruncate", "rename", "renameat", "renameat2", "unlink", "unlinkat", "mkdir",
    "mkdirat", "rmdir", "link", "readlink", "chmod", "getdents", "getdents64", "lseek", "flock", "fcntl"})


@dataclass(frozen=True, repr=False)
class PeerProcess(Record):
    """A local process at the other end of what a rank waits for: the child it waits for, a
    holder of the pipe, FIFO or TCP connection it is blocked on (``read/processes/peers.py``)."""

    pid: int
    command: str = ""  # its command line, secrets masked, cut at 160 characters
    age_s: float | None = None  # how long it had run when read


# What a blocked call is on (KernelState.target_kind).
TARGET_KINDS = ("file", "fifo", "pipe", "socket", "child")


@dataclass(frozen=True, repr=False)
class KernelState(Record):
    """What the kernel says a rank's main thread is doing (``read/processes/kernel_view.py``)."""

    letter: str | None = None  # the process state: R running, S sleeping, D uninterruptible, T stopped, t traced
    wchan: str | None = None  # the kernel function it sleeps in
    syscall: str | None = None  # the call it is blocked in: "newfstatat", "futex", "read", ...
    target: str | None = None  # what the call is on: "/mnt/ckpt/x.pt (fuse on /mnt/ckpt)", a socket's peer
    fs_type: str | None = None  # the filesystem of a file target: ext4, nfs4, fuse.gcsfuse, lustre, ...
    tracer: str | None = None  # who traces it: "gdb (PID 812)"
    read_bytes: int | None = None  # /proc/PID/io: bytes it made storage read and write, and all it read/wrote
    write_bytes: int | None = None
    rchar: int | None = None
    wchar: int | None = None
    kernel_stack: tuple[str, ...] = ()  # innermost first, where readable (root)
    # Unix time since which the thread has been asleep (S, D) without running once: when it last got
    # a CPU, from the scheduler (/proc/PID/task/TID/sched). Any ptrace attach wakes it, so it bounds
    # how long the wait has lasted only from a look before anyone else's (the first look, mostly).
    asleep_since: float | None = None
    tracer_since: float | None = None  # unix time the tracer process started (it attached after that)
    target_kind: str | None = None  # what the call is on: file, fifo, pipe, socket, child (TARGET_KINDS)
    # Who could answer it: the child waited for; the pipe's or FIFO's writers (its readers, for a
    # write); the local process holding a TCP connection's other end. ``peers_known``: looked for
    # (an empty ``peers`` then means none: "no process has it open for writing").
    peers: tuple[PeerProcess, ...] = ()
    peers_known: bool = False


@dataclass(frozen=True, repr=False)
class RankGpu(Record):
    """The GPU a rank runs on, and what NVML says of it and of the rank's use of it."""

    index: int | None = None  # physical device the rank runs on
    visible: tuple[int, ...] = ()  # devices it may use (CUDA_VISIBLE_DEVICES)
    util_pct: float | None = None  # device utilization
    proc_util_pct: float | None = None  # this process's SM share
    mem_used_bytes: int | None = None  # this process's GPU memory
    mem_total_bytes: int | None = None
    shared_with: tuple[int, ...] = ()  # other ranks on the same device
    # The device's activity (shown, never judged: no real recording yet shows them telling a
    # waiting NCCL kernel from real math): power draw and limit, GPM on Hopper and newer.
    power_w: float | None = None
    power_limit_w: float | None = None
    sm_active_pct: float | None = None
    tensor_active_pct: float | None = None
    dram_bw_pct: float | None = None


@dataclass(frozen=True, repr=False)
class GpuProcess(Record):
    """A process NVML lists on a GPU, with the memory it holds there."""

    pid: int  # host PID as NVML reports it
    local_pid: int | None = None  # the PID in trainwatch's namespace, when mapped
    rank: int | None = None  # None: unmapped
    mem_used_bytes: int | None = None
    util_pct: float | None = None


@dataclass(frozen=True, repr=False)
class GpuDevice(Record):
    """One GPU of a host as NVML reports it; unsupported readings are None."""

    index: int
    name: str | None = None
    uuid: str | None = None
    bus_id: str | None = None
    compute_capability: str | None = None
    util_pct: float | None = None
    mem_util_pct: float | None = None
    mem_used_bytes: int | None = None
    mem_total_bytes: int | None = None
    temperature_c: float | None = None
    power_w: float | None = None
    power_limit_w: float | None = None  # enforced power limit
    sm_active_pct: float | None = None  # GPM (Hopper and newer): SM activity over the last interval
    tensor_active_pct: float | None = None  # GPM: tensor core activity (any precision)
    dram_bw_pct: float | None = None  # GPM: DRAM bandwidth utilization
    sm_clock_mhz: int | None = None
    throttle: tuple[str, ...] = ()
    ecc_errors: int | None = None
    lost: bool = False
    processes: tuple[GpuProcess, ...] = ()


@dataclass(frozen=True, repr=False)
class HostInfo(Record):
    """One host of the job: its name, driver and GPUs, or why it could not be read."""

    name: str
    gpus: tuple[GpuDevice, ...] = ()
    driver_version: str | None = None
    cuda_driver_version: str | None = None
    nvml_version: str | None = None
    xid_events: tuple[str, ...] = ()
    error: str | None = None  # why this host could not be read (remote nodes)


@dataclass(frozen=True, repr=False)
class LogActivity(Record):
    """How a rank's log file grows: when it last grew, against how often it grew while watched."""

    age_s: float | None = None  # seconds since the file last grew (its mtime), at taken_at
    every_s: float | None = None  # median seconds between writes seen while watching (None: not learnt yet)
    longest_s: float | None = None  # longest interval between writes seen while watching
    own: bool = True  # the rank's own file; False: shared with other ranks or the launcher
    bar_s: float | None = None  # seconds per update of the unfinished progress bar that is its last line


@dataclass(frozen=True, repr=False)
class Rank(Record):
    """One rank as judged: where it is, whether it is stuck, and the evidence that says so."""

    rank: int | None
    pid: int | None = None  # None when missing
    host: str = ""
    local_rank: int | None = None
    state: State = "unknown"
    phase: Phase = "unknown"
    op: str | None = None
    where: str | None = None  # most telling frame, "file:line function"
    user_frame: str | None = None  # innermost frame in the user's own files
    # How long it has made no progress: a lower bound from the job's own evidence where that reaches
    # back before trainwatch looked (its thread asleep in one wait, its pending collective, its last
    # output), else from trainwatch's watch; ``stuck_source`` says which.
    stuck_for_s: float | None = None
    stuck_source: str | None = None
    cpu_pct: float | None = None
    rss_bytes: int | None = None
    threads: tuple[ThreadStack, ...] = ()
    gpu: RankGpu | None = None
    exit: ExitInfo | None = None
    children: tuple[int, ...] = ()  # DataLoader workers and other helpers of this rank
    log_path: str | None = None
    detail: str | None = None  # one line that explains the phase, e.g. which thread holds it
    dataloader_worker: str | None = None  # the DataLoader worker holding it up, and where (read when judged stuck)
    # What it waits for, named by mechanism (judge/waits.py): "its child process PID 812 `git push`
    # (running 4 min)", "data from FIFO /run/x (tmpfs on /run): no process has it open for writing", …
    waits_for: str | None = None
    step: int | None = None  # training step the rank is at (Flight Recorder, loop locals, HF Trainer)
    step_period_s: float | None = None  # the rank's observed time per step
    step_held_s: float | None = None  # how long its current step is known to have lasted (a lower bound; live)
    native: bool = False  # phase decided from a native (C/C++) sample
    log: LogActivity | None = None  # growth of the file at log_path
    # The telling end of its log (its error first, then its last output), secrets masked; None: not
    # read where the rank was read (another node sends it for its culprits and the ranks asked for).
    log_tail: tuple[str, ...] | None = None
    longest_quiet_s: float | None = None  # longest stretch without progress that ended in progress (live)
    collective_timeout_s: float | None = None  # the job's collective timeout, where its environment shows it
    kernel: KernelState | None = None  # the kernel's view of its main thread
    # Its PID inside its own PID namespace (a container, a pod seen from its node): what a person in
    # the container sees; None where that is ``pid``.
    container_pid: int | None = None
    # What the scheduler says of the pod it belongs to when that pod is not running it (never
    # scheduled, an image it cannot pull, dead): "llm-worker-1 is Pending: 0/8 nodes are available: …"
    scheduler: str | None = None

    @property
    def key(self) -> str:
        """Stable identity for tables: host and rank (or pid for rank-less processes)."""
        return f"{self.host}:{self.rank if self.rank is not None else 'pid' + str(self.pid)}"


@dataclass(frozen=True, repr=False)
class Group(Record):
    """Ranks in the same place doing the same thing (the rows the views fold together)."""

    ranks: tuple[int, ...]
    phase: GroupPhase
    op: str | None = None
    where: str | None = None
    label: str = ""  # compact rank list, "0-6,8"
    culprit: bool = False


@dataclass(frozen=True, repr=False)
class Verdict(Record):
    """The one answer for the whole job: what kind of trouble, which ranks, and why."""

    kind: VerdictKind = "unknown"
    culprits: tuple[int, ...] = ()
    summary: str = ""
    since: float | None = None  # unix time this verdict first held (live views)


@dataclass(frozen=True, repr=False)
class CollectiveCall(Record):
    """One collective a rank enqueued in one process group, as its Flight Recorder (or its watchdog) held it."""

    seq: int  # the group's collective sequence number
    op: str  # all_reduce, _allgather_base, ...
    sizes: str = "?"  # input sizes, "[8x4],[2]"
    dtype: str = "?"
    done: bool = False  # completed (or retired) as the rank's own record says
    created: float | None = None  # unix time it was enqueued


@dataclass(frozen=True, repr=False)
class RankCollective(Record):
    """One rank's collectives in one process group: its own record (``calls``: the recent ones,
    from a little before its last completed), and what the judge derived from it across ranks
    (``last_completed`` and the pending call, corrected where another rank shows a call never
    finished)."""

    rank: int
    pg: str = "0"
    last_enqueued: int | None = None
    last_completed: int | None = None
    op: str | None = None  # op of the last enqueued collective
    sizes: str | None = None
    dtype: str | None = None
    pending_seq: int | None = None  # oldest collective enqueued but not completed
    pending_op: str | None = None
    pending_since: float | None = None  # unix time it was enqueued (Flight Recorder time_created_ns)
    calls: tuple[CollectiveCall, ...] = ()


@dataclass(frozen=True, repr=False)
class OpCount(Record):
    """How many collectives of one kind a communicator has run (NCCL RAS)."""

    op: str  # NCCL's name: AllReduce, AllGather, ... ("collective" from NCCL < 2.26: one count for all)
    count: int  # collectives of that type the rank has launched


@dataclass(frozen=True, repr=False)
class RasRank(Record):
    """One rank of one communicator as NCCL RAS reported it (any node)."""

    comm: str  # the communicator's hash, as NCCL logs it
    comm_rank: int
    rank: int | None = None  # global rank (its rank in the job-wide communicator), when known
    host: str = ""  # the rank's node as RAS names it (its IP address)
    pid: int | None = None
    gpu: int | None = None  # CUDA device
    nvml_gpu: int | None = None
    counts: tuple[OpCount, ...] = ()
    status: str = "ok"  # ok, nocomm (answered RAS, not a member), unreachable, dead
    moving: bool | None = None  # its counts advanced since the previous poll (None: no previous poll)
    error: str | None = None  # an NCCL error the rank reported (initialization or asynchronous)
    comm_status: str | None = None  # abort, finalize, init, unknown; None: running


@dataclass(frozen=True, repr=False)
class RasState(Record):
    """What NCCL RAS said about the whole job, judged across two polls (probes/judge/ras.py)."""

    origin: str  # host:port asked
    format: str = "text"  # json or text
    nccl_version: str | None = None
    taken_at: float | None = None
    comms: tuple[str, ...] = ()  # communicator hashes; "communicator N" is the N-th
    ranks: tuple[RasRank, ...] = ()  # every rank when small; else the notable ones (culprits, local, not ok)
    kind: str | None = None  # behind, mismatch, unreachable, dead, error, abort, left, level; None: nothing wrong (yet)
    finding: str | None = None  # the kind in words, culprits with host and PID
    # The same words with each named rank's host marked, so a view that knows the nodes' names
    # (a merged one) words it again (judge/ras.py: with_names); None when no host is named.
    finding_template: str | None = None
    culprits: tuple[int, ...] = ()  # global ranks
    advancing: bool = False  # some communicator's counts advanced since the previous poll
    still_s: float | None = None  # how long the counts have not moved
    # The finding rests on one reply (counts that differ, not yet seen unchanged): the verdict uses it
    # only while every local rank is stuck waiting on its peers (judge/verdict.py _from_ras).
    first_reply: bool = False
    notes: tuple[str, ...] = ()


@dataclass(frozen=True, repr=False)
class CollectiveState(Record):
    """Where each rank is in its collectives, from Flight Recorder, RAS or the hook."""

    source: str  # where the traces came from: "hook", "flight-recorder-file", "pipe", "ras", ...
    ranks: tuple[RankCollective, ...] = ()
    divergence: str | None = None  # first point where ranks disagree, in words (judge/collectives.py)
    culprits: tuple[int, ...] = ()  # the ranks at fault there
    ras: RasState | None = None  # NCCL RAS's view of every rank, when the job's RAS answered


@dataclass(frozen=True, repr=False)
class Rendezvous(Record):
    """The job's rendezvous as this node's sockets show it (``read/processes/rendezvous.py``): its
    TCPStore, how its ranks were numbered, and, for a launcher still waiting, the nodes it waits for."""

    store: str | None = None  # "10.0.0.1:29500": the TCPStore's address
    served_here: bool = False  # its server runs on this node: every node's connection to it shows here
    host_pid: int | None = None  # the process serving it, on this node
    # what numbered ranks found through their store (environment, locals, start order); None: not so found
    numbered_by: str | None = None
    nodes_joined: int | None = None  # nodes connected to it (their launchers, or other addresses), when served here
    missing_nodes: tuple[int, ...] = ()  # node ranks no launcher has joined for (static rendezvous: by --node-rank)
    missing_ranks: tuple[int, ...] = ()  # the global ranks those nodes would run (nproc per node, as here)


@dataclass(frozen=True, repr=False)
class AttemptEnd(Record):
    """How one attempt of a job its launcher restarted ended (torchrun ``--max-restarts``): the
    launcher's first failure of that attempt, with what the rank said (``read/logs/attempts.py``)."""

    attempt: int  # 0 for the first run, as TORCHELASTIC_RESTART_COUNT counts
    rank: int | None
    exit: ExitInfo  # how that rank ended: status or signal, reason, message, frame; ``at`` its end
    started_at: float | None = None  # when the attempt began, where known (the end of the one before)


@dataclass(frozen=True, repr=False)
class PodState(Record):
    """One pod of the job as Kubernetes reports it (``kubectl get pods -o json``), in its own words:
    a pod that never ran or died says why there, not on any node trainwatch can read."""

    name: str
    pod_phase: str = "Unknown"  # Kubernetes' phase of the pod: Pending, Running, Succeeded, Failed, Unknown
    node: str | None = None  # the Kubernetes node it was placed on (None: not scheduled)
    node_rank: int | None = None  # its rank among the job's nodes (PET_NODE_RANK, --node-rank, ...)
    ranks: tuple[int, ...] = ()  # the global ranks it runs: node rank x ranks per node, where known
    reason: str | None = None  # Unschedulable, ImagePullBackOff, CrashLoopBackOff, OOMKilled, Evicted, ...
    message: str | None = None  # Kubernetes' own message ("0/8 nodes are available: ...")
    exit_code: int | None = None  # its container's last exit, where it ended
    restarts: int = 0
    ended_at: float | None = None  # unix time that last exit was, where known
    words: str = ""  # all of it in one line: "llm-worker-1 is Pending: 0/8 nodes are available: ..."


@dataclass(frozen=True, repr=False)
class Job(Record):
    """The job as discovered: its launcher, size, rendezvous and run directory."""

    launcher: str  # torchrun, accelerate, deepspeed, mp.spawn, python, ...
    pid: int
    host: str
    world_size: int | None = None
    local_world_size: int | None = None
    nnodes: int | None = None
    master_addr: str | None = None
    master_port: int | None = None
    started_at: float | None = None
    cmdline: tuple[str, ...] = ()  # redacted
    job_id: str | None = None  # TORCHELASTIC_RUN_ID or SLURM_JOB_ID
    waiting_rendezvous: bool = False
    run_dir: str | None = None  # set when started armed by `trainwatch run`
    # Who stopped the job from outside, where something says so: "SIGTERM to the launcher" (its log)
    stopped_by: str | None = None
    rendezvous: Rendezvous | None = None  # its store and who is connected to it, where read
    # A launcher that restarted its ranks: the attempt running now (TORCHELASTIC_RESTART_COUNT), when
    # it began, and how each attempt before it ended (judge/restarts.py).
    attempt: int | None = None
    attempt_started_at: float | None = None
    attempts: tuple[AttemptEnd, ...] = ()
    # What the node read is, whatever its name: the kernel's boot ID and the job's PID namespace, so a
    # pod named as its node (hostNetwork) or reached twice is one node, and two pods of a node two.
    node_id: str | None = None
    pods: tuple[PodState, ...] = ()  # the job's pods as Kubernetes reports them (--k8s), every phase


@dataclass(frozen=True, repr=False)
class Snapshot(Record):
    """Everything known of the job at one moment, judged: the typed, immutable boundary every view reads."""

    job: Job
    ranks: tuple[Rank, ...] = ()
    groups: tuple[Group, ...] = ()
    verdict: Verdict = field(default_factory=Verdict)
    hosts: tuple[HostInfo, ...] = ()
    collectives: CollectiveState | None = None
    warnings: tuple[str, ...] = ()  # facts a person should act on
    notes: tuple[str, ...] = ()  # what could not be collected, and why
    taken_at: float = 0.0
    window_s: float = 0.0
    source: str = "live"  # live, remote, bundle:<path>
    version: int = SCHEMA_VERSION

    def to_dict(self) -> dict[str, Any]:
        data = _encode(self)
        return {"version": data.pop("version"), **data}  # first: a reader checks it before the rest

    def to_json(self, indent: int | None = 2) -> str:
        return json.dumps(self.to_dict(), indent=indent)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Snapshot:
        """Rebuild a snapshot; unknown keys are ignored so newer producers stay readable."""
        if not isinstance(data, dict) or "job" not in data:
            raise SnapshotError("not a trainwatch snapshot (no 'job')")
        try:
            return _decode(cls, data)
        except (TypeError, ValueError, KeyError, AttributeError) as exc:
            raise SnapshotError(f"damaged snapshot: {exc}") from exc

    @classmethod
    def from_json(cls, text: str) -> Snapshot:
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise SnapshotError(f"not JSON: {exc}") from exc
        return cls.from_dict(data)

    def rank(self, number: int) -> Rank | None:
        return next((r for r in self.ranks if r.rank == number), None)


class SnapshotError(ValueError):
    """A snapshot document that cannot be read."""


def _encode(value: Any) -> Any:
    if dataclasses.is_dataclass(value):
        return {f.name: _encode(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, (tuple, list)):
        return [_encode(v) for v in value]
    return value


def _decode(tp: Any, value: Any) -> Any:
    return _decoder(tp)(value)


_DECODERS: dict[Any, Any] = {}


def _decoder(tp: Any):
    """A function that rebuilds values of type ``tp``; built once per type, so big jobs decode fast."""
    if tp in _DECODERS:
        return _DECODERS[tp]
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        inner = _decoder(next(a for a in typing.get_args(tp) if a is not type(None)))
        fn = lambda v: None if v is None else inner(v)  # noqa: E731
    elif origin is tuple:
        item = _decoder(typing.get_args(tp)[0])
        fn = lambda v: tuple(item(x) for x in _expect(v, list, tp))  # noqa: E731
    elif dataclasses.is_dataclass(tp):
        fn = _dataclass_decoder(tp)
    elif tp is float:
        fn = lambda v: float(_expect(v, (int, float), tp))  # noqa: E731
    elif tp in (int, str, bool):
        fn = lambda v: _expect(v, tp, tp)  # noqa: E731
    elif origin is Literal:  # the vocabulary: read as plain strings, so newer producers stay readable
        fn = lambda v: _expect(v, str, str)  # noqa: E731
    else:
        fn = lambda v: v  # noqa: E731
    _DECODERS[tp] = fn
    return fn


def _dataclass_decoder(tp: type):
    hints = typing.get_type_hints(tp)
    fields = {f.name: None for f in dataclasses.fields(tp)}

    def decode(value: Any) -> Any:
        _expect(value, dict, tp)
        kwargs = {}
        for key, item in value.items():
            if key in fields:
                if fields[key] is None:
                    fields[key] = _decoder(hints[key])
                kwargs[key] = fields[key](item)
        return tp(**kwargs)
    return decode


def _expect(value: Any, kind: Any, tp: Any) -> Any:
    if not isinstance(value, kind) or (kind in (int, float, (int, float)) and isinstance(value, bool)):
        raise TypeError(f"expected {getattr(tp, '__name__', tp)}, got {type(value).__name__}")
    return value


def who(ranks: typing.Iterable[int]) -> str:
    """``rank 3`` or ``ranks 0-2,5``."""
    items = sorted(ranks)
    return f"rank {items[0]}" if len(items) == 1 else f"ranks {compact_ranks(items)}"


def compact_ranks(ranks: typing.Iterable[int]) -> str:
    """``[0,1,2,3,5,7,8]`` -> ``"0-3,5,7-8"``."""
    items = sorted(set(ranks))
    parts: list[str] = []
    i = 0
    while i < len(items):
        j = i
        while j + 1 < len(items) and items[j + 1] == items[j] + 1:
            j += 1
        parts.append(str(items[i]) if i == j else f"{items[i]}-{items[j]}")
        i = j + 1
    return ",".join(parts)


def age_text(seconds: float) -> str:
    """``27 s``, ``4 min``, ``2.5 h``: rounded down (an age is a lower bound)."""
    if seconds < 120:
        return f"{int(seconds)} s"
    if seconds < 7200:
        return f"{int(seconds // 60)} min"
    return f"{int(seconds // 360) / 10:.1f} h"
