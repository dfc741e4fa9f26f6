"""Find a training job from any PID: launcher, rank, DataLoader worker, or a shell above it."""

from __future__ import annotations

import os
import socket
import time
from dataclasses import replace
from pathlib import Path

from ...errors import AccessDenied, JobNotStarted, NoSuchProcess, NotAJob, TrainwatchError
from . import namespaces, procfs
from .proc import Proc, ProcessDenied, ProcessError, ProcessGone, all_processes
from . import ray_train, rendezvous
from .process import JOB_ENV, JobProcesses, RankProcess
from ...snapshot import RAY_ACTORS, RAY_TRAIN, Rendezvous, who
from ..stacks.pyspy import ptrace_remedy
from ...rundir import hook_records, implicit_run_dir, rank_log_file

LAUNCHER_MODULES = {
    "torch.distributed.run": "torchrun", "torch.distributed.launch": "torchrun",
    "accelerate.commands.launch": "accelerate", "deepspeed.launcher.launch": "deepspeed",
    "deepspeed.launcher.runner": "deepspeed",
}
LAUNCHERS = ("torchrun", "accelerate", "deepspeed")
LAUNCHER_SCRIPTS = {"torchrun": "torchrun", "accelerate": "accelerate", "deepspeed": "deepspeed"}
MAX_HELPER_DEPTH = 2  # a rank's helper (DataLoader worker, its own children) is found through the rank


def _int(value: str | None) -> int | None:
    try:
        return int(value) if value not in (None, "") else None
    except ValueError:
        return None


def launcher_kind(cmdline: list[str]) -> str | None:
    """torchrun / accelerate / deepspeed when this command line is such a launcher."""
    if not cmdline:
        return None
    args = cmdline
    if "python" in os.path.basename(cmdline[0]):  # python [-u] -m module | python /path/to/torchrun
        args = [a for a in cmdline[1:] if a not in ("-u", "-O", "-B", "-E", "-s")]
        if args[:1] == ["-m"] and len(args) > 1:
            return LAUNCHER_MODULES.get(args[1])
    name = os.path.basename(args[0]) if args else ""
    if name == "accelerate":
        return "accelerate" if "launch" in args[1:2] else None
    return LAUNCHER_SCRIPTS.get(name)


# torchrun takes each option from PET_<OPTION> when the command line does not give it (its argparse
# ``env`` action): a Kubeflow PyTorchJob or TrainJob starts a bare `torchrun train.py` so.
TORCHRUN_ENV_OPTIONS = (("--nproc-per-node", "PET_NPROC_PER_NODE"), ("--nnodes", "PET_NNODES"),
                        ("--node-rank", "PET_NODE_RANK"), ("--master-addr", "PET_MASTER_ADDR"),
                        ("--master-port", "PET_MASTER_PORT"), ("--rdzv-endpoint", "PET_RDZV_ENDPOINT"),
                        ("--rdzv-backend", "PET_RDZV_BACKEND"), ("--rdzv-id", "PET_RDZV_ID"))


def launcher_args(cmdline: tuple[str, ...] | list[str], env: dict[str, str] | None) -> list[str]:
    """A torchrun command line as torchrun reads it: the options its environment gives (``PET_*``)
    added where the command line lacks them (the command line wins)."""
    args = list(cmdline)
    given = {arg.partition("=")[0].replace("_", "-") for arg in args if arg.startswith("--")}
    extra = [f"{option}={env[name]}" for option, name in TORCHRUN_ENV_OPTIONS
             if env and env.get(name) and option not in given]
    return args + extra


def launcher_layout(cmdline: tuple[str, ...] | list[str]) -> dict[str, int]:
    """nproc_per_node / nnodes / node_rank from a torchrun-style command line, when given as numbers."""
    wanted = {"--nproc-per-node": "nproc", "--nproc_per_node": "nproc", "--nnodes": "nnodes",
              "--node-rank": "node_rank", "--node_rank": "node_rank"}
    found: dict[str, int] = {}
    for i, arg in enumerate(cmdline):
        key, _, value = arg.partition("=")
        if key in wanted:
            value = value or (cmdline[i + 1] if i + 1 < len(cmdline) else "")
            number = _int(value.split(":")[-1])
            if number is not None:
                found.setdefault(wanted[key], number)
    return found


def is_python(proc: Proc) -> bool:
    try:
        return "python" in os.path.basename(proc.exe() or proc.name()).lower()
    except ProcessError:
        return "python" in _safe(proc.name, "").lower()


def _safe(call, default):
    try:
        return call()
    except (ProcessError, OSError):
        return default


def job_env(proc: Proc) -> dict[str, str] | None:
    """The job-identifying subset of the environment; None when it cannot be read."""
    try:
        env = proc.environ()
    except ProcessDenied:
        return None
    except (ProcessGone, OSError):
        return {}
    return {k: env[k] for k in JOB_ENV if k in env}


def _identity(env: dict[str, str]) -> tuple:
    return (env.get("RANK"), env.get("MASTER_ADDR"), env.get("MASTER_PORT"), env.get("TORCHELASTIC_RUN_ID"))


def _is_spawn_child(proc: Proc) -> bool:
    cmd = _safe(proc.cmdline, [])
    return "--multiprocessing-fork" in cmd or any("multiprocessing.spawn" in a for a in cmd)


def _check_access(proc: Proc) -> None:
    try:
        proc.environ()
    except ProcessDenied:
        raise AccessDenied(f"permission denied reading PID {proc.pid}'s environment", ptrace_remedy(proc.pid)) from None
    except ProcessGone:
        pass  # gone: the caller's next read says so


