"""accelerate (CPU, gloo) DDP loop started by ``accelerate launch --multi_gpu`` (no GPU: its
MULTI_CPU mode): after step 3 the last rank sleeps in a user function (a slow checkpoint upload);
the others start step 4 and wait in DDP's gradient all_reduce inside ``accelerator.backward``.
Truth: straggler, the last rank.
"""

import time

from _jobkit import accelerate_setup, log, start


def upload_checkpoint(stop_at: float) -> None:
    log("planted: sleeping in upload_checkpoint")
    time.sleep(max(0.0, stop_at - time.time()))  # planted: an upload that never returns


def main() -> None:
    args = start(__doc__)
    import torch

    accelerator, model, optimizer, loader = accelerate_setup()
    last = accelerator.process_index == accelerator.num_processes - 1
    for step, (x, y) in enumerate(loader, start=1):
        log(f"step {step} begins")
        loss = torch.nn.functional.mse_loss(model(x), y)
        accelerator.backward(loss)
        optimizer.step()
        optimizer.zero_grad()
        log(f"step {step} ends")
        if step == 3 and last:
            upload_checkpoint(args.stop_at)


if __name__ == "__main__":
    main()
