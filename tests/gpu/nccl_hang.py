"""A real NCCL hang for tests/gpu/bench_nccl.py (one NVIDIA GPU; run under torchrun).

Every rank shares the one GPU, each with its own NCCL_HOSTID (NCCL refuses two ranks of one host
on one device). After warm-up all_reduces the last rank sleeps in Python and never joins the next
collective; the others block behind it at ``.item()``, spinning in ``cuStreamSynchronize`` as hung
NCCL ranks do. ``TW_BACKEND=gloo`` runs the same on CPU (a dry run without a GPU);
``TW_HEALTHY=1`` plants no straggler: every rank keeps looping (all_reduce, then ``.item()``), the
healthy job to compare with. The job exits by itself after the number of seconds given.
"""
import os
import sys
import threading
import time

rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
os.environ["NCCL_HOSTID"] = f"tw-host-{rank}"
threading.Thread(target=lambda: (time.sleep(float(sys.argv[1])), os._exit(124)), daemon=True).start()

import torch  # noqa: E402  (after NCCL_HOSTID is set)
import torch.distributed as dist  # noqa: E402

gloo = os.environ.get("TW_BACKEND") == "gloo"
if not gloo:
    torch.cuda.set_device(0)
dist.init_process_group("gloo" if gloo else "nccl")
x = torch.ones(1 << 16, device="cpu" if gloo else "cuda")
for step in range(30):
    dist.all_reduce(x)
    x.sum().item()
print(f"rank {rank} warm", flush=True)


def train() -> None:
    """The healthy job's loop: a step counter as training loops keep one."""
    step = 0
    while True:
        step += 1
        dist.all_reduce(x)
        x.sum().item()
        time.sleep(0.01)


if os.environ.get("TW_HEALTHY") == "1":
    train()
if rank == world - 1:
    while True:
        time.sleep(1)  # the straggler: never joins the next collective
dist.all_reduce(x)
x.sum().item()  # blocks here, spinning
