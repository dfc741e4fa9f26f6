"""DDP (gloo, CPU), 2 ranks: rank 1 raises ``RuntimeError("boom")`` at step 3, but a non-daemon
thread it started keeps running, so its process lingers after the traceback (Python joins
non-daemon threads before it exits). Rank 0 goes on to step 4 and waits in DDP's gradient
all_reduce. Truth: crashed, rank 1, RuntimeError: boom, while its process is still alive.
"""

import threading
import time

from _jobkit import log, rank, start

CRASH_AT_STEP = 3


def upload_metrics_forever(stop_at: float) -> None:
    """A metrics uploader the user forgot to make a daemon."""
    while time.time() < stop_at:
        time.sleep(0.5)


def main() -> None:
    args = start(__doc__)
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    dist.init_process_group("gloo")
    world = dist.get_world_size()
    threading.Thread(target=upload_metrics_forever, args=(args.stop_at,), name="metrics-uploader").start()
    torch.manual_seed(rank())
    model = DistributedDataParallel(torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(),
                                                        torch.nn.Linear(32, 1)))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    log("ddp starts")
    for step in range(1, 100_000):
        log(f"step {step} begins")
        loss = torch.nn.functional.mse_loss(model(torch.randn(4, 16)), torch.randn(4, 1))
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        log(f"step {step} ends")
        if rank() == world - 1 and step == CRASH_AT_STEP:
            log("planted: raising RuntimeError('boom')")
            raise RuntimeError("boom")


if __name__ == "__main__":
    main()