def find_job(pid: int) -> JobProcesses:
    """Walk up and down the process tree from ``pid`` to the job and its ranks."""
    try:
        start = Proc(pid)
    except ProcessGone:
        raise NoSuchProcess(f"no process with PID {pid}", "check the PID with `ps -ef | grep python`") from None
    except ProcessDenied:
        raise AccessDenied(f"permission denied reading PID {pid}") from None
    _refuse_self(start)
    _check_access(start)
    if pid in _MATCHED:
        found = find_by_store(start, address=_MATCHED[pid])
        if found is not None:
            return found
    # A launcher's job is its own ranks' rendezvous, whatever started the launcher: no Ray run is
    # looked for from it (nor its memory map read for Ray's library).
    ray = None if launcher_kind(_safe(start.cmdline, [])) else ray_train.find(start)
    if ray is not None:
        return describe_ray_job(ray)
    root, launcher = _find_root(start)
    ray = ray_train.find(root) if root is not None and launcher == "python" else None
    if ray is not None:  # a shell or `timeout` above a Ray driver
        return describe_ray_job(ray)
    if root is not None and launcher == "python" and _is_own_ancestor(root) and not _is_training(root):
        root = None  # the shell, tmux, pytest... that trainwatch itself runs under
    if root is None:
        own = _is_own_ancestor(start)
        raise NotAJob(
            f"PID {pid} ({_safe(start.name, '?')}) is not a Python training job and has none beneath it"
            + (" (it is one of trainwatch's own parent processes, e.g. the shell it runs in)" if own else ""),
            "pass the PID of the launcher (torchrun, accelerate, deepspeed), a rank, or the shell that started it"
            + (": `pgrep -af torchrun` lists launchers" if own else ""),
        )
    if launcher == "python":
        _refuse_plain_python(root)
    job = describe_job(root, launcher)
    if maybe_partial(job, root):
        return find_by_store(root) or job
    return job


# A job's Python loads torch in its first seconds (``import torch``: 2-4 s on a loaded 2-core
# machine); a younger process is taken as a job still starting.
STARTING_S = 10.0


def _refuse_plain_python(root: Proc) -> None:
    """A Python process with no launcher above it, none beneath it, no rank's environment and
    neither torch nor Ray loaded after its first seconds is not a training job: ``python -c
    'import time; time.sleep(300)'`` read as a rank stuck in unknown."""
    if "RANK" in (job_env(root) or {}) or procfs.maps_mention(root.pid, b"libtorch", b"/torch/_C", b"_raylet.so"):
        return  # one read of its memory map: torch or Ray
    me = os.getpid()
    if any(c.pid != me for c in _safe(root.children, [])):
        return  # a wrapper or driver whose children may be the job (the store finds them)
    age = time.time() - _safe(root.create_time, time.time())
    if age < STARTING_S:
        return
    raise NotAJob(
        f"PID {root.pid} ({_safe(root.name, '?')}) runs Python with no launcher above it, no process beneath it, "
        f"no rank's environment (RANK, WORLD_SIZE) and neither torch nor Ray loaded after {age:.0f} s: "
        "not a training job",
        "pass the PID of the launcher (torchrun, accelerate, deepspeed), a rank, or the shell that started it",
    )


def _refuse_self(proc: Proc) -> None:
    """trainwatch never takes itself, or the py-spy it runs, as the job."""
    me = os.getpid()
    parent = _safe(proc.ppid, None)
    if proc.pid == me or (parent == me and "py-spy" in _safe(proc.name, "")):
        what = "trainwatch itself" if proc.pid == me else "a py-spy run by trainwatch"
        raise NotAJob(f"PID {proc.pid} is {what}, not a training job",
                      "pass the PID of the job: its launcher (torchrun, ...), a rank, or the shell that started it")


def _is_own_ancestor(proc: Proc) -> bool:
    return proc.pid in {p.pid for p in _safe(Proc(os.getpid()).parents, [])}


def _is_training(proc: Proc) -> bool:
    """A Python process above trainwatch is a job only if it is a rank or has torch loaded."""
    if "RANK" in (job_env(proc) or {}):
        return True
    return procfs.maps_mention(proc.pid, b"libtorch", b"/torch/_C")


def find_job_matching(master: str | None = None, job_id: str | None = None) -> JobProcesses:
    """The local job whose ranks have MASTER_ADDR:MASTER_PORT == ``master`` or this job id; a
    launcher with no rank started yet whose store is ``master`` (it waits for the other nodes)."""
    address = _parse_address(master) if master else None
    for proc in all_processes():
        env = job_env(proc)
        if not env or "RANK" not in env:
            if address is not None and env is not None and _launcher_at(proc, env, address):
                return find_job(proc.pid)
            continue
        same_master = master and f"{env.get('MASTER_ADDR')}:{env.get('MASTER_PORT')}" == master
        same_id = job_id and job_id in (env.get("TORCHELASTIC_RUN_ID"), env.get("SLURM_JOB_ID"))
        if same_master or same_id:
            return find_job(proc.pid)
    if address is not None:  # ranks that set MASTER_ADDR at run time (Ray actors): their connections say
        found = find_by_store(Proc(os.getpid()), address=address)
        if found is not None:
            _MATCHED[found.root_pid] = address
            return found
    if job_id:  # a Ray Train run: its ranks carry no RANK in their environment, Ray's records name them
        ray = ray_train.find_run(job_id)
        if ray is not None:
            return describe_ray_job(ray)
    wanted = master or job_id
    raise NotAJob(f"no job with {'master ' if master else 'id '}{wanted} on {socket.gethostname()}")


