"""A lockstep gloo job whose ranks hold many idle threads, as GPU ranks do (NCCL, CUDA, OpenMP,
pin-memory): each rank runs a tiny all_reduce step every ``--step-ms`` (a GPU rank mostly waits for
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
    args = parser.parse_args()
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    # Idle threads, blocked as a GPU rank's helpers mostly are, up to the number asked for in all.
    missing = args.threads - len(os.listdir("/proc/self/task"))
    for _ in range(max(0, missing)):
        threading.Thread(target=threading.Event().wait, daemon=True).start()
    print(f"scenario look-cost rank {rank} threads {len(os.listdir('/proc/self/task'))}", flush=True)
    tensor = torch.zeros(1)
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
