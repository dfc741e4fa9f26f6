"""``torch.multiprocessing.spawn``, 2 ranks (gloo, CPU): rank 1 raises ``RuntimeError("boom")``
once the file ``raise-now`` appears in the working directory (the test creates it when it
watches). The child prints nothing: mp.spawn's parent tears rank 0 down, then prints rank 1's
traceback under "-- Process 1 terminated with the following error:", with no rank prefix.
Rank 0 waits a second before its next collective once ``raise-now`` appears: else its all_reduce
may fail on the closed connection before the parent sees rank 1 exit, and mp.spawn then prints
rank 0's error instead (a race of mp.spawn's join, not of the job this stands for).
Truth: crashed, rank 1, RuntimeError: boom, at the ``raise`` line in ``worker``.
"""

import os
import time

from _jobkit import arm_deadline, free_port_env, log, start


def worker(rank: int, port: str, seconds: float) -> None:
    import torch
    import torch.distributed as dist
    arm_deadline(seconds)  # a spawned child is a fresh interpreter: its own deadline
    os.environ["RANK"] = str(rank)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    total = torch.ones(4)
    for step in range(1, 100_000):
        log(f"step {step}")
        if rank == 1 and os.path.exists("raise-now"):
            raise RuntimeError("boom")  # planted: rank 1 raises
        if rank == 0 and os.path.exists("raise-now"):
            time.sleep(1.0)
        dist.all_reduce(total)
        time.sleep(0.1)


def main() -> None:
    args = start(__doc__)
    import torch.multiprocessing as mp
    mp.spawn(worker, args=(free_port_env(), args.stop_at - time.time()), nprocs=2)


if __name__ == "__main__":
    main()
