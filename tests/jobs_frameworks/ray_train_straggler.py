"""Ray Train ``TorchTrainer`` (DDP through ``ray.train.torch.prepare_model``, gloo, CPU), 3 workers.
Ray runs each rank as a ``RayTrainWorker`` actor under raylet (the driver's local cluster), sets
``RANK`` in ``os.environ`` at run time only, and trains in a thread named ``TrainingThread(...)``.
Healthy until the file ``stall-now`` appears in the working directory; then the last worker stops
in its own code (``evaluate_forever``) while the others wait in the gradient all_reduce inside
``backward``. Truth: healthy, then straggler, rank 2.
"""

import os
import time

from _jobkit import arm_deadline, log, start


def train_loop(config: dict) -> None:
    import torch
    import ray.train
    import ray.train.torch

    arm_deadline(config["seconds"])
    os.chdir(config["workdir"])
    context = ray.train.get_context()
    rank, world = context.get_world_rank(), context.get_world_size()
    model = ray.train.torch.prepare_model(torch.nn.Linear(16, 16))
    for step in range(1, 1_000_000):
        if rank == world - 1 and os.path.exists("stall-now"):
            log("straggling", who=rank)
            evaluate_forever()
        loss = model(torch.randn(8, 16)).pow(2).mean()
        loss.backward()
        if step % 10 == 0:
            log(f"step {step}", who=rank)
        time.sleep(0.05)


def evaluate_forever() -> None:
    while True:
        time.sleep(0.5)  # stuck in its own work


def main() -> None:
    args = start(__doc__)
    import ray
    import ray.train.torch
    from ray.train import ScalingConfig
    from ray.train.torch import TorchTrainer

    ray.init(num_cpus=3, include_dashboard=False)
    config = {"seconds": args.stop_at - time.time(), "workdir": os.getcwd()}
    trainer = TorchTrainer(train_loop, train_loop_config=config,
                           scaling_config=ScalingConfig(num_workers=3, use_gpu=False, resources_per_worker={"CPU": 1}),
                           torch_config=ray.train.torch.TorchConfig(backend="gloo"))
    trainer.fit()


if __name__ == "__main__":
    main()
