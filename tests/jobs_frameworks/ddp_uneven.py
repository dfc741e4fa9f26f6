"""Plain DDP (gloo, CPU), 3 ranks with uneven data: rank 2's DataLoader has one batch fewer.

Ranks 0-1 start one more step and wait in DDP's gradient all_reduce inside ``backward``,
while rank 2 has left the loop and waits in the end-of-epoch ``dist.barrier()``.
Truth: rank 2 is the odd one out, at its own line; ranks 0-1 in a collective (DDP gradients).
(An all_reduce of the epoch loss there instead would not hang on gloo: its 4 bytes meet
the gradient bucket's all_reduce and gloo aborts the rank on the size mismatch.)
"""

from _jobkit import log, start

BATCHES = 6  # rank 2 gets BATCHES - 1


def main() -> None:
    start(__doc__)
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel
    from torch.utils.data import DataLoader, TensorDataset

    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(rank)
    batches = BATCHES - 1 if rank == world - 1 else BATCHES  # planted: this rank's shard is shorter
    data = TensorDataset(torch.randn(batches * 4, 16), torch.randn(batches * 4, 1))
    loader = DataLoader(data, batch_size=4)
    model = DistributedDataParallel(torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(),
                                                        torch.nn.Linear(32, 1)))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    log(f"ddp starts with {len(loader)} batches")
    epoch_loss = torch.zeros(1)
    for step, (x, y) in enumerate(loader, start=1):
        log(f"step {step} begins")
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        epoch_loss += loss.detach()
        log(f"step {step} ends")
    log("epoch done: waiting for the others at the barrier")
    dist.barrier()  # rank 2 waits here while the others are still in step 6
    log(f"epoch loss {epoch_loss.item() / len(loader):.4f}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
