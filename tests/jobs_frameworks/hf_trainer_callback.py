"""HF Trainer with DDP (gloo, CPU), 3 ranks: a callback on rank 2 never returns after step 2.

Truth: straggler, culprit rank 2, sleeping in ``on_step_end``; the other ranks go on to
step 3 and wait in its first collective. With ``--average-tokens`` (the Trainer's default,
``average_tokens_across_devices=True``) that is the all_gather of the step's token count in
``Trainer._get_num_items_in_batch``, before the forward; without it, DDP's gradient all_reduce
inside ``backward``.
"""

import time

from _jobkit import log, rank, start

STUCK_RANK, STUCK_AFTER_STEP = 2, 2


def main() -> None:
    args = start(__doc__, flags=("--average-tokens",))
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainerCallback, TrainingArguments

    class Tokens(torch.utils.data.Dataset):
        def __len__(self) -> int:
            return 10_000

        def __getitem__(self, index: int) -> dict:
            ids = torch.randint(0, 64, (16,), generator=torch.Generator().manual_seed(index))
            return {"input_ids": ids, "labels": ids}

    class Progress(TrainerCallback):
        def on_step_begin(self, args, state, control, **kwargs):
            log(f"step {state.global_step + 1} begins")

        def on_step_end(self, args, state, control, **kwargs):
            log(f"step {state.global_step} ends")
            if rank() == STUCK_RANK and state.global_step == STUCK_AFTER_STEP:
                log("planted: sleeping in on_step_end")
                time.sleep(3600)  # planted: a user callback that never returns

    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(n_layer=1, n_embd=32, n_head=2, vocab_size=64, n_positions=32,
                                            bos_token_id=0, eos_token_id=0))
    training = TrainingArguments(
        output_dir=".", per_device_train_batch_size=2, max_steps=1_000, use_cpu=True, ddp_backend="gloo",
        report_to=[], save_strategy="no", logging_strategy="no", disable_tqdm=True,
        dataloader_num_workers=0, ddp_timeout=int(args.deadline) + 60,
        average_tokens_across_devices=args.average_tokens,
    )
    log("trainer starts")
    Trainer(model=model, args=training, train_dataset=Tokens(), callbacks=[Progress()]).train()


if __name__ == "__main__":
    main()
