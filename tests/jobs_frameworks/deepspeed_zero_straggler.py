"""DeepSpeed ZeRO stage 2 on CPU (``DS_ACCELERATOR=cpu``: gloo, no ops built), started by the
``deepspeed`` launcher: after step 3 the last rank sleeps in a user function (a slow shard read);
the others start step 4 and wait in ZeRO's gradient collective inside ``engine.backward``.
Truth: straggler, the last rank.
"""

import time

from _jobkit import log, rank, start


def read_next_shard(stop_at: float) -> None:
    log("planted: sleeping in read_next_shard")
    time.sleep(max(0.0, stop_at - time.time()))  # planted: a shard read that never returns


def main() -> None:
    args = start(__doc__)
    import deepspeed
    import deepspeed.comm as dist
    import torch

    # On CPU, DeepSpeed JIT-compiles its shared-memory all_reduce op on first use (3 min on 2
    # cores, with a C++ compiler); without it, gloo carries every collective.
    deepspeed.ops.__compatible_ops__["deepspeed_shm_comm"] = False
    deepspeed.init_distributed(dist_backend="gloo")
    world = dist.get_world_size()
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1))
    config = {"train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 1,
              "zero_optimization": {"stage": 2}, "zero_allow_untested_optimizer": True,
              "steps_per_print": 10_000, "wall_clock_breakdown": False}
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)  # a client optimizer: no DeepSpeed op to build
    engine, *_ = deepspeed.initialize(model=model, optimizer=optimizer, config=config)
    log("deepspeed starts")
    for step in range(1, 1000):
        log(f"step {step} begins")
        x, y = torch.randn(4, 16), torch.randn(4, 1)
        loss = torch.nn.functional.mse_loss(engine(x), y)
        engine.backward(loss)
        engine.step()
        log(f"step {step} ends")
        if step == 3 and rank() == world - 1:
            read_next_shard(args.stop_at)


if __name__ == "__main__":
    main()
