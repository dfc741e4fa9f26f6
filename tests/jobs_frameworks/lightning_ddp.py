"""PyTorch Lightning, DDP on CPU (gloo), started as ``python lightning_ddp.py --devices N --fault F
--odd R``: Lightning's own launcher re-executes this script for ranks 1..N-1 (rank 0 is the process
started). Lightning begins each batch with a broadcast from rank 0 (``_broadcast_sigterm_tensor``).

Faults (rank ``R`` is the odd one):
- ``callback``: its ``on_train_batch_end`` never returns after batch 3; the others wait in
  batch 4's first collective (rank 0's broadcast). Truth: straggler, that rank.
- ``uneven``: it has 3 batches, the others 6 (no distributed sampler); it leaves fit and waits
  in the barrier of ``trainer.save_checkpoint``, while the others wait in batch 4's first
  collective. Truth: mismatch, that rank.
- ``worker``: its one DataLoader worker never returns item ``STUCK_INDEX`` (batch 4); the others
  wait in batch 4's DDP gradient all_reduce inside backward. Truth: straggler, that rank, in the
  DataLoader.
"""

import argparse
import os
import time

from _jobkit import StallingItems, arm_deadline, log

BATCH = 4
STUCK_INDEX = 3 * BATCH  # the first item of batch 4 (1-based)


def rank(devices: int) -> int:
    """Lightning's ranks: LOCAL_RANK (and NODE_RANK) are all its launcher puts in the environment."""
    return int(os.environ.get("NODE_RANK", "0")) * devices + int(os.environ.get("LOCAL_RANK", "0"))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--deadline", type=float, default=60.0)
    parser.add_argument("--devices", type=int, default=2)
    parser.add_argument("--fault", choices=("callback", "uneven", "worker"), required=True)
    parser.add_argument("--odd", type=int, default=1, help="the rank with the fault")
    args = parser.parse_args()
    stop_at = time.time() + args.deadline
    arm_deadline(args.deadline)
    import warnings
    warnings.filterwarnings("ignore")

    import lightning.pytorch as pl
    import torch
    from torch.utils.data import DataLoader

    me, odd = rank(args.devices), args.odd

    class Tiny(pl.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.net = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1))

        def training_step(self, batch, batch_idx):
            log(f"batch {batch_idx + 1} begins", me)
            x, y = batch
            return torch.nn.functional.mse_loss(self.net(x), y)

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.01)

    class Progress(pl.Callback):
        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
            log(f"batch {batch_idx + 1} ends", me)
            if args.fault == "callback" and me == odd and batch_idx + 1 == 3:
                log("planted: sleeping in on_train_batch_end", me)
                time.sleep(max(0.0, stop_at - time.time()))  # planted: a user callback that never returns

        def on_train_end(self, trainer, pl_module):
            log("fit ends", me)

    batches = 3 if args.fault == "uneven" and me == odd else 6
    stall = args.fault == "worker" and me == odd
    loader = DataLoader(StallingItems(batches * BATCH, stall, stop_at, STUCK_INDEX, who=me), batch_size=BATCH,
                        num_workers=1 if stall else 0)
    trainer = pl.Trainer(accelerator="cpu", strategy="ddp", devices=args.devices, max_epochs=1,
                         use_distributed_sampler=False, logger=False, enable_checkpointing=False,
                         enable_progress_bar=False, enable_model_summary=False, num_sanity_val_steps=0,
                         callbacks=[Progress()])
    log("fit starts", me)
    trainer.fit(Tiny(), loader)
    log("saving the final checkpoint", me)
    trainer.save_checkpoint("final.ckpt")  # every rank must call it: it ends in a barrier
    log("checkpoint saved", me)


if __name__ == "__main__":
    main()