def find_only_job() -> JobProcesses:
    """The one training job on this node, whatever its PIDs (``trainwatch agent --match-any``, in a
    pod of the job reached with ``kubectl exec``, where a pod holds one job): the outermost launcher
    (torchrun, accelerate, deepspeed), else the Python processes that carry a rank in their
    environment. trainwatch's own processes (and what started them: the exec's shell inherits the
    pod's RANK) are never taken."""
    mine = {os.getpid(), *(p.pid for p in _safe(Proc(os.getpid()).parents, []))}
    launchers: list[Proc] = []
    ranks: list[Proc] = []
    for proc in all_processes():
        cmdline = _safe(proc.cmdline, [])
        if proc.pid in mine or not cmdline or any("trainwatch" in os.path.basename(a) for a in cmdline[:3]):
            continue
        if launcher_kind(cmdline):
            launchers.append(proc)
        elif "RANK" in (job_env(proc) or {}) and is_python(proc):
            ranks.append(proc)
    jobs: dict[int, JobProcesses] = {}
    covered: set[int] = set()
    for proc in launchers or ranks:
        if proc.pid in covered:
            continue
        try:
            job = find_job(proc.pid)
        except TrainwatchError:
            continue  # gone meanwhile, or not ours to read: another candidate may be the job
        jobs.setdefault(job.root_pid, job)
        covered |= {job.root_pid, *(r.pid for r in job.ranks), *(c for r in job.ranks for c in r.children)}
    if len(jobs) == 1:
        return next(iter(jobs.values()))
    host = socket.gethostname()
    if not jobs:
        raise NotAJob(f"no training job on {host}: no torchrun, accelerate or deepspeed launcher, and no Python "
                      "process with RANK in its environment")
    roots = ", ".join(f"{j.launcher} PID {j.root_pid}" for j in jobs.values())
    raise NotAJob(f"several training jobs on {host} ({roots})", "name the job: --match MASTER_ADDR:MASTER_PORT")


def _launcher_at(proc: Proc, env: dict[str, str], address: tuple[str, int]) -> bool:
    """A torchrun-style launcher whose store (its options, or its PET_* environment) is ``address``."""
    cmdline = _safe(proc.cmdline, [])
    if not launcher_kind(cmdline):
        return False
    return launcher_store(launcher_args(cmdline, env)) == address


# PID -> the store address a job was matched by (``--match``, an agent on another node): the job is
# found through the processes connected to it again when its PID is handed back to find_job.
_MATCHED: dict[int, tuple[str, int]] = {}


def _parse_address(text: str) -> tuple[str, int] | None:
    host, _, port = text.rpartition(":")
    number = _int(port)
    return (host.strip("[]"), number) if host and number is not None else None


def _find_root(start: Proc) -> tuple[Proc | None, str]:
    chain = [start] + _safe(start.parents, [])
    launchers = [(p, launcher_kind(_safe(p.cmdline, []))) for p in chain]
    # The outermost launcher in the chain (deepspeed's runner above its per-node launch, say).
    above = [(p, kind) for p, kind in launchers if kind]
    if above:
        return above[-1]
    env = job_env(start) or {}
    if "RANK" in env:  # a rank without a known launcher (srun, mpirun, a custom script)
        top = start
        for parent in chain[1:]:
            if _identity(job_env(parent) or {}) == _identity(env):
                top = parent  # we started on a DataLoader worker
            else:
                break
        return top, _outer_name(top)
    lightning = _lightning_root(chain)
    if lightning is not None:
        return lightning, "lightning"
    if is_python(start):  # a wrapper (trainwatch run, a job script) with the real job beneath it
        below, kind = _find_below(start, jobs_only=True)
        if below is not None:
            return below, kind
        if _is_run_wrapper(start):  # never the wrapper itself: the command it runs is the job
            me = os.getpid()
            mine = _safe(start.cmdline, [])  # a child not yet past its exec still shows the wrapper's
            command = next((c for c in _safe(start.children, []) if c.pid != me and is_python(c)
                            and not _is_helper(c.pid) and _safe(c.cmdline, mine) != mine), None)
            if command is not None:  # `trainwatch run -- python train.py`, one process
                return command, "mp.spawn" if _spawn_ranks(command) else "python"
            raise JobNotStarted(f"PID {start.pid} is `trainwatch run`, which has not started its job yet "
                          "(no launcher or Python process beneath it)", "try again in a few seconds, or pass the "
                          "launcher's PID (`pgrep -af torchrun` lists launchers)")
    if _is_spawn_child(start) and start.parent() and is_python(start.parent()):
        parent = start.parent()
        return (parent, "mp.spawn") if _spawn_ranks(parent) else (parent, "python")
    if is_python(start):
        return start, "mp.spawn" if _spawn_ranks(start) else "python"
    return _find_below(start)


def _is_run_wrapper(proc: Proc) -> bool:
    """``trainwatch run -- COMMAND`` (the console script or ``python -m trainwatch.tui.cli run``)."""
    cmd = _safe(proc.cmdline, [])
    head = cmd[: cmd.index("--")] if "--" in cmd else cmd
    return "run" in head and any(os.path.basename(a) == "trainwatch" or a.startswith("trainwatch.") for a in head)


def _outer_name(proc: Proc) -> str:
    parent = _safe(proc.parent, None)
    return os.path.basename(_safe(parent.cmdline, ["?"])[0]) if parent else "python"


def _find_below(start: Proc, jobs_only: bool = False) -> tuple[Proc | None, str]:
    """From a shell, `timeout`, srun or tmux pane: the first launcher or Python process beneath.
    With ``jobs_only``, only a launcher or a process with RANK counts (below a Python wrapper)."""
    me = os.getpid()  # never descend into trainwatch itself (`trainwatch snapshot $$` from a shell)
    frontier = [c for c in _safe(start.children, []) if c.pid != me and not _is_helper(c.pid)]
    while frontier:
        for child in sorted(frontier, key=lambda p: p.pid):
            kind = launcher_kind(_safe(child.cmdline, []))
            if kind:
                return child, kind
        for child in sorted(frontier, key=lambda p: p.pid):
            if jobs_only and _lightning_children(child):  # `trainwatch run -- python train.py` (Lightning)
                return child, "lightning"
            if jobs_only and _spawn_ranks(child):  # `trainwatch run -- python train.py` (mp.spawn)
                return child, "mp.spawn"
            if jobs_only and "RANK" in (job_env(child) or {}):
                return _find_root(child)
            if not jobs_only and is_python(child):
                return _find_root(child)
        frontier = [g for c in frontier for g in _safe(c.children, []) if g.pid != me and not _is_helper(g.pid)]
    return None, ""


