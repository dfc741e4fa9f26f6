"""Real NCCL failures of ranks that take different code paths, for recording on one NVIDIA GPU
(run under torchrun; ``tests/gpu/record_paths.py`` runs both under ``trainwatch run``).

Every rank shares the one GPU with its own NCCL_HOSTID (NCCL refuses two ranks of one host on one
device). Each step is a small model's forward, backward and one all_reduce per gradient, as a
hand-written data-parallel loop does. At step 40 the last rank takes another path:

- ``mismatch``: it alone gathers its loss (``all_gather_into_tensor``, NCCL's ``_allgather_base``)
  while the others go on to the next step's gradient all_reduce;
- ``uneven``: its data ends (40 batches against the others' endless ones): it leaves the loop for
  the final ``barrier`` while the others all_reduce the next step's gradients.

Neither NCCL nor torch notices a mismatch at the call; the ranks hang until the collective timeout
(``TW_TIMEOUT``, default 30 s), when each rank's watchdog dumps the Flight Recorder and aborts.
``TW_BACKEND=gloo`` runs the same on CPU (a dry run without a GPU). Exits after ``DEADLINE`` seconds.

    torchrun --nproc-per-node 4 tests/gpu/nccl_paths.py mismatch|uneven DEADLINE
"""
import datetime
import os
import sys
import threading
import time

rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
os.environ["NCCL_HOSTID"] = f"tw-host-{rank}"
scenario, deadline = sys.argv[1], float(sys.argv[2])
threading.Thread(target=lambda: (time.sleep(deadline), os._exit(124)), daemon=True).start()

import torch  # noqa: E402  (after NCCL_HOSTID is set)
import torch.distributed as dist  # noqa: E402

gloo = os.environ.get("TW_BACKEND") == "gloo"
device = "cpu" if gloo else "cuda"
if not gloo:
    torch.cuda.set_device(0)
dist.init_process_group("gloo" if gloo else "nccl",
                        timeout=datetime.timedelta(seconds=float(os.environ.get("TW_TIMEOUT", "30"))))
torch.manual_seed(0)
model = torch.nn.Linear(256, 256).to(device)
culprit = world - 1
batches = 41 if scenario == "uneven" and rank == culprit else 1 << 30
for step in range(batches):
    loss = model(torch.randn(32, 256, device=device)).pow(2).mean()
    loss.backward()
    for p in model.parameters():
        dist.all_reduce(p.grad)
        p.grad /= world
    if scenario == "mismatch" and rank == culprit and step == 40:
        gathered = torch.empty(world, device=device)
        dist.all_gather_into_tensor(gathered, loss.detach().reshape(1))  # this rank alone
    if rank == 0 and step % 10 == 0:
        print(f"step {step} loss {loss.item():.4f}", flush=True)
    model.zero_grad()
    time.sleep(0.02)
print(f"rank {rank} out of data after {batches} batches", flush=True)
dist.barrier()
dist.destroy_process_group()
