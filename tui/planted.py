"""Small real gloo training jobs with planted faults, for the demo, the tests and the screenshots.

Run under torchrun, e.g.::

    torchrun --nproc-per-node 4 -m trainwatch.tui.planted --scenario straggler --deadline 60

Every scenario exits by itself after ``--deadline`` seconds (hung ranks included), so a
forgotten job never outlives its test.
"""

from __future__ import annotations

import argparse
import os
import sys
import threading
import time

SCENARIOS = (
    "healthy", "straggler", "mismatch", "uneven", "dataloader", "lock",
    "segfault", "assert", "slowstep", "skipstep", "raise", "linger", "longstep", "sigkill", "oom",
    "checkpoint", "async", "pipeline", "sendrecv", "subgroup", "child", "fifo", "socket", "gil",
    "killcompute", "killwait", "gathersize", "raiseat", "routine", "pool", "event",
)
STALL_STEP = 40  # skipstep: the culprit stalls when its own counter reaches this
FAIL_STEP = 3  # the step at which the newer planted faults strike (--fail-step)
ROUTINE_EVERY, ROUTINE_S = 10, 6.0  # routine: the culprit saves a "checkpoint" this long every this many steps


def stop_job_tree(pid: int, grace: float = 3.0) -> None:
    """Stop a planted job we started: SIGTERM the launcher (torchrun passes it on to its ranks),
    then SIGKILL whatever of its tree is left. torchrun puts every rank in a session of its own,
    so killing the launcher's process group alone would orphan the ranks."""
    import psutil

    try:
        root = psutil.Process(pid)
        family = [root, *root.children(recursive=True)]
    except psutil.Error:
        return  # already gone
    try:
        root.terminate()
    except psutil.Error:
        pass  # gone meanwhile
    _, alive = psutil.wait_procs(family, timeout=grace)
    for proc in alive:
        try:
            proc.kill()
        except psutil.Error:
            pass  # gone meanwhile
    psutil.wait_procs(alive, timeout=grace)


def _arm_deadline(seconds: float, thread: bool = True) -> None:
    """Hard stop: a rank blocked in C code still dies at the deadline. Without ``thread``, the
    kernel's alarm ends it (SIGALRM, whose default action ends the process): no idle thread of
    ours, so that every other thread of the rank is gloo's, woken by each step."""
    if not thread:
        import signal
        signal.signal(signal.SIGALRM, signal.SIG_DFL)
        signal.alarm(int(seconds) + 1)
        return

    def _expire() -> None:
        time.sleep(seconds)
        os._exit(124)
    threading.Thread(target=_expire, name="deadline", daemon=True).start()


def say(line: str) -> None:
    """One line of output in one write call: the ranks share stdout, and print() writes the newline
    separately, which lets two ranks' lines run into each other."""
    sys.stdout.flush()
    os.write(sys.stdout.fileno(), f"{line}\n".encode())


def compute_step(model, batch):
    """One forward/backward pass: the job's real work."""
    loss = model(batch).pow(2).mean()
    loss.backward()
    return loss


def sync_gradients(model, dist) -> None:
    for param in model.parameters():
        if param.grad is not None:
            dist.all_reduce(param.grad)


def sync_async(model, dist) -> None:
    """Overlapped gradient sync, as frameworks do it: launch every all_reduce, then wait on each
    (the wait is ``Work.wait``, a C++ method: no collective name on the Python stack)."""
    works = [dist.all_reduce(p.grad, async_op=True) for p in model.parameters() if p.grad is not None]
    for work in works:
        work.wait()


def pass_activations(loss, rank: int, world: int, dist) -> None:
    """A pipeline: each stage sends its activations to the next (isend) and receives from the one
    before (irecv), then waits on both."""
    import torch
    out = torch.full((4,), float(rank))
    incoming = torch.zeros(4)
    works = []
    if rank + 1 < world:
        works.append(dist.isend(out, dst=rank + 1))
    if rank > 0:
        works.append(dist.irecv(incoming, src=rank - 1))
    for work in works:
        work.wait()


def pass_blocking(rank: int, world: int, dist) -> None:
    """A pipeline with blocking calls: each stage receives from the one before (recv), then sends
    to the next (send)."""
    import torch
    if rank > 0:
        dist.recv(torch.zeros(4), src=rank - 1)
    if rank + 1 < world:
        dist.send(torch.full((4,), float(rank)), dst=rank + 1)


