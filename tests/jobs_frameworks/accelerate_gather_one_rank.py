"""accelerate (CPU, gloo) DDP loop: after step 3 only rank 0 gathers a metric.

Rank 0 calls ``accelerator.gather_for_metrics`` (an all_gather) under an ``if`` that only it
takes; the other ranks go on to step 4 and wait in DDP's gradient all_reduce inside
``accelerator.backward``. Truth: mismatch. With 3 ranks rank 0 is the odd one out; with 2
ranks there is no majority: the ranks disagree and neither is more to blame.
"""

from _jobkit import accelerate_setup, log, start

GATHER_AFTER_STEP = 3


def main() -> None:
    start(__doc__)
    import torch

    accelerator, model, optimizer, loader = accelerate_setup()
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
