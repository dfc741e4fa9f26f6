"""A worker group of plain Ray actors (no Ray Train), as verl and OpenRLHF run their trainers.

Three ``@ray.remote`` actors under the raylet of the driver's local cluster: the driver asks rank 0
for its address and a free port, then each actor sets ``MASTER_ADDR``, ``MASTER_PORT``, ``RANK``,
``WORLD_SIZE`` in its own ``os.environ`` at run time and calls ``init_process_group("gloo")``
(``env://``), so ``/proc/PID/environ`` holds none of them. The actors train on their main thread
(a synchronous actor runs its method there), an all_reduce a step. Healthy until the file
``stall-now`` appears in the working directory; then the last rank stops in its own code
(``evaluate_forever``) while the others wait in all_reduce. Truth: healthy, then straggler, rank 2.

The driver writes its PID to ``driver.pid`` and each actor its ``rank pid host`` to ``ranks.txt``;
rank 1 forks a helper after its init (as a DataLoader worker is forked) and writes its PID to
``helper.pid``.

With ``RAY_ADDRESS`` set it joins that cluster instead (``TW_RAY_WORKERS`` actors, default 3):
rank 0, which serves the store, is placed on the driver's node, the others where Ray puts them,
and the store's address is rank 0's node address.
"""

import os
import time

from _jobkit import arm_deadline, log, start



def evaluate_forever() -> None:
    while True:
        time.sleep(0.5)  # stuck in its own work


def run_steps(workdir: str, rank: int, world: int, stop_at: float) -> None:
    import torch
    import torch.distributed as dist

    tensor = torch.ones(1024)
    step = 0
    while time.time() < stop_at:
        step += 1
        if rank == world - 1 and os.path.exists(os.path.join(workdir, "stall-now")):
            log("straggling", who=rank)
            evaluate_forever()
        dist.all_reduce(tensor)
        tensor.fill_(1.0)
        if step % 10 == 0:
            log(f"step {step}", who=rank)
        time.sleep(0.05)


def fork_helper(workdir: str, stop_at: float) -> None:
    """A child forked after init, as a DataLoader worker is: it holds copies of the rank's sockets.
    Writes its PID to ``helper.pid``; exits at the deadline."""
    pid = os.fork()
    if pid == 0:
        time.sleep(max(0.0, stop_at - time.time()))
        os._exit(0)
    with open(os.path.join(workdir, "helper.pid"), "w") as out:
        out.write(str(pid))


def actor_class():  # noqa: ANN201 (ray is imported in main)
    import ray

    @ray.remote(num_cpus=1)
    class Trainer:
        def address(self) -> tuple[str, int]:
            import socket

            host = ray.util.get_node_ip_address()  # rank 0's node address, as verl's workers take it
            with socket.socket() as sock:
                sock.bind((host, 0))
                return host, sock.getsockname()[1]

        def train(self, rank: int, world: int, master: tuple[str, int], workdir: str, stop_at: float) -> None:
            import torch.distributed as dist

            arm_deadline(stop_at - time.time() + 2)
            os.environ.update({"MASTER_ADDR": master[0], "MASTER_PORT": str(master[1]), "RANK": str(rank),
                               "WORLD_SIZE": str(world), "LOCAL_RANK": str(rank)})
            import socket

            with open(os.path.join(workdir, "ranks.txt"), "a") as out:
                out.write(f"{rank} {os.getpid()} {socket.gethostname()}\n")
            dist.init_process_group("gloo")
            log(f"joined pid {os.getpid()}", who=rank)
            if rank == 1:
                fork_helper(workdir, stop_at)
            run_steps(workdir, rank, world, stop_at)
            dist.destroy_process_group()

    return Trainer


def main() -> None:
    args = start(__doc__)
    import ray

    with open("driver.pid", "w") as out:
        out.write(str(os.getpid()))
    world = int(os.environ.get("TW_RAY_WORKERS", "3"))
    trainer = actor_class()
    if os.environ.get("RAY_ADDRESS"):  # a cluster started with `ray start`: the actors need the job's env
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        passed = {k: v for k, v in os.environ.items() if k.startswith(("GLOO_", "TW_"))}
        ray.init(runtime_env={"env_vars": passed})
        here = NodeAffinitySchedulingStrategy(ray.get_runtime_context().get_node_id(), soft=False)
        trainers = [trainer.options(scheduling_strategy=here).remote()]
        trainers += [trainer.remote() for _ in range(world - 1)]
    else:
        ray.init(num_cpus=world, include_dashboard=False)
        trainers = [trainer.remote() for _ in range(world)]
    master = ray.get(trainers[0].address.remote())
    ray.get([t.train.remote(rank, world, master, os.getcwd(), args.stop_at) for rank, t in enumerate(trainers)])


if __name__ == "__main__":
    main()
