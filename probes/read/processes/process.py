"""What discovery finds: the job's processes as plain data (no stacks, no analysis yet)."""

from __future__ import annotations

from dataclasses import dataclass, field

from ...redact import redact_argv
from ...snapshot import Job, Rendezvous
from ...record import Record

# Environment variables that identify a rank and its job. Only these are kept in memory;
# the full environment is read again (and redacted) only by the evidence bundle.
JOB_ENV = (
    "RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "ROLE_RANK",
    "MASTER_ADDR", "MASTER_PORT", "CUDA_VISIBLE_DEVICES", "TORCHELASTIC_RUN_ID",
    "TORCHELASTIC_ERROR_FILE", "TORCHELASTIC_RESTART_COUNT", "SLURM_JOB_ID", "SLURM_PROCID",
    "TORCH_NCCL_DEBUG_INFO_TEMP_FILE", "TORCH_FR_DUMP_TEMP_FILE", "TORCH_NCCL_DEBUG_INFO_PIPE_FILE",
    "TRAINWATCH_RUN_DIR", "TRAINWATCH_HOOK", "NCCL_RAS_ADDR", "CUDA_DEVICE_ORDER",
    "DEEPSPEED_TIMEOUT",  # the job's collective timeout (judge/gpuwait.py)
    # torchrun's options given by environment (PET_<OPTION>, as a Kubeflow PyTorchJob or TrainJob sets them)
    "PET_NPROC_PER_NODE", "PET_NNODES", "PET_NODE_RANK", "PET_MASTER_ADDR", "PET_MASTER_PORT", "PET_RDZV_ENDPOINT",
    "PET_RDZV_BACKEND", "PET_RDZV_ID",
)


@dataclass(frozen=True, repr=False)
class RankProcess(Record):
    """One rank's main process as found in the process tree."""

    pid: int
    rank: int | None
    local_rank: int | None = None
    world_size: int | None = None
    local_world_size: int | None = None
    group_rank: int | None = None
    env: dict[str, str] = field(default_factory=dict, hash=False)  # JOB_ENV subset only
    children: tuple[int, ...] = ()  # DataLoader workers, compile workers, ...
    cmdline: tuple[str, ...] = ()
    create_time: float = 0.0
    log_path: str | None = None  # a regular file behind fd 1 or 2
    container_pid: int | None = None  # its PID in its own PID namespace (a container's), when not ours


@dataclass(frozen=True, repr=False)
class JobProcesses(Record):
    """A job as seen from this node."""

    launcher: str  # torchrun, accelerate, deepspeed, mp.spawn, python
    root_pid: int  # launcher PID, or the single process of a launcher-less job
    host: str
    ranks: tuple[RankProcess, ...] = ()
    launcher_pid: int | None = None
    world_size: int | None = None
    local_world_size: int | None = None
    nnodes: int | None = None
    master_addr: str | None = None
    master_port: int | None = None
    job_id: str | None = None
    run_dir: str | None = None  # TRAINWATCH_RUN_DIR when started by `trainwatch run`
    cmdline: tuple[str, ...] = ()
    started_at: float | None = None
    waiting_rendezvous: bool = False
    notes: tuple[str, ...] = ()
    # Other nodes that hold ranks, where the runtime records them (Ray Train's worker group) or the
    # store served here sees their connections: what ``--ray auto`` reaches. Empty where nothing says.
    peer_nodes: tuple[str, ...] = ()
    rendezvous: Rendezvous | None = None  # the store and who is connected to it, where read
    found_by: str = "tree"  # "store": its ranks were found through their store (rediscovered so)
    node_rank: int | None = None  # its launcher's --node-rank (or PET_NODE_RANK), where given
    node_id: str | None = None  # what this node is, whatever its name (namespaces.node_identity)


def job_record(job: JobProcesses) -> Job:
    """The snapshot's record of the job (its command line redacted)."""
    return Job(
        launcher=job.launcher, pid=job.root_pid, host=job.host, world_size=job.world_size,
        local_world_size=job.local_world_size, nnodes=job.nnodes, master_addr=job.master_addr,
        master_port=job.master_port, started_at=job.started_at, cmdline=tuple(redact_argv(list(job.cmdline))),
        job_id=job.job_id, waiting_rendezvous=job.waiting_rendezvous, run_dir=job.run_dir,
        rendezvous=job.rendezvous, node_id=job.node_id,
    )


# Where a job's environment sets its collective timeout: variable, seconds per unit.
# torch itself has none (init_process_group(timeout=), 10 min for NCCL by default, is code);
# TORCH_NCCL_HEARTBEAT_TIMEOUT_SEC bounds the watchdog thread's own stalls, not a collective.
TIMEOUT_VARS: tuple[tuple[str, float], ...] = (("DEEPSPEED_TIMEOUT", 60.0),)


def collective_timeout_s(env: dict[str, str]) -> float | None:
    """The collective timeout a rank's environment sets, in seconds; None when it sets none."""
    for name, unit in TIMEOUT_VARS:
        try:
            value = float(env.get(name, ""))
        except ValueError:
            continue  # unset or not a number: NCCL and torch ignore it too
        if value > 0:
            return value * unit
    return None
