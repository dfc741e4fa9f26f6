"""DDP (gloo, CPU), 2 ranks, ``num_workers=1``: rank 1's DataLoader worker never returns one item.

The worker blocks in ``__getitem__`` at index ``STUCK_INDEX`` (the first item of batch 6);
rank 1's main thread waits for that batch in the DataLoader after step 5, while rank 0 goes
on to step 6 and waits in DDP's gradient all_reduce inside ``backward``.
Truth: straggler, culprit rank 1 (in the DataLoader; the stuck worker's ``__getitem__``).
"""


from _jobkit import StallingItems, log, rank, start

BATCH = 4
STUCK_INDEX = 5 * BATCH


def main() -> None:
    args = start(__doc__)
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel
    from torch.utils.data import DataLoader

    dist.init_process_group("gloo")
    world = dist.get_world_size()
    torch.manual_seed(0)
    loader = DataLoader(StallingItems(10_000, stall=(rank() == world - 1), stop_at=args.stop_at, stuck_index=STUCK_INDEX),
                        batch_size=BATCH, num_workers=1)
    model = DistributedDataParallel(torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(),
                                                        torch.nn.Linear(32, 1)))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    log("ddp starts")
    for step, (x, y) in enumerate(loader, start=1):
        log(f"step {step} begins")
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        log(f"step {step} ends")


if __name__ == "__main__":
    main()
