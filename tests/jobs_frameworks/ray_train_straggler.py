"""Ray Train ``TorchTrainer`` (DDP through ``ray.train.torch.prepare_model``, gloo, CPU), 3 workers.
Ray runs each rank as a ``RayTrainWorker`` actor under raylet (the driver's local cluster), sets
``RANK`` in ``os.environ`` at run time only, and trains in a thread named ``TrainingThread(...)``.
Healthy until the file ``stall-now`` appears in the working directory; then the last worker stops
in its own code (``evaluate_forever``) while the others wait in the gradient all_reduce inside
``backward``. Truth: healthy, then straggler, rank 2.

With ``RAY_ADDRESS`` set it joins that cluster instead (``TW_RAY_WORKERS`` workers, default 3), and
the worker that stalls is the last one on the node whose IP is ``TW_STALL_IP`` (Ray numbers the
ranks; the test reads which). The driver writes its PID (as its own PID namespace sees it) to
``driver.pid`` in the working directory.
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
        if stalls(context, rank, world) and os.path.exists("stall-now"):
            log("straggling", who=rank)
            evaluate_forever()
        loss = model(torch.randn(8, 16)).pow(2).mean()
        loss.backward()
        if step % 10 == 0:
            log(f"step {step}", who=rank)
        time.sleep(0.05)


def stalls(context, rank: int, world: int) -> bool:  # noqa: ANN001 (Ray's TrainContext)
    ip = os.environ.get("TW_STALL_IP")
    if not ip:
        return rank == world - 1
    import ray.util
    return ray.util.get_node_ip_address() == ip and context.get_local_rank() == context.get_local_world_size() - 1


def evaluate_forever() -> None:
    while True:
        time.sleep(0.5)  # stuck in its own work


def main() -> None:
    args = start(__doc__)
    import ray
    import ray.train.torch
    from ray.train import ScalingConfig
    from ray.train.torch import TorchTrainer

    with open("driver.pid", "w") as out:
        out.write(str(os.getpid()))
    workers = int(os.environ.get("TW_RAY_WORKERS", "3"))
    if os.environ.get("RAY_ADDRESS"):  # a cluster started with `ray start`: the workers need the job's env
        passed = {k: v for k, v in os.environ.items() if k.startswith(("GLOO_", "TW_"))}
        ray.init(runtime_env={"env_vars": passed})
    else:
        ray.init(num_cpus=workers, include_dashboard=False)
    config = {"seconds": args.stop_at - time.time(), "workdir": os.getcwd()}
    trainer = TorchTrainer(train_loop, train_loop_config=config,
                           scaling_config=ScalingConfig(num_workers=workers, use_gpu=False,
                                                        resources_per_worker={"CPU": 1}),
                           torch_config=ray.train.torch.TorchConfig(backend="gloo"))
    trainer.fit()


if __name__ == "__main__":
    main()