def sync_in_pairs(model, rank: int, pairs: list, dist) -> None:
    """Data parallel within a pair of ranks (process subgroups {0,1}, {2,3}, ...), then one
    all_reduce over the whole world (the loss, for logging)."""
    import torch
    group = pairs[rank // 2]
    for param in model.parameters():
        if param.grad is not None:
            dist.all_reduce(param.grad, group=group)
    dist.all_reduce(torch.ones(1))


def sync_metrics(loss, dist) -> None:
    import torch
    gathered = [torch.zeros_like(loss) for _ in range(dist.get_world_size())]
    dist.all_gather(gathered, loss.detach())


def device_step(model, batch, seconds: float):
    """longstep: the CPU stand-in for a long GPU step. The step's work runs on another thread, as
    kernels run on a GPU's stream, and takes ``seconds`` without costing the host any CPU; the host
    waits for its result in a torch Future, as a GPU rank waits at ``loss.item()``."""
    import torch
    done = torch.futures.Future()

    def run() -> None:
        time.sleep(seconds)
        done.set_result(compute_step(model, batch))
    threading.Thread(target=run, name="device", daemon=True).start()
    return done


class SlowDataset:
    """A dataset whose 9th item never arrives on the stalled rank (until the job's deadline)."""

    def __init__(self, size: int, stall: bool, stop_at: float) -> None:
        self.size, self.stall, self.stop_at = size, stall, stop_at

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, index: int):
        import torch
        if self.stall and index >= 8:
            # A worker stuck reading a shard. Workers are forked without the deadline thread,
            # so the worker keeps the deadline itself.
            time.sleep(max(0.0, self.stop_at - time.time()))
            os._exit(124)
        return torch.randn(16)


def make_loader(rank: int, world: int, scenario: str, stop_at: float):
    import torch
    from torch.utils.data import DataLoader
    if scenario == "dataloader":
        dataset = SlowDataset(10_000, stall=(rank == world - 1), stop_at=stop_at)
        return DataLoader(dataset, batch_size=4, num_workers=1)
    batches = 3 if scenario == "uneven" and rank == world - 1 else 100_000
    return (torch.randn(4, 16) for _ in range(batches))  # uneven: this rank's shard is shorter


def take_lock_in_thread(lock: threading.Lock) -> None:
    def _hold() -> None:
        lock.acquire()
        time.sleep(3600)
    threading.Thread(target=_hold, name="metrics-writer", daemon=True).start()
    time.sleep(0.2)


def upload_metrics(stop_at: float) -> None:
    """Stands in for a background uploader someone forgot to make a daemon."""
    while time.time() < stop_at:
        time.sleep(0.2)
    os._exit(124)


def start_uploader(stop_at: float) -> None:
    threading.Thread(target=upload_metrics, args=(stop_at,), name="uploader").start()


def wait_for_child(stop_at: float) -> None:
    """An upload that never ends: the rank waits in subprocess.run for a child that sleeps."""
    import subprocess
    subprocess.run(["sleep", str(max(1, int(stop_at - time.time())))])


def read_fifo() -> None:
    """Blocked opening a FIFO for reading: nothing ever opens it for writing (a `ready` flag file
    made a named pipe). The deadline thread still ends the rank."""
    path = os.path.join(os.getcwd(), f"ready-{os.getpid()}.fifo")
    os.mkfifo(path)
    with open(path) as fifo:
        fifo.read()


def read_shard(task: tuple[int, str, float]) -> int:
    """A pool worker's task: shard 2's file is a FIFO nobody writes (a hung network mount's
    stand-in). A forked worker has none of our threads: it keeps the deadline itself (SIGALRM)."""
    import signal
    shard, folder, stop_at = task
    signal.signal(signal.SIGALRM, signal.SIG_DFL)
    signal.alarm(max(1, int(stop_at - time.time())))
    if shard == 2:
        fifo_path = os.path.join(folder, f"shard-{os.getpid()}.fifo")
        os.mkfifo(fifo_path)
        with open(fifo_path) as shard_file:  # (not the fifo scenario's line: tests find each by its text)
            shard_file.read()
    return shard


