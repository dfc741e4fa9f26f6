"""accelerate (CPU, gloo) DDP loop: after step 3 only rank 0 gathers a metric.

Rank 0 calls ``accelerator.gather_for_metrics`` (an all_gather) under an ``if`` that only it
takes; the other ranks go on to step 4 and wait in DDP's gradient all_reduce inside
``accelerator.backward``. Truth: mismatch. With 3 ranks rank 0 is the odd one out; with 2
ranks there is no majority: the ranks disagree and neither is more to blame.
"""

from _jobkit import log, start

GATHER_AFTER_STEP = 3


def main() -> None:
    start(__doc__)
    import torch
    from accelerate import Accelerator
    from torch.utils.data import DataLoader, TensorDataset

    accelerator = Accelerator(cpu=True)
    torch.manual_seed(0)
    data = TensorDataset(torch.randn(4_000, 16), torch.randn(4_000, 1))
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    model, optimizer, loader = accelerator.prepare(model, optimizer, DataLoader(data, batch_size=4))
    log(f"accelerate starts: {accelerator.distributed_type} backend {accelerator.state.backend} "
        f"world {accelerator.num_processes}")
    for step, (x, y) in enumerate(loader, start=1):
        log(f"step {step} begins")
        loss = torch.nn.functional.mse_loss(model(x), y)
        accelerator.backward(loss)
        optimizer.step()
        optimizer.zero_grad()
        log(f"step {step} ends")
        if step == GATHER_AFTER_STEP and accelerator.is_main_process:  # planted: only rank 0 gathers
            log("planted: gathering the metric on this rank only")
            losses = accelerator.gather_for_metrics(loss.detach().reshape(1))
            log(f"mean loss {losses.mean().item():.4f}")


if __name__ == "__main__":
    main()
