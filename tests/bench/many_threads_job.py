"""A lockstep gloo job whose ranks hold many idle threads, as GPU ranks do (NCCL, CUDA, OpenMP,
pin-memory), or, with ``--backend nccl``, a real NCCL job on one GPU with the threads NCCL and CUDA
start (``--threads 0``): each rank runs a tiny all_reduce step every ``--step-ms`` (a GPU rank mostly waits for
its GPU: the CPU is not the limit) and writes, every second, how many steps it made and the
longest gap between two steps (``bench_look_cost.py`` reads these)."""

from __future__ import annotations

import argparse
import os
import threading
import time

import torch
import torch.distributed as dist


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--deadline", type=float, default=60.0)
    parser.add_argument("--threads", type=int, default=160, help="threads per rank in all")
    parser.add_argument("--gaps", required=True, help="folder for each rank's per-second lines")
    parser.add_argument("--step-ms", type=float, default=1.0, help="one step every this many ms (0: flat out)")
    parser.add_argument("--backend", default="gloo", help="gloo (CPU) or nccl (every rank on GPU 0)")
    args = parser.parse_args()
    device = "cpu"
    if args.backend == "nccl":
        # Several NCCL ranks share one GPU only as different hosts (NCCL refuses two ranks on one device).
        os.environ["NCCL_HOSTID"] = f"look-cost-{os.environ['RANK']}"
        device = "cuda:0"
        torch.cuda.set_device(0)
    dist.init_process_group(args.backend)
    rank = dist.get_rank()
    tensor = torch.zeros(1, device=device)
    dist.all_reduce(tensor)  # NCCL starts its threads at the first collective: count them after it
    # Idle threads, blocked as a GPU rank's helpers mostly are, up to the number asked for in all.
    missing = args.threads - len(os.listdir("/proc/self/task"))
    for _ in range(max(0, missing)):
        threading.Thread(target=threading.Event().wait, daemon=True).start()
    print(f"scenario look-cost rank {rank} threads {len(os.listdir('/proc/self/task'))}", flush=True)
    end = time.time() + args.deadline
    with open(os.path.join(args.gaps, f"rank{rank}.txt"), "a", buffering=1) as out:
        second = last = time.monotonic()
        worst, steps, due = 0.0, 0, second
        while True:
            tensor.fill_(float(time.time() > end))  # the step's all_reduce also agrees on when to stop
            dist.all_reduce(tensor, op=dist.ReduceOp.MAX)
            if tensor.item() > 0:
                break
            due += args.step_ms / 1000
            wait = due - time.monotonic()
            if wait > 0:  # on time: wait for the next step's turn
                time.sleep(wait)
            else:  # late (a pause, a slow round): the next step is due from now, no catching up
                due = time.monotonic()
            now = time.monotonic()
            worst, last, steps = max(worst, now - last), now, steps + 1
            if now - second >= 1.0:  # unix time at the second's end, steps in it, its longest gap (ms)
                out.write(f"{time.time():.3f} {steps} {worst * 1000:.3f}\n")
                second, worst, steps = now, 0.0, 0
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