def save_checkpoint_async() -> None:
    """A checkpoint written by a thread, the rank waiting for its Event: the thread dies of an
    exception before it sets it (Python prints its report), and the rank waits for ever."""
    written = threading.Event()

    def write() -> None:
        raise OSError(28, "No space left on device")  # before written.set()
    threading.Thread(target=write, name="checkpoint-writer").start()
    written.wait()


def map_shards(stop_at: float) -> None:
    """Preprocessing in a multiprocessing Pool: the rank waits in Pool.map for the worker that
    never returns."""
    import multiprocessing
    with multiprocessing.Pool(2) as pool:
        pool.map(read_shard, [(shard, os.getcwd(), stop_at) for shard in range(4)])


def recv_from_peer(stop_at: float) -> None:
    """Blocked in recv() on a connection to a local helper process that never sends (a metrics or
    parameter server stand-in)."""
    import socket
    import subprocess
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(1)
    seconds = max(1, int(stop_at - time.time()))
    code = (f"import socket, time; s = socket.create_connection(('127.0.0.1', {server.getsockname()[1]})); "
            f"time.sleep({seconds})")
    subprocess.Popen([sys.executable, "-c", code])
    conn, _ = server.accept()
    conn.recv(1)


def hold_gil(stop_at: float) -> None:
    """A C call that never releases the GIL: libc's sleep() through ctypes.PyDLL (which keeps the
    GIL, as a careless C extension does). Bounded by the deadline itself: no Python thread runs meanwhile."""
    import ctypes
    ctypes.PyDLL(None).sleep(max(1, int(stop_at - time.time())))


def dump_flight_recorder(rank: int) -> None:
    """What NCCL's TORCH_NCCL_DUMP_ON_TIMEOUT does, for gloo (which never dumps by itself): the
    generic Flight Recorder as a pickle at ``${TORCH_FR_DUMP_TEMP_FILE}<rank>``."""
    from torch._C._distributed_c10d import _dump_fr_trace

    prefix = os.environ.get("TORCH_FR_DUMP_TEMP_FILE", "/tmp/nccl_trace_rank_")
    with open(f"{prefix}{rank}", "wb") as out:
        out.write(_dump_fr_trace(includeCollectives=True))


def busy(seconds: float) -> None:
    """Compute on the CPU for ``seconds`` (a rank that works, not one that waits or sleeps)."""
    import torch
    end = time.time() + seconds
    a = torch.randn(64, 64)
    while time.time() < end:
        a = torch.tanh(a @ a)


def gather_sizes(rank: int, culprit: int, odd_numel: int, dist) -> None:
    """An all_gather where one rank's tensor has another size: gloo aborts the rank that receives a
    chunk larger than its own (the odd rank's ring neighbour when its chunk is bigger; the odd rank
    itself when smaller)."""
    import torch
    numel = odd_numel if rank == culprit else 4
    out = [torch.zeros(numel) for _ in range(dist.get_world_size())]
    dist.all_gather(out, torch.ones(numel))