def _is_lightning_child(proc: Proc, parent_cmd: list[str]) -> bool:
    """A rank started by Lightning's launcher: LOCAL_RANK, NODE_RANK and WORLD_SIZE (no RANK) in
    its environment, and its parent's script arguments again (it runs ``sys.executable
    <abs script> args`` or ``sys.executable -m module args``; the parent may have had ``-u``...)."""
    env = job_env(proc) or {}
    if "RANK" in env or not {"LOCAL_RANK", "WORLD_SIZE"} <= env.keys() or "NODE_RANK" not in _safe(proc.environ, {}):
        return False
    cmd = _safe(proc.cmdline, [])
    if len(cmd) < 2 or not parent_cmd:
        return False
    args = cmd[3:] if cmd[1] == "-m" else cmd[2:]
    return not args or parent_cmd[-len(args):] == args


def _lightning_children(parent: Proc) -> list[Proc]:
    """Ranks 1..N-1 of a Lightning job whose local rank 0 is ``parent`` (`python train.py`)."""
    if not is_python(parent):
        return []
    parent_cmd = _safe(parent.cmdline, [])
    return [c for c in _safe(parent.children, []) if _is_lightning_child(c, parent_cmd)]


def _lightning_root(chain: list[Proc]) -> Proc | None:
    """The local rank 0 of a Lightning job among ``chain`` (the start and its parents): from rank 0,
    a rank it started, or a DataLoader worker of either."""
    for proc in [p for p in chain if is_python(p)][:3]:
        if _lightning_children(proc):
            return proc
    return None


def _lightning_ranks(root: Proc) -> list[RankProcess]:
    """Lightning's launcher puts no RANK in any environment, and none at all in local rank 0's
    (it is the process the user started): global ranks come from NODE_RANK and LOCAL_RANK, and
    rank 0's job settings from its children's."""
    children = _lightning_children(root)
    if not children:
        return []
    envs = [_safe(c.environ, {}) for c in children]
    node, world = _int(envs[0].get("NODE_RANK")) or 0, _int(envs[0].get("WORLD_SIZE"))
    local_world = len(children) + 1
    shared = {k: envs[0][k] for k in ("MASTER_ADDR", "MASTER_PORT", "WORLD_SIZE") if k in envs[0]}
    tree = procfs.parent_map()  # one pass over /proc (Proc.children() rescans it per call)
    others = {pid for c in children for pid in (c.pid, *procfs.descendants(tree, c.pid))}
    ranks = []
    for proc, env in [(root, {**(job_env(root) or {}), **shared, "LOCAL_RANK": "0"}),
                      *((c, job_env(c) or {}) for c in children)]:
        local = _int(env.get("LOCAL_RANK")) or 0
        env = {**env, "RANK": str(node * local_world + local), "LOCAL_WORLD_SIZE": str(local_world)}
        if world is not None:
            env["WORLD_SIZE"] = str(world)
        # Rank 0's descendants include the other ranks: its own are the rest (DataLoader workers).
        own = tuple(p for p in procfs.descendants(tree, proc.pid) if p not in others)
        ranks.append(_rank_process(proc, env, children=own))
    return ranks


def _spawn_ranks(parent: Proc) -> list[Proc]:
    children = [c for c in _safe(parent.children, []) if _is_spawn_child(c)]
    return children if len(children) >= 2 else []