def train(scenario: str, step_s: float, stop_at: float, ddp: bool = False, timeout_s: float | None = None,
          culprit: int | None = None, odd_numel: int = 5, fail_step: int = FAIL_STEP,
          fail_attempts: int = 1 << 30, stall_after: float | None = None) -> None:
    import warnings
    warnings.filterwarnings("ignore", message="Failed to initialize NumPy")  # CPU torch without numpy
    import torch
    import torch.distributed as dist

    restart = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    if "RANK" in os.environ and restart and os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True":
        # A restarted attempt under torchrun: gloo's keys of the attempt before are still in the
        # agent's store (torch 2.13), so each attempt keeps its own.
        import datetime
        store = dist.PrefixStore(f"planted/attempt_{restart}", dist.TCPStore(
            os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), is_master=False,
            timeout=datetime.timedelta(seconds=60)))
        dist.init_process_group("gloo", store=store, rank=int(os.environ["RANK"]),
                                world_size=int(os.environ["WORLD_SIZE"]))
    elif "RANK" in os.environ:
        if timeout_s:
            import datetime
            dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=timeout_s))
        else:
            dist.init_process_group("gloo")
    else:  # started with plain `python`: a world of one
        port = int(os.environ.get("MASTER_PORT", "29533"))
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
    rank, world = dist.get_rank(), dist.get_world_size()
    culprit = world - 1 if culprit is None else culprit
    torch.manual_seed(rank)
    model = torch.nn.Linear(16, 16)
    if ddp:  # as real jobs do: DDP's reducer all-reduces the gradients inside backward()
        from torch.nn.parallel import DistributedDataParallel
        model = DistributedDataParallel(model)
    lock = threading.Lock()
    # subgroup: every rank makes every group, in the same order (new_group is collective over the world)
    pairs = [dist.new_group([r, r + 1]) for r in range(0, world - 1, 2)] if scenario == "subgroup" else []
    say(f"rank {rank}/{world} pid {os.getpid()} scenario {scenario}" + (f" attempt {restart}" if restart else ""))
    step, skipped, started = 0, False, time.time()
    if scenario == "skipstep":  # locals that look like secrets: trainwatch must never show them
        step_token, api_key = "sk-secret-tw-5f3a9c", 987654321987  # noqa: F841
    for batch in make_loader(rank, world, scenario, stop_at):
        step += 1
        if scenario == "skipstep" and rank == culprit:
            if step == 3 and not skipped:
                step, skipped = step - 1, True  # one step not counted: one behind from here on, in lockstep
            if step == STALL_STEP:
                time.sleep(3600)  # then stalls: the others go on to their next step and wait in all_reduce
        if scenario == "longstep":
            loss = device_step(model, batch, step_s).wait()
        else:
            loss = compute_step(model, batch)
        if step_s and scenario == "raiseat":
            busy(min(step_s, 0.05))  # work on the CPU each step: each attempt reads as running until it fails
            time.sleep(max(0.0, step_s - 0.05))
        elif step_s and scenario != "longstep":
            time.sleep(step_s)
        if scenario == "routine" and rank == culprit and step % ROUTINE_EVERY == 0:
            say(f"routine pause {step // ROUTINE_EVERY} begins")
            time.sleep(ROUTINE_S)  # a checkpoint every few steps: the others wait, then all run on
        if scenario == "slowstep" and rank == 0:
            time.sleep(1.0)  # slow but healthy: the others spend most of each step in all_reduce
        if scenario == "straggler" and rank == culprit and (
                step == fail_step if stall_after is None else time.time() >= started + stall_after):
            if stall_after is not None:
                say(f"rank {rank} stops at {time.time():.3f}")  # for the benchmarks: when it stopped
            time.sleep(3600)  # stuck in its own work while the others wait
        if scenario == "lock" and rank == culprit and step == 3:
            take_lock_in_thread(lock)
            with lock:  # deadlock: another thread of this rank holds it
                pass
        if scenario == "segfault" and rank == culprit and step == 3:
            import ctypes
            ctypes.string_at(0)  # SIGSEGV
        if scenario == "checkpoint" and rank == culprit and step == 3:  # into $TW_CKPT_DIR (a mount that may hang)
            torch.save(model.state_dict(), os.path.join(os.environ.get("TW_CKPT_DIR", "."), "ckpt.pt"))
        if scenario == "child" and rank == culprit and step == 3:
            wait_for_child(stop_at)
        if scenario == "fifo" and rank == culprit and step == 3:
            read_fifo()
        if scenario == "pool" and rank == culprit and step == 3:
            map_shards(stop_at)
        if scenario == "event" and rank == culprit and step == 3:
            save_checkpoint_async()
        if scenario == "socket" and rank == culprit and step == 3:
            recv_from_peer(stop_at)
        if scenario == "gil" and rank == culprit and step == 3:
            hold_gil(stop_at)
        if scenario == "sigkill" and rank == culprit and step == 3:
            os.kill(os.getpid(), 9)  # as a watchdog or a person's `kill -9` does: nothing runs after it
        if scenario == "killcompute" and step == fail_step:
            if rank == culprit:
                os.kill(os.getpid(), 9)  # while the others compute: none of them waits on it yet
            busy(2.0)
        if scenario == "killwait" and rank == culprit and step == fail_step:
            time.sleep(2.0)  # the others reach the all_reduce and wait in it
            os.kill(os.getpid(), 9)
        if scenario == "oom" and rank == culprit and step == 3:
            hog = []  # grows until the kernel's OOM killer (a cgroup's memory limit) stops it
            while len(hog) < 64 and time.time() < stop_at:
                hog.append(bytearray(64 << 20))
                time.sleep(0.02)
            time.sleep(max(0.0, stop_at - time.time()))
        if scenario == "assert" and rank == culprit and step == 3:
            raise RuntimeError("CUDA error: device-side assert triggered")
        if scenario == "raise" and rank == culprit and step == 3:
            raise RuntimeError(f"planted failure at step {step}")
        if scenario == "raiseat" and rank == culprit and step == fail_step and restart < fail_attempts:
            raise ValueError(f"bad batch at step {step}")  # the same failure at every attempt of a restarted job
        if scenario == "gathersize" and step == fail_step:
            gather_sizes(rank, culprit, odd_numel, dist)  # the odd rank's tensor has another size
        if scenario == "linger" and rank == culprit and step == 3:
            start_uploader(stop_at)  # a non-daemon thread: the process outlives its main thread
            raise RuntimeError(f"planted failure at step {step}")
        if scenario == "mismatch" and rank == culprit and step == 3:
            sync_metrics(loss, dist)  # only this rank takes this code path
        if scenario in ("async", "pipeline", "sendrecv", "subgroup") and rank == culprit and step == 3:
            time.sleep(3600)  # the last stage, or one rank of an overlapped sync, stops in its own work
        if scenario == "async":
            sync_async(model, dist)
        elif scenario == "pipeline":
            pass_activations(loss, rank, world, dist)
        elif scenario == "sendrecv":
            pass_blocking(rank, world, dist)
        elif scenario == "subgroup":
            sync_in_pairs(model, rank, pairs, dist)
        elif not ddp:
            sync_gradients(model, dist)
        if (step % 20 == 0 or scenario == "longstep") and rank == 0:
            say(f"step {step} loss {loss.item():.4f}")
    dist.barrier()
    dist.destroy_process_group()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--scenario", choices=SCENARIOS, default="healthy")
    parser.add_argument("--deadline", type=float, default=120.0, help="exit after this many seconds")
    parser.add_argument("--step-s", type=float, default=0.05, help="extra seconds of work per step")
    parser.add_argument("--ddp", action="store_true", help="wrap the model in DistributedDataParallel")
    parser.add_argument("--in-thread", action="store_true",
                        help="train in a thread, the main thread joining it (as Ray Train's TrainingThread)")
    parser.add_argument("--timeout", type=float, default=None, help="the collective timeout, seconds (gloo)")
    parser.add_argument("--stall-after", type=float, default=None, metavar="S",
                        help="straggler: the last rank stops once this many seconds have passed (default: at step 3)")
    parser.add_argument("--culprit", type=int, default=None, help="the rank the fault strikes (default: the last)")
    parser.add_argument("--fail-step", type=int, default=FAIL_STEP,
                        help="the step at which straggler, killcompute, killwait, gathersize and raiseat strike")
    parser.add_argument("--fail-attempts", type=int, default=1 << 30,
                        help="raiseat: fail only in the first N attempts of a restarted job (then run on)")
    parser.add_argument("--odd-numel", type=int, default=5,
                        help="gathersize: the culprit's tensor size (the others' is 4)")
    parser.add_argument("--dump-on-error", action="store_true",
                        help="on a collective error, dump the generic Flight Recorder as NCCL does on a timeout")
    args = parser.parse_args(argv)
    stop_at = time.time() + args.deadline
    # routine, event: no idle thread of ours (gloo's threads alone; the Event's waiter alone in the user's code)
    _arm_deadline(args.deadline, thread=args.scenario not in ("routine", "event"))
    if args.in_thread:
        worker = threading.Thread(target=train, args=(args.scenario, args.step_s, stop_at, args.ddp, args.timeout,
                                                      args.culprit, args.odd_numel, args.fail_step,
                                                      args.fail_attempts),
                                  name="TrainingThread(train_func)")
        worker.start()
        worker.join()
    else:
        try:
            train(args.scenario, args.step_s, stop_at, ddp=args.ddp, timeout_s=args.timeout, culprit=args.culprit,
                  odd_numel=args.odd_numel, fail_step=args.fail_step, fail_attempts=args.fail_attempts,
                  stall_after=args.stall_after)
        except RuntimeError:  # a collective's error or timeout: dump, then die of it as before
            if args.dump_on_error:
                dump_flight_recorder(int(os.environ.get("RANK", "0")))
            raise
    return 0


if __name__ == "__main__":
    sys.exit(main())