def describe_job(root: Proc, launcher: str) -> JobProcesses:
    """Collect the ranks under ``root`` (or ``root`` itself for a single process)."""
    if launcher == RAY_TRAIN:  # rediscovered (ranks restart): the workers are not under the driver
        ray = ray_train.find(root)
        if ray is not None:
            return describe_ray_job(ray)
        return JobProcesses(launcher=launcher, root_pid=root.pid, host=socket.gethostname(),
                            cmdline=tuple(_safe(root.cmdline, [])), started_at=_safe(root.create_time, None),
                            notes=("Ray Train job: no RayTrainWorker process is left",))
    host = socket.gethostname()
    notes: list[str] = []
    if launcher == "mp.spawn":
        procs = sorted(_spawn_ranks(root), key=lambda p: _safe(p.create_time, 0))
        armed = _armed_ranks(_run_dir_here(root.pid, (job_env(root) or {}).get("TRAINWATCH_RUN_DIR")))
        own = {p.pid: namespaces.inner_pid(p.pid) or p.pid for p in procs}  # the hook writes getpid()
        if procs and all(own[p.pid] in armed for p in procs):
            ranks = [_rank_process(p, job_env(p) or {}, default_rank=armed[own[p.pid]]) for p in procs]
            notes.append("mp.spawn job: rank numbers from trainwatch's hook (each rank's process group)")
        else:
            ranks = [_rank_process(p, job_env(p) or {}, default_rank=i) for i, p in enumerate(procs)]
            notes.append("mp.spawn job: rank numbers inferred from start order")
    elif launcher in LAUNCHERS:
        ranks = _ranks_below(root)
    elif launcher == "lightning":
        ranks = _lightning_ranks(root)
        notes.append("Lightning job: rank numbers from its launcher's LOCAL_RANK and NODE_RANK")
    elif "RANK" in (job_env(root) or {}):  # ranks started directly by srun, mpirun or a script
        ranks = _sibling_ranks(root)
    else:  # plain `python train.py`: a job of one rank
        ranks = [_rank_process(root, job_env(root) or {}, default_rank=0)]
    known = [r for r in ranks if r.env]
    first = known[0].env if known else {}
    root_args = launcher_args(_safe(root.cmdline, []), job_env(root)) if launcher in LAUNCHERS else []
    layout = launcher_layout(root_args) if launcher in LAUNCHERS else {}
    local_world = _int(first.get("LOCAL_WORLD_SIZE")) or layout.get("nproc")
    world = _int(first.get("WORLD_SIZE")) or (len(ranks) if launcher in ("python", "mp.spawn") else None)
    if world is None and local_world and layout.get("nnodes"):
        world = local_world * layout["nnodes"]
    if launcher in LAUNCHERS and len(known) < len(ranks) and local_world == len(ranks):
        ranks = _numbered_by_start(ranks, known, single_node=layout.get("nnodes", 1) == 1, notes=notes)
    # A launcher with no rank yet knows its store from its own options: the other nodes' agents find it so.
    store = launcher_store(root_args) if launcher in LAUNCHERS and not first.get("MASTER_ADDR") else None
    return JobProcesses(
        launcher=launcher,
        root_pid=root.pid,
        host=host,
        ranks=tuple(sorted(ranks, key=lambda r: (r.rank is None, r.rank or 0, r.pid))),
        launcher_pid=root.pid if launcher in LAUNCHERS or launcher == "mp.spawn" else None,
        world_size=world,
        local_world_size=local_world,
        nnodes=(world // local_world) if world and local_world else None,
        master_addr=first.get("MASTER_ADDR") or (store[0] if store else None),
        master_port=_int(first.get("MASTER_PORT")) or (store[1] if store else None),
        job_id=first.get("TORCHELASTIC_RUN_ID") or first.get("SLURM_JOB_ID"),
        run_dir=_run_dir_here(root.pid, first.get("TRAINWATCH_RUN_DIR") or (job_env(root) or {}).get(
            "TRAINWATCH_RUN_DIR")) or _import_armed_dir(ranks),  # the launcher carries it too, before any rank starts
        cmdline=tuple(_safe(root.cmdline, [])),
        started_at=_safe(root.create_time, None),
        waiting_rendezvous=launcher in LAUNCHERS and not ranks,
        notes=tuple(notes),
        rendezvous=_launcher_rendezvous(root, root_args, layout) if launcher in LAUNCHERS and not ranks else None,
        node_rank=layout.get("node_rank"),
        node_id=namespaces.node_identity(root.pid),
    )




def describe_ray_job(ray: ray_train.RayTrainJob) -> JobProcesses:
    """A Ray Train run: its ranks are the ``RayTrainWorker`` processes, numbered by Ray Train's own
    records (its system log); a worker whose record was not found keeps no number (and says so)."""
    tree = procfs.parent_map()  # one pass over /proc (Proc.children() rescans it per call)
    ranks = []
    for proc in ray.workers:
        record = ray.ranks.get(proc.pid)
        env = dict(job_env(proc) or {})
        if record is not None:
            env.update({"RANK": str(record.rank), **({"LOCAL_RANK": str(record.local_rank)}
                                                      if record.local_rank is not None else {}),
                        **({"WORLD_SIZE": str(record.world_size)} if record.world_size else {})})
        ranks.append(_rank_process(proc, env, children=procfs.descendants(tree, proc.pid)))
    notes = [f"Ray Train job: rank numbers from Ray Train's worker logs ({ray.logs_dir}/train)"
             if ray.ranks else "Ray Train job: Ray Train's worker logs were not found; ranks are unnumbered"]
    unnumbered = [p.pid for p in ray.workers if p.pid not in ray.ranks]
    if ray.ranks and unnumbered:
        notes.append(f"Ray Train workers {', '.join(map(str, unnumbered))}: no rank in Ray Train's logs")
    worlds = [r.world_size for r in ray.ranks.values() if r.world_size] + ([len(ray.group)] if ray.group else [])
    elsewhere = ray.elsewhere()
    if elsewhere:
        where = "; ".join(f"{who(ranks)} on {ip}" for ip, ranks in sorted(elsewhere.items()))
        notes.append(f"Ray Train's worker group (its controller's log) has {where}")
    root = ray.driver or ray.raylet
    return JobProcesses(
        launcher=RAY_TRAIN, root_pid=root.pid, host=socket.gethostname(),
        ranks=tuple(sorted(ranks, key=lambda r: (r.rank is None, r.rank or 0, r.pid))),
        world_size=max(worlds, default=None) or len(ranks), local_world_size=len(ranks),
        nnodes=len({p.ip for p in ray.group}) or None, job_id=ray.run_name,
        cmdline=tuple(_safe(root.cmdline, [])), started_at=_safe(root.create_time, None), notes=tuple(notes),
        peer_nodes=tuple(sorted(elsewhere)), node_id=namespaces.node_identity(root.pid),
    )


def option_value(cmdline: list[str] | tuple[str, ...], *names: str) -> str | None:
    """The value of the first of ``names`` on a command line (``--name value`` or ``--name=value``)."""
    for i, arg in enumerate(cmdline):
        key, eq, value = arg.partition("=")
        if key in names:
            return value if eq else (cmdline[i + 1] if i + 1 < len(cmdline) else None)
    return None


def launcher_store(cmdline: tuple[str, ...] | list[str]) -> tuple[str, int] | None:
    """The store a torchrun-style launcher meets the other nodes at, from its command line:
    ``--rdzv-endpoint host:port``, else ``--master-addr``/``--master-port`` (torchrun's defaults
    127.0.0.1 and 29500)."""
    args = list(cmdline)
    endpoint = option_value(args, "--rdzv-endpoint", "--rdzv_endpoint")
    if endpoint:
        host, _, port = endpoint.rpartition(":")
        number = _int(port)
        return (host.strip("[]") or "127.0.0.1", number) if number is not None else None
    port_text = option_value(args, "--master-port", "--master_port")
    number = _int(port_text) if port_text is not None else 29500
    return (option_value(args, "--master-addr", "--master_addr") or "127.0.0.1", number) if number is not None else None


def _launcher_rendezvous(root: Proc, cmdline: list[str], layout: dict[str, int]) -> Rendezvous | None:
    """A launcher with no rank yet, in a job of several nodes: its store and the nodes connected to
    it (each node's launcher is a client of the store; where this node serves it, every node's
    connection shows here). Node ranks come from the launchers' ``--node-rank`` (static
    rendezvous), so the nodes missing, and the ranks they would run, can be named only when every
    connected launcher is on this node; with ``--nproc-per-node`` as here on every node."""
    nnodes = layout.get("nnodes") or 0
    if nnodes <= 1:
        return None
    address = launcher_store(cmdline)
    static = option_value(cmdline, "--rdzv-backend", "--rdzv_backend") in (None, "static")  # torchrun's default
    scan = rendezvous.scan(root.pid)
    store, _ = scan.store_for(root.pid)
    if store is None:
        if static and address is not None and layout.get("node_rank", 0) != 0 and scan.nothing_at(address):
            nproc = layout.get("nproc")  # static rendezvous: node 0's launcher serves the store
            return Rendezvous(store=_address_text(address), served_here=False, missing_nodes=(0,),
                              missing_ranks=tuple(range(nproc)) if nproc else ())
        return Rendezvous(store=_address_text(address), served_here=False)
    launchers = [p for p in map(_existing, store.clients) if p is not None and launcher_kind(_safe(p.cmdline, []))]
    remote = sorted(set(store.remote_clients))
    joined = {launcher_layout(launcher_args(_safe(p.cmdline, []), job_env(p))).get("node_rank", 0) for p in launchers}
    missing: tuple[int, ...] = ()
    ranks: tuple[int, ...] = ()
    if static and not remote and len(joined) == len(launchers):  # c10d numbers the nodes as they join
        missing = tuple(n for n in range(nnodes) if n not in joined)
        nproc = layout.get("nproc")
        ranks = tuple(n * nproc + i for n in missing for i in range(nproc)) if nproc else ()
    return Rendezvous(store=store.text, served_here=True, host_pid=store.host,
                      nodes_joined=len(launchers) + len(remote),
                      missing_nodes=missing, missing_ranks=ranks)


def maybe_partial(job: JobProcesses, root: Proc) -> bool:
    """Whether the process tree alone may not hold the whole job, so its store is looked for: a
    process with no launcher above it (a Ray driver or actor, a rank started by hand) that has torch
    or Ray loaded, or ranks started apart (srun, mpirun, a script) fewer than their world."""
    if job.launcher in LAUNCHERS or job.launcher in ("mp.spawn", "lightning", RAY_TRAIN):
        return False
    if job.launcher == "python":
        return procfs.maps_mention(root.pid, b"libtorch", b"/torch/_C", b"_raylet.so")
    return bool(job.world_size and job.world_size > len(job.ranks))


def find_by_store(start: Proc, previous: JobProcesses | None = None,
                  address: tuple[str, int] | None = None) -> JobProcesses | None:
    """The job ``start`` belongs to, found through its store (``rendezvous.py``): the ranks are the
    processes connected to the TCPStore that ``start`` is connected to, serves, or whose clients it
    talks to (a Ray driver); with ``address``, the processes connected to the store there (served
    on this node or another). None when no such store holds two processes or more, or holds only
    ``start`` (a job of one: the process tree says it). ``previous``: the job as found before, whose
    ranks keep the numbers they had (no new read of their locals)."""
    scan = rendezvous.scan(start.pid)
    others: tuple[rendezvous.Store, ...] = ()
    if address is not None:
        store = scan.store_at(address)
        clients = store.clients if store is not None else scan.clients_of(address)
    else:
        # from a helper a rank forked (a DataLoader worker: its copies of the rank's sockets are the
        # rank's), the rank it belongs to
        for proc in [start, *_safe(start.parents, [])[:MAX_HELPER_DEPTH]]:
            store, others = scan.store_for(proc.pid)
            if store is not None:
                start = proc
                break
        else:
            return None
        clients = store.clients
    procs = [p for p in map(_existing, clients) if p is not None and p.pid != os.getpid()
             and not rendezvous.is_own_client(p.pid) and not launcher_kind(_safe(p.cmdline, []))]
    if not procs or (len(procs) == 1 and procs[0].pid == start.pid and address is None):
        return None
    notes = list(scan.notes)
    elsewhere = len(store.remote_clients) if store is not None else 0  # each rank on another node: one connection
    ranks, numbered_by = _store_ranks(procs, previous, notes)
    ray = all(ray_train.is_worker_title(_safe(p.cmdline, [])) for p in procs)
    root = _store_root(start if address is None else None, procs, scan)
    served = store is not None
    where = store.text if store is not None else _address_text(address)
    nodes = tuple(sorted(set(store.remote_clients))) if store is not None else ()  # other nodes' ranks
    world = max(max((r.world_size or 0 for r in ranks), default=0), len(ranks) + elsewhere) or None
    single = served and not nodes
    notes.insert(0, f"ranks found through their store at {where}: the processes connected to it"
                    + (f" (its server: PID {store.host})" if store is not None else " (served on another node)"))
    if numbered_by == "start order":
        notes.append("rank numbers inferred from start order: nothing readable says their global ranks"
                     + ("" if single else " (they count this node's ranks only)"))
    else:
        notes.append(f"rank numbers from {numbered_by}")
    for other in others:
        notes.append(f"another store at {other.text} holds {len(other.clients)} processes "
                     f"(PIDs {', '.join(map(str, other.clients[:8]))}): another worker group; give one of its PIDs")
    if nodes:
        notes.append(f"the store has connections from {', '.join(nodes)}: ranks on other nodes")
    record = Rendezvous(store=where, served_here=served, host_pid=store.host if store is not None else None,
                        numbered_by=numbered_by, nodes_joined=(1 + len(nodes)) if served else None)
    if single:  # every rank of the job is here: number them as one node's
        ranks = [replace(r, local_rank=r.rank if r.local_rank is None else r.local_rank) for r in ranks]
    host, port = ((store.reached_at or store.address) if store is not None else address) or (None, None)
    return JobProcesses(
        launcher=RAY_ACTORS if ray else "python", root_pid=root.pid, host=socket.gethostname(),
        ranks=tuple(sorted(ranks, key=lambda r: (r.rank is None, r.rank or 0, r.pid))),
        # on a node of several, the ranks here say nothing of which numbers should be here: none is missing
        world_size=world, local_world_size=world if single else None,
        nnodes=(1 + len(nodes)) if served else None, master_addr=host, master_port=port,
        job_id=next(filter(None, (r.env.get("TORCHELASTIC_RUN_ID") or r.env.get("SLURM_JOB_ID") for r in ranks)), None),
        cmdline=tuple(_safe(root.cmdline, [])), started_at=_safe(root.create_time, None),
        notes=tuple(notes), peer_nodes=nodes, rendezvous=record, found_by="store",
        node_id=namespaces.node_identity(root.pid),
    )


def _existing(pid: int) -> Proc | None:
    try:
        return Proc(pid)
    except ProcessError:
        return None  # exited since the scan


def _address_text(address: tuple[str, int] | None) -> str | None:
    if address is None:
        return None
    return f"[{address[0]}]:{address[1]}" if ":" in address[0] else f"{address[0]}:{address[1]}"


def _store_root(start: Proc | None, procs: list[Proc], scan: rendezvous.Scan) -> Proc:
    """The job's own process to show and watch: ``start`` when it is no rank (the driver, the
    store's host); else the process connected to every rank that is none itself and no Ray
    worker (a Ray driver holds a connection to each of its actors); else the lowest rank."""
    ranks = {p.pid for p in procs}
    if start is not None and start.pid not in ranks:
        return start
    talking = set.intersection(*(set(scan.peers.get(pid, ())) for pid in ranks)) - ranks if ranks else set()
    for pid in sorted(talking):
        proc = _existing(pid)
        if proc is not None and not ray_train.is_worker_title(_safe(proc.cmdline, [])):
            return proc
    return min(procs, key=lambda p: p.pid)


def _store_ranks(procs: list[Proc], previous: JobProcesses | None,
                 notes: list[str]) -> tuple[list[RankProcess], str]:
    """The processes connected to a store as ranks, and what numbered them: their environment
    (RANK), else their locals (read once per process: a rank found before keeps its number), else
    their start order. Numbers from locals count only when they differ from rank to rank and lie
    within the world where one is said (ranks on other nodes hold the numbers not here)."""
    tree = procfs.parent_map()
    envs = {p.pid: job_env(p) or {} for p in procs}
    if all("RANK" in envs[p.pid] for p in procs):
        return [_rank_process(p, envs[p.pid], children=procfs.descendants(tree, p.pid)) for p in procs], \
            "their environment (RANK)"
    before = {(r.pid, r.create_time): r for r in (previous.ranks if previous else ())}
    known: dict[int, tuple[int | None, int | None]] = {}
    for p in procs:
        old = before.get((p.pid, _safe(p.create_time, 0.0)))
        if old is not None and old.rank is not None and previous is not None and \
                previous.rendezvous is not None and previous.rendezvous.numbered_by != "start order":
            known[p.pid] = (old.rank, old.world_size)
    unread = [p.pid for p in procs if p.pid not in known and "RANK" not in envs[p.pid]]
    read, failed = rendezvous.numbers_from_locals(unread) if unread else ({}, [])
    notes.extend(f"rank number not read from {line}" for line in failed[:4])
    numbers = {**{pid: (_int(envs[pid].get("RANK")), _int(envs[pid].get("WORLD_SIZE")))
                  for pid in envs if "RANK" in envs[pid]}, **known, **read}
    values = [numbers.get(p.pid, (None, None))[0] for p in procs]
    world = max((w for _, w in numbers.values() if w), default=None)
    if None not in values and len(set(values)) == len(values) and all(0 <= v < (world or v + 1) for v in values):
        ranks = []
        for p in procs:
            rank, size = numbers[p.pid]
            env = {**envs[p.pid], "RANK": str(rank), **({"WORLD_SIZE": str(size or world)} if size or world else {})}
            ranks.append(_rank_process(p, env, children=procfs.descendants(tree, p.pid)))
        return ranks, "their locals (py-spy --locals)"
    order = sorted(procs, key=lambda p: (_safe(p.create_time, 0.0), p.pid))
    return [_rank_process(p, {**envs[p.pid], "RANK": str(i)}, children=procfs.descendants(tree, p.pid))
            for i, p in enumerate(order)], "start order"


def _numbered_by_start(ranks: list[RankProcess], known: list[RankProcess], single_node: bool,
                       notes: list[str]) -> list[RankProcess]:
    """Ranks already gone (a zombie's environment is unreadable) get their numbers from the start
    order: torchrun starts local ranks 0..n-1 in turn. Only where the ranks still readable agree
    with that order, and the node's first global rank is known (or the job has one node)."""
    by_start = sorted(ranks, key=lambda r: (r.create_time, r.pid))
    if any(r.local_rank != i for i, r in enumerate(by_start) if r.env):
        return ranks
    anchor = next((r for r in known if r.rank is not None and r.local_rank is not None), None)
    if anchor is None and not single_node:
        return ranks
    base = anchor.rank - anchor.local_rank if anchor is not None else 0
    notes.append("rank numbers of exited processes inferred from their start order")
    return [r if r.env else replace(r, rank=base + i, local_rank=i) for i, r in enumerate(by_start)]


def _ranks_below(root: Proc) -> list[RankProcess]:
    """Top-most processes with RANK in their environment; their look-alike children are helpers."""
    tree = procfs.parent_map()  # one pass over /proc (Proc.children() rescans it per call)
    ranks: list[RankProcess] = []
    frontier = list(tree.get(root.pid, ()))
    while frontier:
        nxt = []
        for pid in frontier:
            if _is_helper(pid):  # trainwatch's tee: it inherits the RANK a rank set at run time (mp.spawn)
                continue
            try:
                child = Proc(pid)
            except ProcessError:
                continue  # exited between listing and reading: not a rank any more
            env = job_env(child)
            if env and "RANK" in env:
                ranks.append(_rank_process(child, env, children=procfs.descendants(tree, pid)))
            elif env is None or _safe(child.state, "") == "Z":
                ranks.append(RankProcess(pid=child.pid, rank=None, create_time=_safe(child.create_time, 0.0)))
            else:
                nxt.extend(tree.get(pid, ()))
        frontier = nxt
    return ranks


def _sibling_ranks(rank: Proc) -> list[RankProcess]:
    env = job_env(rank) or {}
    master = (env.get("MASTER_ADDR"), env.get("MASTER_PORT"))
    parent = _safe(rank.parent, None)
    siblings = _safe(parent.children, []) if parent else [rank]
    found = []
    for proc in siblings:
        penv = job_env(proc) or {}
        if "RANK" in penv and (penv.get("MASTER_ADDR"), penv.get("MASTER_PORT")) == master:
            found.append(_rank_process(proc, penv))
    return found or [_rank_process(rank, env)]


def _is_helper(pid: int) -> bool:
    """trainwatch's own per-rank log tee is a child of the rank, not part of the job."""
    cmd = procfs.read_text(f"/proc/{pid}/cmdline") or ""
    return cmd.rstrip("\0").endswith("trainwatch-tee")


def _rank_process(proc: Proc, env: dict[str, str], default_rank: int | None = None,
                  children: tuple[int, ...] | None = None) -> RankProcess:
    if children is None:
        children = tuple(c.pid for c in _safe(lambda: proc.children(recursive=True), []))
    children = tuple(c for c in children if not _is_helper(c))
    rank = _int(env.get("RANK"))
    return RankProcess(
        pid=proc.pid,
        rank=rank if rank is not None else default_rank,
        local_rank=_int(env.get("LOCAL_RANK")) if "LOCAL_RANK" in env else (default_rank if rank is None else None),
        world_size=_int(env.get("WORLD_SIZE")),
        local_world_size=_int(env.get("LOCAL_WORLD_SIZE")),
        group_rank=_int(env.get("GROUP_RANK")),
        env=env,
        children=children,
        cmdline=tuple(_safe(proc.cmdline, [])),
        create_time=_safe(proc.create_time, 0.0),
        log_path=procfs.log_file_of(proc.pid) or _armed_log(proc.pid, env, rank),
        container_pid=namespaces.inner_pid(proc.pid),
    )


def _run_dir_here(pid: int, path: str | None) -> str | None:
    """The run directory a job names in its environment, as a path openable here (a container's
    through /proc/PID/root)."""
    return namespaces.path_here(pid, path) if path else None


def _import_armed_dir(ranks: list[RankProcess]) -> str | None:
    """A job armed by `import trainwatch.probes.hook` shows no TRAINWATCH_RUN_DIR in /proc."""
    looked: set[tuple[int, int]] = set()  # ranks share a user and a parent: one look each
    for rank in ranks:
        try:
            proc = Proc(rank.pid)
            owner = (proc.uid(), proc.ppid())
        except ProcessError:
            continue  # exited: another rank names the run directory
        if owner not in looked:
            looked.add(owner)
            path = implicit_run_dir(*owner)
            if path.is_dir():
                return str(path)
    return None


def _armed_ranks(run_dir: str | None) -> dict[int, int]:
    """PID -> rank of the ranks the hook armed in ``run_dir`` (each ``ranks/<rank>/hook.json``)."""
    found: dict[int, int] = {}
    for record in hook_records(Path(run_dir)) if run_dir else ():
        try:
            found[int(record["pid"])] = int(record["rank"])
        except (KeyError, TypeError, ValueError):  # a damaged record: that rank keeps its start-order number
            continue
    return found


def _armed_log(pid: int, env: dict[str, str], rank: int | None) -> str | None:
    """Under `trainwatch run` fd 1 is a pipe to the tee; the rank's log is in the run directory."""
    if not env.get("TRAINWATCH_RUN_DIR") or rank is None:
        return None
    path = rank_log_file(Path(namespaces.path_here(pid, env["TRAINWATCH_RUN_DIR"])), rank)
    return str(path) if path.exists() else None


def expected_local_ranks(job: JobProcesses) -> dict[int, int]:
    """local rank -> global rank for every rank this node should run (homogeneous torchrun layout)."""
    known = [r for r in job.ranks if r.rank is not None and r.local_rank is not None]
    if not job.local_world_size:
        return {}
    if not known:
        node_rank = job.node_rank if job.node_rank is not None else launcher_layout(job.cmdline).get("node_rank", 0)
        return {local: node_rank * job.local_world_size + local for local in range(job.local_world_size)}
    base = known[0].rank - known[0].local_rank
    return {local: base + local for local in range(job.local_world_size)}
